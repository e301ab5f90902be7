"""Fixtures of the tuner tests (tests/test_tuner*.py); the test modules import what they use."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tuners.catalog import KnobCatalog
from tuners.evaluation import Evaluation, FailureKind, SizeBucket
from tuners.scope import StudyScope


@pytest.fixture(scope="session")
def catalog() -> KnobCatalog:
    return KnobCatalog.load()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    """A fresh Optuna SQLite database. On tmpfs when there is one: SQLite fsyncs every commit and
    a study commits several times per trial, which on this machine's disk is most of a test's time."""
    shm = Path("/dev/shm")
    directory = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() else tmp_path
    yield f"sqlite:///{directory / 'optuna.db'}"
    if directory != tmp_path:
        shutil.rmtree(directory, ignore_errors=True)


def make_scope(**fields: object) -> StudyScope:
    values: dict[str, object] = dict(
        site="testsite",
        system="gpusys",
        partition="gpu",
        library="nccl",
        library_version="2.28.3",
        op="allreduce",
        transport="ccl",
        nodes=2,
        gpus_per_node=4,
    )
    values.update(fields)
    return StudyScope.model_validate(values)


class ScriptedEvaluator:
    """Delegates to `inner`, except on the listed call numbers (1-based), where it fails as told:
    a FailureKind, or an exception instance to raise."""

    def __init__(self, inner, script: Mapping[int, FailureKind | BaseException]) -> None:
        self.inner = inner
        self.script = dict(script)
        self.calls = 0
        self.envs: list[dict[str, str]] = []

    def __call__(self, env: Mapping[str, str], *, validate: bool = False) -> Evaluation:
        self.calls += 1
        self.envs.append(dict(env))
        action = self.script.get(self.calls)
        if isinstance(action, BaseException):
            raise action
        if isinstance(action, FailureKind):
            return Evaluation.failed(action, f"scripted {action.value} on call {self.calls}")
        return self.inner(env, validate=validate)


TWO_BUCKETS = (SizeBucket("small", 8, 4096), SizeBucket("large", 4097, 1 << 30))
