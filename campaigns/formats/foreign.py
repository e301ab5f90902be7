"""Results of other benchmarks (nccl-tests, OSU) as commbench-schema records.

Each parsed row becomes one 'result' record, so the store, health, report and export treat it like
commbench's own. `source` says which benchmark measured it and from which format; `commbench_version`
is "none". What the other benchmark does not report is not invented:
- a row that holds one time averaged over N iterations (nccl-tests text, nccl-tests JSON without -I,
  OSU) is one sample (`iters` 1) and `source.iterations_averaged` N where the output says N;
- nccl-tests JSON with -I keeps every iteration's time (max over processes) as samples and, per process,
  the per-iteration times in `source.per_process_us`;
- OSU does not print hosts: they are whatever the caller passes (the hosts the job ran on).
"""
from __future__ import annotations

import statistics
from datetime import datetime, timezone
from typing import Any

from campaigns.formats import nccl_tests, osu

FORMATS = ("nccl-tests", "nccl-tests-json", "osu")
NONE_VERSION = "none"


def busbw_factor(op: str, ranks: int) -> float:
    """nccl-tests' bus bandwidth factor (doc/PERFORMANCE.md), the one commbench's records carry:
    allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall (n-1)/n; every other op 1."""
    if op == "allreduce":
        return 2 * (ranks - 1) / ranks
    if op in ("allgather", "reduce_scatter", "alltoall"):
        return (ranks - 1) / ranks
    return 1.0


def _stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, max(0, -(-95 * len(ordered) // 100) - 1))]
    return {"min_us": ordered[0], "median_us": statistics.median(ordered), "mean_us": statistics.fmean(ordered),
            "p95_us": p95, "max_us": ordered[-1], "stdev_us": statistics.pstdev(ordered)}


def _record(*, op: str, transport: str, backend: str, size: int, samples: list[float], time_us: float,
            hostnames: list[str], mpi_library: str, timestamp: datetime, source: dict[str, Any],
            count: int | None = None, dtype: str | None = None, wrong: int | None = None,
            algbw_gbs: float | None = None, busbw_gbs: float | None = None) -> dict[str, Any]:
    ranks = len(hostnames)
    goodput = size / time_us / 1e3 if time_us > 0 else 0.0
    factor = busbw_factor(op, ranks)
    record: dict[str, Any] = {
        "schema_version": 1, "kind": "result", "commbench_version": NONE_VERSION,
        "timestamp": timestamp.astimezone(timezone.utc).isoformat(), "backend": backend, "op": op,
        "transport": transport, "bytes": size, "iters": len(samples), "warmup": 0, "batch": 1,
        "samples_us": samples, "stats": _stats(samples), "latency_us": time_us, "goodput_gbs": goodput,
        "algbw_gbs": goodput if algbw_gbs is None else algbw_gbs,
        "busbw_gbs": goodput * factor if busbw_gbs is None else busbw_gbs, "busbw_factor": factor,
        "valid": not wrong, "check": wrong is not None, "ranks": ranks, "nodes": len(set(hostnames)),
        "hostnames": hostnames, "mpi_library": mpi_library, "env": {}, "source": source}
    if count is not None:
        record["count"] = count
    if dtype is not None:
        record["dtype"] = dtype
    if wrong is not None:
        record["wrong_elements"] = wrong
    return record


def nccl_tests_records(run: nccl_tests.Run, *, fmt: str, timestamp: datetime, mpi_library: str = "",
                       backend: str = "cuda") -> list[dict[str, Any]]:
    """One record per size from the out-of-place results (the in-place ones where a row has only those)."""
    if not run.hosts:
        raise nccl_tests.NcclTestsError("the output names no ranks ('#  Rank N ... on HOST device ...' lines "
                                        "or the JSON 'devices'): cannot tell ranks and nodes")
    if not run.op:
        raise nccl_tests.NcclTestsError("the output does not say which nccl-tests benchmark ran")
    records = []
    for row in run.rows:
        result = row.out_of_place or row.in_place
        assert result is not None  # the parsers keep only rows with a result
        samples = list(result.times_us) or [result.time_us]
        source: dict[str, Any] = {"benchmark": "nccl-tests", "format": fmt, "version": run.version or None,
                                  "placement": "out_of_place" if row.out_of_place else "in_place"}
        if not result.times_us and run.iters:
            source["iterations_averaged"] = run.iters
        if result.per_process_us:
            source["per_process_us"] = [list(times) for times in result.per_process_us]
        records.append(_record(op=run.op, transport="ccl", backend=backend, size=row.size, samples=samples,
                               time_us=result.time_us, hostnames=list(run.hosts), mpi_library=mpi_library,
                               timestamp=timestamp, source=source, count=row.count, dtype=row.dtype,
                               wrong=result.wrong, algbw_gbs=result.algbw_gbs, busbw_gbs=result.busbw_gbs))
    return records


def osu_records(run: osu.Run, *, hostnames: list[str], timestamp: datetime, mpi_library: str = "",
                backend: str | None = None) -> list[dict[str, Any]]:
    """One record per size; bandwidth rows (MB/s = 10^6 B/s) become the time per message at that rate."""
    if not hostnames:
        raise osu.OsuError("OSU output names no hosts: give the hosts the job ran on, one per rank")
    if run.op.startswith("osu_b") or run.op == "pingpong":
        if len(hostnames) != 2:
            raise osu.OsuError(f"{run.title} runs on 2 ranks; {len(hostnames)} hosts given")
    records = []
    for row in run.rows:
        if row.value <= 0:
            raise osu.OsuError(f"size {row.size}: {row.value} is not a positive {run.quantity}")
        time_us = row.value if run.quantity == "latency" else row.size / row.value
        source: dict[str, Any] = {"benchmark": "osu", "format": "osu", "version": run.version, "title": run.title}
        if row.iterations:
            source["iterations_averaged"] = row.iterations
        if row.min_us is not None:
            source["min_us"], source["max_us"] = row.min_us, row.max_us
        records.append(_record(op=run.op, transport="ccl" if run.ccl else "mpi",
                               backend=backend or ("cuda" if run.ccl else "cpu"), size=row.size, samples=[time_us],
                               time_us=time_us, hostnames=list(hostnames), mpi_library=mpi_library,
                               timestamp=timestamp, source=source))
    return records


def parse(fmt: str, text: str, *, source: str, timestamp: datetime, hostnames: list[str] | None = None,
          mpi_library: str = "") -> list[dict[str, Any]]:
    """The records of one file of format `fmt` (one of FORMATS)."""
    if fmt == "nccl-tests":
        return nccl_tests_records(nccl_tests.parse_text(text, source), fmt=fmt, timestamp=timestamp,
                                  mpi_library=mpi_library)
    if fmt == "nccl-tests-json":
        return nccl_tests_records(nccl_tests.parse_json(text, source), fmt=fmt, timestamp=timestamp,
                                  mpi_library=mpi_library)
    if fmt == "osu":
        return osu_records(osu.parse_text(text, source), hostnames=hostnames or [], timestamp=timestamp,
                           mpi_library=mpi_library)
    raise ValueError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
