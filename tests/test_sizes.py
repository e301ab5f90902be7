"""The one size rule of every command and spec (campaigns/model/sizes.py): powers of 1024, as commbench."""
from __future__ import annotations

import pytest

from campaigns.model.sizes import parse_size


@pytest.mark.parametrize(("text", "size"), [
    ("8", 8), ("8B", 8), (" 8 b ", 8), (4096, 4096), ("64K", 64 << 10), ("64k", 64 << 10), ("64KiB", 64 << 10),
    ("1M", 1 << 20), ("1 MiB", 1 << 20), ("2G", 2 << 30), ("1T", 1 << 40),
])
def test_sizes_are_powers_of_1024(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(("text", "message"), [
    ("1MB", "'1MB' is ambiguous .* write 1M or 1MiB for 1048576 bytes"),
    ("64kb", "'64kb' is ambiguous"),
    ("64 apples", "'64 apples' is not a size"), ("1.5M", "is not a size"), ("-1", "is not a size"),
    ("", "is not a size"), (None, "None is not a size"), (True, "True is not a size"), ([8], r"\[8\] is not a size"),
])
def test_non_sizes_are_refused_by_name(text: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_size(text)
