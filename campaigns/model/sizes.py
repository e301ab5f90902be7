"""Message sizes as users write them, one rule for every command and spec: K, M, G, T are powers of
1024, as commbench's --sizes and nccl-tests' -b/-e read them ('64K', '64KiB' and '64k' are 65536).
'KB', 'MB', ... are refused: half the field reads them as powers of 1000, so either reading would
silently measure or select sizes the user did not mean."""
from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated

from pydantic import BeforeValidator, Field

_SIZE = re.compile(r"\s*(\d+)\s*(?:([KMGT])(i?B?)|B?)\s*", re.IGNORECASE)
_SCALE = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: object) -> int:
    """Bytes of '4096', '8B', '64K', '64KiB', '1M', ...; an int is taken as bytes. ValueError otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = _SIZE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{text!r} is not a size (bytes, optionally with K, M, G or T, powers of 1024: "
                         "4096, 64K, 1MiB)")
    digits, prefix, suffix = match.group(1), match.group(2), match.group(3)
    if prefix is None:
        return int(digits)
    if suffix.upper() == "B":
        raise ValueError(f"{text!r} is ambiguous (powers of 1000 or 1024?): write {digits}{prefix.upper()} or "
                         f"{digits}{prefix.upper()}iB for {int(digits) * _SCALE[prefix.upper()]} bytes")
    return int(digits) * _SCALE[prefix.upper()]


def check_measurable(sizes: Iterable[int]) -> None:
    """ValueError naming the sizes commbench cannot send (it measures 1 B .. 1 TiB)."""
    from campaigns.model.records import MAX_MESSAGE_BYTES  # the record contract's limit (numpy: loaded late)

    outside = [size for size in sizes if not 1 <= size <= MAX_MESSAGE_BYTES]
    if outside:
        raise ValueError(f"sizes {outside} outside 1 B .. 1 TiB (what commbench measures)")


# A size field of a spec or site file: an int, or a string under the rule above.
ByteCount = Annotated[int, BeforeValidator(parse_size), Field(ge=1)]
# The size a reference's metric is taken at (0: commbench's smallest alltoall moves nothing per rank)
ReferenceBytes = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]
