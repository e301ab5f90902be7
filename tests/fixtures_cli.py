"""`commcamp` in process (typer's CliRunner on the real app), for CLI tests that need no subprocess."""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

from typer.testing import CliRunner

from campaigns import paths
from campaigns.cli.app import app


class CliResult(NamedTuple):
    code: int
    stdout: str
    stderr: str


def commcamp(*args: object, env: Mapping[str, str] | None = None, columns: int = 300) -> CliResult:
    workspace = os.environ.get(paths.HOME_ENV)
    try:
        result = CliRunner().invoke(app, [str(arg) for arg in args], env={"COLUMNS": str(columns), **(env or {})})
    finally:  # --workspace sets it for the process (its children inherit it): not for the tests that follow
        if workspace is None:
            os.environ.pop(paths.HOME_ENV, None)
        else:
            os.environ[paths.HOME_ENV] = workspace
    return CliResult(result.exit_code, result.stdout, result.stderr)


def commcamp_output(*args: object, env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """The exit code and everything printed, for checks that do not care which stream said it."""
    code, stdout, stderr = commcamp(*args, env=env)
    return code, stdout + stderr
