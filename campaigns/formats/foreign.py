"""Results of other benchmarks (nccl-tests, OSU) as commbench-schema records.

Each parsed row becomes one 'result' record, so the store, health, report and export treat it like
commbench's own. `source` says which benchmark measured it and from which format; `commbench_version`
is "none". Every derived number is the record schema's, computed as for commbench's records
(campaigns.model.records: sample_stats, busbw_factor): latency_us the median sample, goodput and algbw
bytes / that median, busbw algbw x the op's factor; what the other benchmark printed itself is kept under
`source.reported`. What the other benchmark does not report is not invented:
- nccl-tests without per-iteration data (its text table, its JSON without -I) prints one time: iters x agg iters
  operations launched back to back, one completion wait, the elapsed time divided by their number (and averaged
  over ranks). That is the schema's throughput method: one sample (`iters` 1) of `batch` = iters x agg iters
  operations (`source.iterations_averaged` the same number);
- nccl-tests JSON with -I keeps every iteration's time (max over processes) as samples (`iters` of them, `batch`
  agg iters) and, per process, the per-iteration times in `source.per_process_us`;
- OSU times every operation to its completion and prints the mean over N iterations (and over ranks): one
  sample, `batch` 1, `source.iterations_averaged` N where the output says N; its message size is per peer for
  alltoall and per rank's contribution for allgather, the schema's bytes the whole receive buffer of a rank
  (size x ranks; OSU's own size in `source.osu_size`);
- data validation: nccl-tests' #wrong of both placements (a record is valid only when neither is > 0;
  `wrong_elements` their sum), OSU's Pass/Fail column (-c);
- OSU's bandwidth tests print MB/s of a window of messages: osu_bw one direction, osu_bibw both directions together.
  A record's time is that of one message each way at that rate (osu_bibw: 2 x size / bandwidth), so its goodput is
  per direction and aggregate_gbs the two directions together, `direction` bi, as commbench's pingpong_bi (the
  record schema's bidirectional op); osu_bw and the latency test (pingpong) are `direction` uni, as commbench's
  pingpong;
- OSU does not print hosts: they are whatever the caller passes (the hosts the job ran on).
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from campaigns.formats import nccl_tests, osu
from campaigns.model.records import busbw_factor, sample_stats

FORMATS = ("nccl-tests", "nccl-tests-json", "osu")
# A record's env: the variables that configure the libraries, less those a launcher sets for one process or job,
# as commbench records them (bench_src/src/record.c's env_prefixes and env_launcher_prefixes: tests/test_formats.py
# holds the two equal); the report tells runs under other knob settings apart by them.
ENV_PREFIXES = ("NCCL_", "RCCL_", "MPICH_", "MPIR_CVAR_", "UCX_", "FI_", "HSA_", "OMPI_", "CUDA_", "HIP_")
ENV_LAUNCHER_PREFIXES = ("OMPI_COMM_WORLD_", "OMPI_MCA_orte_", "OMPI_MCA_ess", "OMPI_MCA_pmix", "OMPI_MCA_initial_wdir",
                         "OMPI_MCA_shmem_RUNTIME_QUERY_hint", "OMPI_FILE_LOCATION", "OMPI_UNIVERSE_SIZE",
                         "OMPI_FIRST_RANKS", "OMPI_NUM_APP_CTX", "OMPI_APP_CTX_", "OMPI_COMMAND", "OMPI_ARGV",
                         "MPIR_CVAR_CH3_INTERFACE_HOSTNAME")
# Where OSU's buffers are (its title's "-CUDA", "-ROCM"; a collective library's own device) -> the record's backend
OSU_BACKENDS = {"cuda": "cuda", "cuda managed": "cuda", "managed": "cuda", "openacc": "cuda", "rocm": "hip",
                "nccl": "cuda", "rccl": "hip"}
# The record schema's `direction` of OSU's point-to-point tests (the others, collectives, have none).
P2P_DIRECTION = {"pingpong": "uni", "osu_bw": "uni", "osu_bibw": "bi"}
NONE_VERSION = "none"
__all__ = ["FORMATS", "NONE_VERSION", "busbw_factor", "check_filter_names", "filter_names", "nccl_tests_records",
           "osu_records", "parse"]


def filter_names() -> dict[str, tuple[str, ...]]:
    """The names a stored record can have, per measurement filter (`--op`, `--transport`, `--backend`):
    commbench's vocabulary (bench_src/schema/vocabulary.json) and the ops of the nccl-tests and OSU records
    this module makes."""
    from campaigns.model import vocabulary

    # nccl-tests' benchmarks no longer read (UNREAD) stay selectable: records an older commcamp stored have them
    ops = (set(vocabulary.OPS) | set(nccl_tests.OPS.values()) | set(nccl_tests.UNREAD)
           | {op for op, _ in osu.BENCHMARKS.values()})
    backends = {backend for names in vocabulary.TRANSPORT_BACKENDS.values() for backend in names}
    return {"op": tuple(sorted(ops)), "transport": tuple(sorted(vocabulary.TRANSPORTS)),
            "backend": tuple(sorted(backends))}


def check_filter_names(**filters: object) -> None:
    """ValueError naming the first value of an `op`, `transport` or `backend` filter (a name or a list of them)
    that no record can have: a misspelt name (all_reduce, MPI) selected nothing and read as 'nothing stored'."""
    known = filter_names()
    for name, allowed in known.items():
        value = filters.get(name)
        for given in [value] if isinstance(value, str) else list(value or []):  # type: ignore[call-overload]
            if given not in allowed:
                article = "an" if name == "op" else "a"
                raise ValueError(f"--{name}: {given!r} is not {article} {name} of commbench's vocabulary or of the "
                                 f"nccl-tests and OSU records (one of: {', '.join(allowed)})")


def _record(*, op: str, transport: str, backend: str, size: int, samples: list[float], batch: int,
            hostnames: list[str], mpi_library: str, timestamp: datetime, source: dict[str, Any],
            count: int | None = None, dtype: str | None = None, checked: bool = False, valid: bool = True,
            wrong: int | None = None, direction: str | None = None, env: dict[str, str] | None = None,
            versions: dict[str, str] | None = None) -> dict[str, Any]:
    ranks = len(hostnames)
    stats = sample_stats(samples)
    median = stats["median_us"]
    algbw = size / median / 1e3 if median > 0 else 0.0  # bytes / us = MB/s; / 1e3: GB/s
    factor = busbw_factor(op, ranks)
    record: dict[str, Any] = {
        "schema_version": 1, "kind": "result", "commbench_version": NONE_VERSION,
        "timestamp": timestamp.astimezone(timezone.utc).isoformat(), "backend": backend, "op": op,
        "transport": transport, "bytes": size, "iters": len(samples), "warmup": 0, "batch": batch,
        "samples_us": samples, "stats": stats, "latency_us": median, "goodput_gbs": algbw, "algbw_gbs": algbw,
        "busbw_gbs": algbw * factor, "busbw_factor": factor, "valid": valid, "check": checked, "ranks": ranks,
        "nodes": len(set(hostnames)), "hostnames": hostnames, "mpi_library": mpi_library,
        "env": {k: v for k, v in sorted((env or {}).items())
                if k.startswith(ENV_PREFIXES) and not k.startswith(ENV_LAUNCHER_PREFIXES)}, "source": source}
    if versions:
        record["versions"] = versions
    if direction is not None:
        record["direction"] = direction
        if direction == "bi":  # goodput is per direction; both together (the schema's aggregate_gbs): twice it
            record["aggregate_gbs"] = 2 * algbw
    if not valid:
        record["reason"] = "validation"  # as commbench's records of wrong data
    if count is not None:
        record["count"] = count
    if dtype is not None:
        record["dtype"] = dtype
    if wrong is not None:
        record["wrong_elements"] = wrong
    return record


def _reported(placement: nccl_tests.Placement) -> dict[str, float]:
    return {"time_us": placement.time_us, "algbw_gbs": placement.algbw_gbs, "busbw_gbs": placement.busbw_gbs}


def nccl_tests_records(run: nccl_tests.Run, *, fmt: str, timestamp: datetime, mpi_library: str = "",
                       env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One record per size from the out-of-place results (the in-place ones where a row has only those);
    valid only when neither placement found wrong elements. An output cut off before nccl-tests' closing lines
    is refused (its last sizes and its out-of-bounds check are missing), as a truncated commbench file is.
    rccl-tests' records are of the hip backend; the library's version is the record's `versions`; `env` (the
    job's, where the caller knows it) or the JSON's own environment the record's env."""
    if not run.complete:
        raise nccl_tests.NcclTestsError("the output ends before nccl-tests' closing lines ('# Out of bounds values "
                                        ": N OK', '# Avg bus bandwidth : X'): the run was cut off (killed, out of "
                                        "time); nothing of it is stored")
    if not run.hosts:
        raise nccl_tests.NcclTestsError("the output names no ranks ('#  Rank N ... on HOST device ...' lines "
                                        "or the JSON 'devices'): cannot tell ranks and nodes")
    if not run.op:
        raise nccl_tests.NcclTestsError("the output does not say which nccl-tests benchmark ran")
    version = nccl_tests.library_version(run.nccl_version)
    records = []
    for row in run.rows:
        result = row.out_of_place or row.in_place
        assert result is not None  # the parsers keep only rows with a result
        placements = {"out_of_place": row.out_of_place, "in_place": row.in_place}
        wrongs = {name: p.wrong for name, p in placements.items() if p is not None and p.wrong is not None}
        source: dict[str, Any] = {"benchmark": "nccl-tests", "format": fmt, "version": run.version or None,
                                  "placement": "out_of_place" if row.out_of_place else "in_place",
                                  "reported": _reported(result)}
        if result.times_us:
            samples, batch = list(result.times_us), run.agg_iters
        else:
            if not run.iters:
                raise nccl_tests.NcclTestsError(f"size {row.size}: the output does not say over how many "
                                                "iterations its time is averaged (the '# nThread ... iters: N' "
                                                "line or the JSON config.iterations)")
            # -G N: the iterations, captured in a CUDA graph, ran N times; the printed time is per operation
            samples, batch = [result.time_us], run.iters * run.agg_iters * max(run.graph_launches, 1)
            source["iterations_averaged"] = batch
            source["time_over_ranks"] = run.time_over_ranks  # nccl-tests' -a (mean by default); commbench: the max
        if result.per_process_us:
            source["per_process_us"] = [list(times) for times in result.per_process_us]
        if wrongs:
            source["wrong"] = wrongs
        records.append(_record(op=run.op, transport="ccl", backend="hip" if run.library == "rccl" else "cuda",
                               size=row.size, samples=samples, batch=batch, hostnames=list(run.hosts),
                               mpi_library=mpi_library, timestamp=timestamp, source=source, count=row.count,
                               dtype=row.dtype, checked=bool(wrongs), valid=not any(wrongs.values()),
                               wrong=sum(wrongs.values()) if wrongs else None, env=env or run.env,
                               versions={run.library: version} if version else None))
    return records


def osu_records(run: osu.Run, *, hostnames: list[str], timestamp: datetime, mpi_library: str = "",
                env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One record per size (and datatype); bandwidth rows (MB/s = 10^6 B/s) become the time per message at that
    rate (osu_bibw: of one message each way, both directions' bytes at the printed rate). The backend is where the
    title says the buffers are (MPI-CUDA: cuda, MPI-ROCM and RCCL: hip, MPI: cpu)."""
    device = run.accelerator or (run.library if run.ccl else "")
    if device and device not in OSU_BACKENDS:
        raise osu.OsuError(f"{run.title}: buffers on {device!r}, no backend of commbench's (cpu, cuda, hip)")
    backend = OSU_BACKENDS[device] if device else "cpu"
    if not hostnames:
        raise osu.OsuError("OSU output names no hosts: give the hosts the job ran on, one per rank")
    if run.op.startswith("osu_b") or run.op == "pingpong":
        if len(hostnames) != 2:
            raise osu.OsuError(f"{run.title} runs on 2 ranks; {len(hostnames)} hosts given")
    scale = len(hostnames) if run.op in osu.PER_RANK_SIZE_OPS else 1
    direction = P2P_DIRECTION.get(run.op)
    directions = 2 if direction == "bi" else 1
    records = []
    for row in run.rows:
        if row.value <= 0:
            raise osu.OsuError(f"size {row.size}: {row.value} is not a positive {run.quantity}")
        # bytes / MB/s = us; osu_bibw's rate counts both directions' bytes, 2 x size per exchange
        time_us = row.value if run.quantity == "latency" else directions * row.size / row.value
        source: dict[str, Any] = {"benchmark": "osu", "format": "osu", "version": run.version, "title": run.title,
                                  "reported": {"latency_us" if run.quantity == "latency" else "bandwidth_mbs":
                                               row.value}}
        if scale != 1:
            source["osu_size"] = row.size
        if row.iterations:
            source["iterations_averaged"] = row.iterations
        if row.min_us is not None:
            source["min_us"] = row.min_us
        if row.max_us is not None:
            source["max_us"] = row.max_us
        if row.tail:
            source["tail"] = dict(row.tail)
        records.append(_record(op=run.op, transport="ccl" if run.ccl else "mpi", backend=backend,
                               size=row.size * scale, samples=[time_us], batch=1, hostnames=list(hostnames),
                               mpi_library=mpi_library, timestamp=timestamp, source=source,
                               checked=row.passed is not None, valid=row.passed is not False, direction=direction,
                               dtype=row.dtype, env=env))
    return records


def parse(fmt: str, text: str, *, source: str, timestamp: datetime, hostnames: list[str] | None = None,
          mpi_library: str = "", env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The records of one file of format `fmt` (one of FORMATS). `timestamp`: when the output was written, for
    formats that do not say (nccl-tests' JSON says when it started: its start_time, the local time of the host
    that ran it, read as this host's local time). `env`: the environment the benchmark ran with, where the caller
    knows it (a ReFrame check's env_vars)."""
    if fmt == "nccl-tests":
        return nccl_tests_records(nccl_tests.parse_text(text, source), fmt=fmt, timestamp=timestamp,
                                  mpi_library=mpi_library, env=env)
    if fmt == "nccl-tests-json":
        run = nccl_tests.parse_json(text, source)
        started = run.start_time.astimezone() if run.start_time is not None else timestamp
        return nccl_tests_records(run, fmt=fmt, timestamp=started, mpi_library=mpi_library, env=env)
    if fmt == "osu":
        return osu_records(osu.parse_text(text, source), hostnames=hostnames or [], timestamp=timestamp,
                           mpi_library=mpi_library, env=env)
    raise ValueError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
