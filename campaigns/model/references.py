"""A run's metric values and the reference each is judged against: shared by the nightly health verdict
(campaigns/kinds/health.py) and the HTML report (campaigns/report/html.py), so both read one number the
same way. The definitions themselves are in campaigns/model/vocabulary.py."""
from __future__ import annotations

from typing import Protocol

import pandas

from campaigns.model.site import Reference
from campaigns.model.vocabulary import MATRIX_OPS, METRICS, metric_value, reference_matches


def run_metrics(records: pandas.DataFrame) -> dict[tuple[str, int], float]:
    """(metric, bytes) -> value from the valid result records of one run."""
    results = records[(records["kind"] == "result") & records["valid"]]
    if results.empty or results["op"].iloc[0] in MATRIX_OPS:  # several records per size: no single value
        return {}
    rows = results.to_dict("records")
    return {(name, size): value for name in METRICS
            if (taken := metric_value(name, rows)) is not None for value, size in [taken]}


class ReferenceKey(Protocol):
    """What a reference is matched on (a TestCase has all of it)."""

    op: str
    num_nodes: int
    num_tasks: int
    environ: str
    transport: str


def find_reference(references: list[Reference], case: ReferenceKey, metric: str, size: int) -> Reference | None:
    """The first reference for this op, metric and size whose optional fields (nodes, environ, transport,
    ranks) are unset or match, as the check applies them."""
    wanted = {"op": case.op, "bytes": size, "nodes": case.num_nodes, "ranks": case.num_tasks,
              "environ": case.environ, "transport": case.transport}
    return next((ref for ref in references if reference_matches(ref.model_dump(), metric, wanted)), None)
