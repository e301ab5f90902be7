"""commcamp's exit codes: one meaning per code, the same for every command. The README's "Exit codes"
table is this one (tests/test_exit_codes.py holds them together); commbench's own codes (bench_src/README.md)
are another program's."""
from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # done; health: the night is healthy
    FAILED = 1  # a step failed: a test case failed or was not stored, a check found problems, a build or tuning failed,
    # another `run` of the campaign is running (campaigns/locks.py)
    USAGE = 2  # bad input (spec, options, site, knob files) or a results database that cannot be opened: nothing ran
    NOT_JUDGED = 3  # no answer from data: a health metric with nothing to compare with; a lookup of no measured result
    DEGRADED = 4  # health: a metric degraded, none failed
    UNHEALTHY = 5  # health: a metric failed
    INTERRUPTED = 130  # SIGINT/SIGTERM: what finished is stored
