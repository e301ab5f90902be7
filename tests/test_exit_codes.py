"""commcamp's exit codes exist once (campaigns/exit_codes.py) and the README's table is that one."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from campaigns.exit_codes import ExitCode

REPO = Path(__file__).resolve().parents[1]


def test_readme_table_is_the_enum() -> None:
    text = (REPO / "README.md").read_text()
    section = text.split("## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    rows = {int(code): name for code, name in re.findall(r"^\| (\d+) \| (\w+) \|", section, re.MULTILINE)}
    assert rows == {code.value: code.name for code in ExitCode}


def test_commands_exit_with_named_codes() -> None:
    """No command exits with a bare number or keeps its own table of codes: every exit names an ExitCode."""
    bare = []
    for path in sorted((REPO / "campaigns").rglob("*.py")):
        if "_data" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("typer.Exit", "sys.exit", "SystemExit") \
                    and node.args and isinstance(node.args[0], ast.Constant):
                bare.append(f"{path.relative_to(REPO)}:{node.lineno}")
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id.startswith("EXIT_")
                                                    and isinstance(node.value, ast.Constant) for t in node.targets):
                bare.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert bare == []
