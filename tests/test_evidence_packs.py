"""Evidence packs (campaigns/formats/packs.py): the committed bundles under results/ keep every file their
SHA256SUMS lists, either as it is or inside one of the bundle's packs with the same bytes; repack refuses
what it cannot pack without loss and leaves the files alone then."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from campaigns.formats.packs import PackError, listed_checksums, pack_files, read_pack, repack, unpack

REPO = Path(__file__).resolve().parents[1]
BUNDLES = sorted(p.parent for p in (REPO / "results").rglob("SHA256SUMS"))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("bundle", BUNDLES, ids=[str(b.relative_to(REPO / "results")) for b in BUNDLES])
def test_every_listed_file_is_there_or_packed_byte_for_byte(bundle: Path) -> None:
    checksums = listed_checksums(bundle)
    packed: dict[str, bytes] = {}
    for path in (bundle / name for name in checksums if name.endswith(".jsonl")):
        try:
            files = pack_files(path) if path.exists() else {}
        except PackError:
            continue  # JSON Lines records, not a pack
        packed.update({(path.parent / n).relative_to(bundle).as_posix(): t.encode() for n, t in files.items()})
    for name, digest in checksums.items():
        data = (bundle / name).read_bytes() if (bundle / name).exists() else packed.get(name)
        assert data is not None, f"{bundle.name}/{name}: neither there nor in a pack"
        assert sha256(data) == digest, f"{bundle.name}/{name}"


def test_repack_round_trip_and_refusals(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    (bundle / "runs" / "run-1").mkdir(parents=True)
    (bundle / "runs" / "run-2").mkdir()
    files = {"runs/run-1/output.txt": "NCCL INFO TUNING\r\n\u2028x\n", "runs/run-1/command.txt": "a b\n",
             "runs/run-2/output.txt": ""}
    for name, text in files.items():
        (bundle / name).write_bytes(text.encode())
    (bundle / "SHA256SUMS").write_text("".join(f"{sha256(t.encode())}  {n}\n" for n, t in files.items()))
    (bundle / "bad.bin").write_bytes(b"\xff\xfe")
    with pytest.raises(PackError, match="bad.bin: not UTF-8 text"):
        repack(bundle, "bad.bin", "bad.jsonl")
    (bundle / "runs" / "run-2" / "output.txt").write_text("changed\n")
    with pytest.raises(PackError, match="run-2/output.txt: its sha256 is not the one"):
        repack(bundle, "runs/*/*", "runs.jsonl")
    assert not (bundle / "runs.jsonl").exists() and (bundle / "runs" / "run-1" / "output.txt").exists()
    (bundle / "runs" / "run-2" / "output.txt").write_text("")

    pack = repack(bundle, "runs/*/*", "runs.jsonl")
    assert not (bundle / "runs").exists()
    assert [e.id for e in read_pack(pack)] == ["runs/run-1", "runs/run-2"]
    assert read_pack(pack)[0].text("/output.txt") == files["runs/run-1/output.txt"]
    assert f"{sha256(pack.read_bytes())}  runs.jsonl\n" in (bundle / "SHA256SUMS").read_text()
    unpack(pack, tmp_path / "back")
    assert {n: (tmp_path / "back" / n).read_bytes() for n in files} == {n: t.encode() for n, t in files.items()}
