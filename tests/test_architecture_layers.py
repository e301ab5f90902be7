"""campaigns/ imports point one way (ARCHITECTURE.md, "Inside campaigns/"): a lower package never imports a
higher one. The table lists, per package, the packages it must not import."""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

CAMPAIGNS = Path(__file__).resolve().parents[1] / "campaigns"
TUNERS = CAMPAIGNS.parent / "tuners"
# tuners/ is a library below campaigns.tuning: what it may take from commcamp.
TUNERS_MAY_IMPORT = {"campaigns.paths", "campaigns.model.yamlio"}
ABOVE_MODEL = {"store", "slurm", "reframe", "kinds", "tuning", "report", "tools", "cli"}
FORBIDDEN = {
    "model": ABOVE_MODEL,
    "formats": ABOVE_MODEL,
    "store": ABOVE_MODEL - {"store"},
    "slurm": {"reframe", "kinds", "tuning", "report", "tools", "cli"},
    "reframe": {"kinds", "tuning", "report", "tools", "cli"},
    "kinds": {"tuning", "tools", "cli"},
    "tuning": {"kinds", "report", "tools", "cli"},
    "report": {"kinds", "tuning", "tools", "cli"},
    "tools": {"cli"},
}


def imports(root: Path) -> Iterator[tuple[Path, int, str]]:
    """(file, line, module) for every import under `root`."""
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                yield path, node.lineno, name


def upward_imports(root: Path) -> list[str]:
    found = []
    for path, line, name in imports(root):
        package = path.relative_to(root).parts[0]
        parts = name.split(".")
        if parts[0] == "campaigns" and len(parts) > 1 and parts[1] in FORBIDDEN.get(package, set()):
            found.append(f"{path.relative_to(root.parent)}:{line}: {package} imports {name}")
    return found


def test_tuners_takes_from_commcamp_only_the_paths_and_the_yaml_reader() -> None:
    # bench_*.py are the benchmark scripts beside the library (python -m tuners.bench_...), not part of it.
    taken = {f"{path.name}:{line}: {name}" for path, line, name in imports(TUNERS)
             if name.split(".")[0] == "campaigns" and name not in TUNERS_MAY_IMPORT
             and not path.name.startswith("bench_")}
    assert taken == set()


def test_no_package_imports_a_higher_one() -> None:
    assert upward_imports(CAMPAIGNS) == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    (tmp_path / "campaigns" / "slurm").mkdir(parents=True)
    (tmp_path / "campaigns" / "slurm" / "x.py").write_text("from campaigns.tuning.spec import TuningSpec\n")
    assert upward_imports(tmp_path / "campaigns") == ["campaigns/slurm/x.py:1: slurm imports campaigns.tuning.spec"]
