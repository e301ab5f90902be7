"""Read and validate commbench JSON Lines output against bench_src/schema/commbench-record.schema.json.

Every line is checked against the schema plus the cross-field rules the schema cannot express
(one sample per timed iteration, one hostname per rank, ordered statistics). The per-iteration
samples are checked with numpy instead of jsonschema: 10^6 samples through jsonschema's per-item
descent take seconds, through numpy milliseconds.
"""
from __future__ import annotations

import copy
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from campaigns.paths import RECORD_SCHEMA as SCHEMA_PATH

if TYPE_CHECKING:  # numpy loads when samples are checked: the reference checks (inside a site's ReFrame, which
    import numpy as np  # brings jsonschema) import campaigns.formats.foreign, hence sample_stats, from here

# The items rule of samples_us that _check_samples implements; _load_validator refuses a schema whose
# rule differs, so the vectorised check cannot silently drift from the contract.
_SAMPLE_ITEM_RULE = {"type": "number", "minimum": 0}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1  # what every SQL backend stores
MAX_MESSAGE_BYTES = 1 << 40  # commbench's largest message size (--sizes: at most 1T)


class RecordError(ValueError):
    """A commbench record (or the file holding it) violates the record contract."""

    def __init__(self, where: str, field: str | None, message: str) -> None:
        self.where = where
        self.field = field
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")


def _load_validator() -> Draft202012Validator:
    try:
        schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"cannot load the commbench record schema {SCHEMA_PATH}: {exc}") from exc
    Draft202012Validator.check_schema(schema)
    fast_schema = copy.deepcopy(schema)
    item_rule = fast_schema["properties"]["samples_us"].pop("items")
    if item_rule != _SAMPLE_ITEM_RULE:
        raise RuntimeError(f"{SCHEMA_PATH}: samples_us items rule changed to {item_rule}; "
                           f"update campaigns.model.records._check_samples to match")
    return Draft202012Validator(fast_schema)


_VALIDATOR = _load_validator()


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def _field_of(error: Any) -> str:
    path = [str(p) for p in error.absolute_path]
    if error.validator == "required":
        missing = [name for name in error.validator_value if name not in error.instance]
        path.extend(missing[:1])
    return ".".join(path) or "(record)"


def _check_samples(samples: list[Any], where: str) -> np.ndarray:
    import numpy as np

    # bool is an int subclass in Python but not a JSON number; numpy would also coerce strings.
    if not set(map(type, samples)) <= {int, float}:
        index = next(i for i, s in enumerate(samples) if type(s) not in (int, float))
        raise RecordError(where, f"samples_us[{index}]", f"{samples[index]!r} is not a number")
    try:
        values = np.asarray(samples, dtype="<f8")
    except OverflowError as exc:
        raise RecordError(where, "samples_us", f"sample out of float64 range: {exc}") from exc
    bad = np.flatnonzero(~(values >= 0) | ~np.isfinite(values))
    if bad.size:
        raise RecordError(where, f"samples_us[{bad[0]}]",
                          f"{samples[bad[0]]!r} is not a finite number >= 0")
    return values


def _check_attribution(record: dict[str, Any], where: str) -> None:
    """Schema 2's per-rank attribution: one entry per timed iteration and one per rank."""
    ranks = record["ranks"]
    for field in ("slowest_rank", "slowest_excess_us"):
        if field in record and "iters" in record and len(record[field]) != record["iters"]:
            raise RecordError(where, field, f"{len(record[field])} entries for {record['iters']} iterations")
    if any(rank >= ranks for rank in record.get("slowest_rank", ())):
        raise RecordError(where, "slowest_rank", f"rank {max(record['slowest_rank'])} of {ranks} ranks")
    for field, values in record.get("per_rank", {}).items():
        if len(values) != ranks:
            raise RecordError(where, f"per_rank.{field}", f"{len(values)} entries for {ranks} ranks")


def sample_stats(samples: list[float]) -> dict[str, float]:
    """A record's `stats` from its samples, as commbench computes them (bench_src/src/stats.c, the one
    definition): median the middle sample (the mean of the two middle ones for an even count), p95 linearly
    interpolated at 0.95 (n - 1) of the sorted samples, stdev the sample standard deviation (n - 1; 0 for one)."""
    ordered = sorted(float(value) for value in samples)
    n = len(ordered)
    if n == 0:
        raise ValueError("no samples")
    mean = sum(ordered) / n
    median = ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])
    position = 0.95 * (n - 1)
    low = int(position)
    high = min(low + 1, n - 1)
    p95 = ordered[low] + (position - low) * (ordered[high] - ordered[low])
    stdev = (sum((value - mean) ** 2 for value in ordered) / (n - 1)) ** 0.5 if n > 1 else 0.0
    return {"min_us": ordered[0], "median_us": median, "mean_us": mean, "p95_us": p95, "max_us": ordered[-1],
            "stdev_us": stdev}


# busbw = algbw x factor: nccl-tests' factors (its src/*.cu GetBw), the ones the record schema's busbw_gbs names
# and commbench's C tables carry (cb_busbw_factor); gather and scatter as nccl-tests' gather/scatter_perf.
_BUSBW_ALLREDUCE = ("allreduce",)
_BUSBW_N_MINUS_1_OVER_N = ("allgather", "reduce_scatter", "alltoall", "alltoallv", "gather", "scatter")


def busbw_factor(op: str, ranks: int) -> float:
    """The bus bandwidth factor of `op` on `ranks` ranks: allreduce 2(n-1)/n; allgather, reduce_scatter,
    alltoall(v), gather, scatter (n-1)/n; every other op 1."""
    if op in _BUSBW_ALLREDUCE:
        return 2 * (ranks - 1) / ranks
    if op in _BUSBW_N_MINUS_1_OVER_N:
        return (ranks - 1) / ranks
    return 1.0


def validate_record(record: Any, where: str) -> dict[str, Any]:
    """Check one parsed record; `where` (e.g. 'out.jsonl:12') prefixes every error message."""
    error = best_match(_VALIDATOR.iter_errors(record))
    if error is not None:
        raise RecordError(where, _field_of(error), error.message)
    try:
        stamp = datetime.fromisoformat(record["timestamp"])
    except ValueError as exc:
        raise RecordError(where, "timestamp", f"{record['timestamp']!r} is not an ISO 8601 date-time") from exc
    if stamp.tzinfo is None:
        raise RecordError(where, "timestamp", f"{record['timestamp']!r} has no UTC offset")
    for name, value in [*record.items(), *(("pair." + k, v) for k, v in record.get("pair", {}).items())]:
        if type(value) is int and not _INT64_MIN <= value <= _INT64_MAX:
            raise RecordError(where, name, f"{value} does not fit a 64-bit integer")
    if len(record["hostnames"]) != record["ranks"]:
        raise RecordError(where, "hostnames",
                          f"{len(record['hostnames'])} hostnames for {record['ranks']} ranks")
    hosts = len(set(record["hostnames"]))
    if record["nodes"] != hosts:  # commbench: a node is a distinct host name (src/comm.c)
        raise RecordError(where, "nodes", f"{record['nodes']} nodes for {hosts} distinct hostnames")
    if record["valid"] and record.get("wrong_elements", 0) > 0:
        raise RecordError(where, "valid", f"true with {record['wrong_elements']} wrong elements")
    sharing = record.get("gpu_sharing")
    if sharing is not None and sharing["max_ranks_per_gpu"] > record["ranks"]:
        raise RecordError(where, "gpu_sharing.max_ranks_per_gpu",
                          f"{sharing['max_ranks_per_gpu']} ranks on one GPU in a run of {record['ranks']} ranks")
    if "samples_us" in record:
        _check_samples(record["samples_us"], where)
        if "iters" in record and len(record["samples_us"]) != record["iters"]:
            raise RecordError(where, "samples_us",
                              f"{len(record['samples_us'])} samples for {record['iters']} iterations")
    if "round_medians" in record:
        rounds = record.get("rounds")
        if rounds != len(record["round_medians"]):
            raise RecordError(where, "round_medians",
                              f"{len(record['round_medians'])} round medians for {rounds} rounds")
        if "iters" in record and record["iters"] % rounds:
            raise RecordError(where, "iters", f"{record['iters']} samples do not split into {rounds} rounds")
    _check_attribution(record, where)
    stats = record.get("stats")
    if stats is not None and not stats["min_us"] <= stats["median_us"] <= stats["max_us"]:
        raise RecordError(where, "stats", "not ordered min_us <= median_us <= max_us")
    if stamp > datetime.now(UTC) + timedelta(days=1):
        raise RecordError(where, "timestamp", f"{record['timestamp']!r} lies in the future")
    _check_derived(record, where)
    return record


def _check_derived(record: dict[str, Any], where: str) -> None:
    """The numbers a result record derives from its samples are those its samples give (sample_stats, busbw_factor;
    commbench's driver.c and campaigns.formats.foreign alike): min, median and max, latency_us the median, goodput
    and algbw bytes / median, busbw that x the op's factor, a bidirectional run's aggregate twice it. Within what
    printing rounds (commbench prints times to the ns or %.9g): a forged number, stored and reported as measured,
    is refused."""
    samples, stats = record.get("samples_us"), record.get("stats")
    if not samples or stats is None:
        return
    derived = sample_stats(samples)
    for name in ("min_us", "median_us", "max_us"):
        if abs(stats[name] - derived[name]) > 1e-3 + 1e-6 * abs(derived[name]):
            raise RecordError(where, f"stats.{name}", f"{stats[name]} where the samples give {derived[name]}")
    median = stats["median_us"]
    if "latency_us" in record and abs(record["latency_us"] - median) > 1e-3 + 1e-6 * median:
        raise RecordError(where, "latency_us", f"{record['latency_us']} is not the median sample {median}")
    if median <= 0 or not record.get("bytes"):
        return
    rounding = 1e-6 + 1e-3 / median  # the median printed to the ns, goodput from the unrounded one
    expected = record["bytes"] / median / 1e3
    for name in ("goodput_gbs", "algbw_gbs"):
        if name in record and abs(record[name] / expected - 1) > rounding:
            raise RecordError(where, name, f"{record[name]} where bytes / median time give {expected:.6g}")
    factor = busbw_factor(record["op"], record["ranks"])
    if "busbw_factor" in record and abs(record["busbw_factor"] - factor) > 1e-6:  # printed as %.9g
        raise RecordError(where, "busbw_factor", f"{record['busbw_factor']} where {record['op']} on "
                                                 f"{record['ranks']} ranks has {factor:.6g}")
    if "busbw_gbs" in record and abs(record["busbw_gbs"] - expected * factor) > rounding * expected * max(factor, 1):
        raise RecordError(where, "busbw_gbs", f"{record['busbw_gbs']} where bytes / median time x the op's factor "
                                              f"give {expected * factor:.6g}")
    if record.get("direction") == "bi" and "aggregate_gbs" in record \
            and abs(record["aggregate_gbs"] / (2 * expected) - 1) > rounding:
        raise RecordError(where, "aggregate_gbs", f"{record['aggregate_gbs']} where both directions give "
                                                  f"{2 * expected:.6g}")


def parse_records(text: str, source: str) -> list[dict[str, Any]]:
    """Parse and validate JSON Lines text; blank lines are skipped; `source` names it in errors."""
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            record = json.loads(line, parse_constant=_reject_constant)
        except ValueError as exc:
            raise RecordError(where, None, f"not a complete JSON object (truncated line?): {exc}") from exc
        records.append(validate_record(record, where))
    return records


def parse_record_lines(text: str, source: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Each line of JSON Lines text that is a valid record, and what is wrong with each other line
    (a failed run's file may end in a truncated line; its complete records still count)."""
    records: list[dict[str, Any]] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                records += parse_records(line, f"{source} line {number}")
            except RecordError as exc:
                problems.append(str(exc))
    return records, problems


def load_records(path: Path) -> list[dict[str, Any]]:
    """Every record of a commbench JSON Lines file, each validated; an empty file gives []."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(str(path), None, f"cannot read: {exc}") from exc
    return parse_records(text, str(path))


def mpi_library_version(text: str, library: str) -> str | None:
    """The version in MPI_Get_library_version's text (a record's `mpi_library`, the `mpi_library` line of
    `commbench --version`) when that text is `library`'s ("openmpi" or "mpich"); None otherwise."""
    if library == "openmpi" and "Open MPI" in text:
        match = re.search(r"v(\d+\.\d+\.\d+)", text)
    elif library == "mpich" and "MPICH" in text:
        match = re.search(r"Version:\s*(\d+\.\d+(?:\.\d+)?)", text)
    else:
        return None
    return match.group(1) if match else None
