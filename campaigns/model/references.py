"""A run's metric values, which runs have them, and the reference each is judged against: shared by the nightly
health verdict (campaigns/kinds/health.py) and the HTML report (campaigns/report/html.py), so both read one number
the same way. The definitions themselves are in campaigns/model/vocabulary.py."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from campaigns.model.site import BenchReference, Reference
from campaigns.model.vocabulary import (MATRIX_OPS, REFERENCE_CHECKS, SWEEP_METRICS, metric_value,
                                        reference_matches)

if TYPE_CHECKING:  # a type only: pandas costs ~0.35 s to import, and `run` imports this module
    import pandas


PERFORMANCE_FAILURE = "performance:"  # campaigns.reframe.runner: "<ReFrame fail phase>: <reason>"


class RunOutcome(Protocol):
    """What `measured` reads of a stored run (a store RunRow, a row of the report's runs frame)."""

    status: str
    reason: str | None


def measured(run: RunOutcome) -> bool:
    """A run whose records are judged (health) and plotted night by night (the report's trend): passed, or failed
    only ReFrame's performance check (its records are valid; a night that missed its reference is exactly the
    one to show)."""
    reason = run.reason if isinstance(run.reason, str) else ""  # NaN in a pandas row
    return run.status == "pass" or reason.startswith(PERFORMANCE_FAILURE)


def run_metrics(records: pandas.DataFrame, metrics: Iterable[str] = SWEEP_METRICS) -> dict[tuple[str, int], float]:
    """(metric, bytes) -> value from the valid result records of one run, for the metrics its check reports
    (vocabulary.reported_metrics; default: commbench's sweep metrics)."""
    results = records[(records["kind"] == "result") & records["valid"]]
    if results.empty or results["op"].iloc[0] in MATRIX_OPS:  # several records per size: no single value
        return {}
    rows = results.to_dict("records")
    return {(name, size): value for name in metrics
            if (taken := metric_value(name, rows)) is not None for value, size in [taken]}


class ReferenceKey(Protocol):
    """What a reference is matched on (a TestCase has all of it)."""

    check: str
    op: str  # a reference check's: its benchmark
    num_nodes: int
    num_tasks: int
    environ: str
    transport: str


def find_reference(references: Sequence[Reference | BenchReference], case: ReferenceKey, metric: str,
                   size: int) -> Reference | BenchReference | None:
    """The first reference for this op (a reference check's benchmark), metric and size whose optional
    fields (nodes, environ, transport, ranks) are unset or match, as the check applies them. A commbench
    case takes commbench references only, a reference check's case those of the benchmarks only: a
    benchmark reference sets no op, so it would match any op."""
    if case.check in REFERENCE_CHECKS:
        kind: type[Reference | BenchReference] = BenchReference
        what: dict[str, object] = {"benchmark": case.op}
    else:
        kind, what = Reference, {"op": case.op, "transport": case.transport}
    wanted = {**what, "bytes": size, "nodes": case.num_nodes, "ranks": case.num_tasks, "environ": case.environ}
    return next((ref for ref in references
                 if isinstance(ref, kind) and reference_matches(ref.model_dump(), metric, wanted)), None)
