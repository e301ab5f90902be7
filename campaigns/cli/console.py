"""The rich consoles commcamp prints with. On a terminal rich fits its width; elsewhere (a pipe, a file,
cron's mail, a Slurm job's output) rich would assume 80 columns and cut tables and run keys there, so
such output is as wide as its content (up to OFF_TERMINAL_WIDTH), unless $COLUMNS says otherwise."""
from __future__ import annotations

import os

from rich.console import Console

OFF_TERMINAL_WIDTH = 4096


def make_console(*, stderr: bool = False) -> Console:
    console = Console(stderr=stderr)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        return Console(stderr=stderr, width=OFF_TERMINAL_WIDTH)
    return console
