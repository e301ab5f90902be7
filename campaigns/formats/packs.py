"""Evidence packs: the many small text files of a committed run tree (a tuner's `runs/run-*/` folders, a
plugin check's per-round outputs and NCCL debug logs, ReFrame's output folders) as one JSON Lines file,
one line per group: `{"id": GROUP, "files": {PATH: TEXT}}`, PATH relative to the pack's own folder and
TEXT the file's bytes decoded as UTF-8, so unpacking gives the original files back byte for byte and the
bundle's SHA256SUMS (the checksums of the files as they came back from the machine) still check them.

`repack()` makes a pack and removes the files it holds, after checking that the pack reads back to the
same bytes and that every file listed in the folder's SHA256SUMS has the checksum listed there; it adds
the pack's own checksum to that SHA256SUMS (`sha256sum -c --ignore-missing SHA256SUMS` checks what is
there; `python -m campaigns.formats.packs unpack PACK DIR` gives back what is not).
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path


class PackError(ValueError):
    """A pack that cannot be read, or files that cannot be packed without loss."""


@dataclass(frozen=True)
class PackEntry:
    id: str
    files: dict[str, str]

    def text(self, suffix: str) -> str:
        """The text of the one file of this group whose path ends with `suffix`."""
        found = [text for path, text in self.files.items() if path.endswith(suffix)]
        if len(found) != 1:
            raise PackError(f"group {self.id}: {len(found)} files end with {suffix!r}, expected 1")
        return found[0]


def read_pack(path: Path) -> list[PackEntry]:
    entries = []
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if not line:
            continue
        try:
            document = json.loads(line)
            entries.append(PackEntry(str(document["id"]), dict(document["files"])))
        except (ValueError, KeyError, TypeError) as error:
            raise PackError(f"{path}:{number}: not a pack line ({error})") from None
    return entries


def pack_files(path: Path) -> dict[str, str]:
    """Every file of a pack, PATH (relative to the pack's folder) -> TEXT."""
    return {name: text for entry in read_pack(path) for name, text in entry.files.items()}


def unpack(path: Path, destination: Path) -> list[Path]:
    """Write the pack's files under `destination` as they were under the pack's folder."""
    written = []
    for name, text in pack_files(path).items():
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(text.encode("utf-8"))
        written.append(target)
    return written


def listed_checksums(folder: Path) -> dict[str, str]:
    """PATH -> sha256 from `folder/SHA256SUMS` (`sha256sum` output), empty when there is none."""
    sums = folder / "SHA256SUMS"
    if not sums.exists():
        return {}
    return {name.lstrip("*"): digest for digest, name in
            (line.split(maxsplit=1) for line in sums.read_text().splitlines() if line.strip())}


def repack(bundle: str | Path, pattern: str, pack_name: str, group: str | None = None) -> Path:
    """Pack the files of the folder `bundle` matching the glob `pattern` into `bundle/pack_name` and
    remove them; paths in the pack are relative to the pack's folder, which must hold every file packed.
    A group is a file's parent folder, or with `group` (a regular expression) the part of its path in
    the pack that the expression matches first."""
    from tuners.writers import write_atomic  # the writer only: reading stays standard-library

    bundle = Path(bundle)
    target = bundle / pack_name
    paths = sorted(p for p in bundle.glob(pattern) if p.is_file())
    if not paths:
        raise PackError(f"{bundle}: no file matches {pattern!r}")
    checksums = listed_checksums(bundle)
    groups: dict[str, dict[str, str]] = {}
    originals: dict[str, bytes] = {}
    for path in paths:
        if not path.is_relative_to(target.parent):
            raise PackError(f"{path}: not under {target.parent}, the folder of the pack")
        name = path.relative_to(target.parent).as_posix()
        data = originals[name] = path.read_bytes()
        listed = checksums.get(path.relative_to(bundle).as_posix())
        if listed is not None and hashlib.sha256(data).hexdigest() != listed:
            raise PackError(f"{path}: its sha256 is not the one {bundle}/SHA256SUMS lists")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise PackError(f"{path}: not UTF-8 text ({error}); packs hold text only") from None
        match = re.search(group, name) if group else None
        if group and match is None:
            raise PackError(f"{path}: {group!r} does not match {name!r}")
        key = match.group(0) if match else Path(name).parent.as_posix()
        groups.setdefault(key, {})[name] = text
    write_atomic(target, "".join(json.dumps({"id": key, "files": files}, ensure_ascii=False) + "\n"
                                 for key, files in groups.items()))
    if {name: text.encode("utf-8") for name, text in pack_files(target).items()} != originals:
        target.unlink()
        raise PackError(f"{target}: does not read back to the files it packs; nothing removed")
    if checksums:  # the originals' lines stay: unpacked, the files check against them again
        digest = hashlib.sha256(target.read_bytes()).hexdigest()
        sums = (bundle / "SHA256SUMS").read_text()
        write_atomic(bundle / "SHA256SUMS", f"{sums}{digest}  {target.relative_to(bundle).as_posix()}\n")
    for path in paths:
        path.unlink()
    for parent in sorted({p.parent for p in paths}, key=lambda p: len(p.parts), reverse=True):
        while parent != target.parent and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    return target


def main(argv: list[str]) -> int:
    """`python -m campaigns.formats.packs unpack PACK DESTINATION`: the original files back."""
    if len(argv) != 3 or argv[0] != "unpack":
        print("usage: python -m campaigns.formats.packs unpack PACK DESTINATION", file=sys.stderr)
        return 2
    try:
        print(f"{len(unpack(Path(argv[1]), Path(argv[2])))} files written under {argv[2]}")
    except (OSError, PackError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
