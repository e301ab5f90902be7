"""commbench --selections (one process, per size the library's own choice and every forced
selection in interleaved rounds) and --list-cvars, under the real Open MPI 4.1.4 and MPICH 4.0.2.
Small sizes, two rounds of two samples keep it fast on two cores."""
from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from campaigns.model.records import validate_record
from tuners.per_size import stops_early
from fixtures_bench import CommbenchBuild, read_records, run_commbench

COLLECTIVES = ["allreduce", "allgather", "alltoall", "bcast", "reduce_scatter"]
SIZES = [64, 4096]
ROUNDS = 2
ITERS = 2
SWEEP_ARGS = ["--transport", "mpi", "--sizes", ",".join(map(str, SIZES)), "--rounds", str(ROUNDS),
              "--iters", str(ITERS), "--warmup", "1"]
DYNAMIC_RULES = {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1"}
# The MPI collective behind each op and its control variable.
CVARS = {
    "openmpi": {op: f"coll_tuned_{'reduce_scatter_block' if op == 'reduce_scatter' else op}_algorithm"
                for op in COLLECTIVES},
    "mpich": {op: f"MPIR_CVAR_{('reduce_scatter_block' if op == 'reduce_scatter' else op).upper()}_INTRA_ALGORITHM"
              for op in COLLECTIVES},
}


# Open MPI 4.1.4's algorithms that take coll_tuned_<coll>_algorithm_segmentsize, swept with these sizes too.
SEGMENTED = {"allreduce": ["segmented_ring"],
             "bcast": ["chain", "pipeline", "split_binary_tree", "binary_tree", "binomial", "knomial",
                       "scatter_allgather", "scatter_allgather_ring"]}
SEGSIZES = [8192, 32768, 131072]


def list_cvars(build: CommbenchBuild, prefix: str) -> dict[str, dict[str, Any]]:
    """--list-cvars PREFIX in a one-rank job, by name."""
    done = run_commbench(build, 1, ["--list-cvars", prefix], env=DYNAMIC_RULES)
    assert done.returncode == 0, done.stderr
    cvars = [json.loads(line) for line in done.stdout.splitlines()]
    assert cvars and all(c["name"].startswith(prefix) for c in cvars)
    return {c["name"]: c for c in cvars}


def enumeration(build: CommbenchBuild, cvar: str) -> dict[str, int]:
    """Item name -> value of an enumerated control variable, as --list-cvars reports it."""
    return {item["name"]: item["value"] for item in list_cvars(build, cvar)[cvar]["enum"]}


def test_list_cvars_openmpi_enumerations(commbench_builds: dict[str, CommbenchBuild]) -> None:
    cvars = list_cvars(commbench_builds["openmpi"], "coll_tuned_")
    allreduce = cvars["coll_tuned_allreduce_algorithm"]
    assert allreduce["type"] == "int" and allreduce["scope"] == "all" and allreduce["enum_from"] == "mpi_t"
    assert allreduce["value"] == 0 and not allreduce["bound"]
    assert enumeration(commbench_builds["openmpi"], "coll_tuned_allreduce_algorithm") == {
        "ignore": 0, "basic_linear": 1, "nonoverlapping": 2, "recursive_doubling": 3, "ring": 4,
        "segmented_ring": 5, "rabenseifner": 6}
    rules = cvars["coll_tuned_use_dynamic_rules"]
    assert rules["type"] == "bool" and rules["scope"] == "readonly" and rules["value"] is True
    assert cvars["coll_tuned_allreduce_algorithm_count"]["value"] == 7


def test_list_cvars_writes_unsigned_values_as_unsigned(commbench_builds: dict[str, CommbenchBuild]) -> None:
    """Open MPI's size_t limits default to SIZE_MAX: written as a signed number, -1 (knobs check reads the value
    as the library's default)."""
    limit = list_cvars(commbench_builds["openmpi"], "btl_vader_put_limit")["btl_vader_put_limit"]
    assert limit["type"] == "unsigned_long" and limit["value"] == 2**64 - 1


def test_list_cvars_mpich_enumerations_from_descriptions(commbench_builds: dict[str, CommbenchBuild]) -> None:
    """MPICH 4.0.2 registers its enum cvars as plain ints; the items come from the description,
    in the order of the C enum (mpich-4.0.2 src/include/mpir_cvars.h), or not at all."""
    cvars = list_cvars(commbench_builds["mpich"], "MPIR_CVAR_")
    allreduce = cvars["MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM"]
    assert allreduce["enum_from"] == "description" and allreduce["scope"] == "all_eq"
    assert [(i["value"], i["name"]) for i in allreduce["enum"]] == [
        (0, "auto"), (1, "nb"), (2, "smp"), (3, "recursive_doubling"), (4, "reduce_scatter_allgather")]
    assert [i["name"] for i in cvars["MPIR_CVAR_COLLECTIVE_FALLBACK"]["enum"]] == ["error", "print", "silent"]
    for op in COLLECTIVES:
        items = cvars[CVARS["mpich"][op]]["enum"]
        assert items[0] == {"value": 0, "name": "auto"}
        assert [i["value"] for i in items] == list(range(len(items)))
    # Two differently padded groups of names: no items rather than guessed ones.
    assert cvars["MPIR_CVAR_IBCAST_INTRA_ALGORITHM"]["enum"] is None


def sweep_op(build: CommbenchBuild, nranks: int, op: str, selections: str, tmp_path: Path,
             extra: tuple[str, ...] = (), env: dict[str, str] | None = None
             ) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """One op's sweep in one launch: the finished process and its records."""
    output = tmp_path / f"{op}-{selections}.jsonl"
    done = run_commbench(build, nranks, ["--op", op, *SWEEP_ARGS, "--selections", selections, *extra,
                                         "--output", str(output)], env=DYNAMIC_RULES if env is None else env)
    return done, read_records(output) if output.exists() else []


def check_sweep(records: list[dict[str, Any]], enums: dict[str, dict[str, int]], cvars: dict[str, str],
                nranks: int, record_validator: jsonschema.Draft202012Validator) -> None:
    """One record per (op, size, selection); own plus every enumerated value, nothing else."""
    for index, record in enumerate(records):
        record_validator.validate(record)
        validate_record(record, f"sweep:{index + 1}")
        assert record["ranks"] == nranks
    openmpi = cvars[COLLECTIVES[0]].startswith("coll_tuned_")
    for op in COLLECTIVES:
        forced = {name: value for name, value in enums[op].items() if value != 0}
        segmented = {f"{name}/seg{segsize}": (forced[name], segsize)
                     for name in (SEGMENTED.get(op, []) if openmpi else []) for segsize in SEGSIZES}
        for size in SIZES:
            of_size = [r for r in records if r["op"] == op and r["requested_bytes"] == size]
            names = [r["selection"]["name"] for r in of_size]
            assert sorted(names) == sorted(["own", *forced, *segmented]), (op, size, names)
            for record in of_size:
                selection = record["selection"]
                assert selection["mechanism"] == "mpi_t" and selection["cvar"] == cvars[op]
                value, segsize = segmented.get(selection["name"], (forced.get(selection["name"], 0), None))
                assert (selection["value"], selection["segsize"]) == (value, segsize)
                if record["kind"] == "result":
                    # what the library reports: the values MPI_T reads back right after the write
                    readback = {"cvar_readback": value} | ({} if segsize is None else {"segsize_readback": segsize})
                    assert selection["reported"] == readback, (op, selection)
                    assert record["valid"] and record["check"] and selection["available"]
                    assert record["rounds"] == ROUNDS and len(record["round_medians"]) == ROUNDS
                    assert record["iters"] == ROUNDS * ITERS == len(record["samples_us"])
                    assert selection["reason"] is None


def sweep_all(build: CommbenchBuild, nranks: int, tmp_path: Path,
              record_validator: jsonschema.Draft202012Validator) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    """--selections all over the five collectives in one launch; the checked records and the enumerations."""
    enums = {op: enumeration(build, CVARS[build.mpi][op]) for op in COLLECTIVES}
    output = tmp_path / "sweep.jsonl"
    done = run_commbench(build, nranks, [*SWEEP_ARGS, "--selections", "all", "--output", str(output)],
                         env=DYNAMIC_RULES, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_records(output)
    check_sweep(records, enums, CVARS[build.mpi], nranks, record_validator)
    return records, enums


def test_sweep_openmpi_one_process(
    commbench_builds: dict[str, CommbenchBuild], record_validator: jsonschema.Draft202012Validator, tmp_path: Path
) -> None:
    records, _ = sweep_all(commbench_builds["openmpi"], 4, tmp_path, record_validator)
    # The forced algorithm is really what the communicator runs: Open MPI's two_proc algorithms
    # refuse 4 ranks (MPI_ERR_UNSUPPORTED_OPERATION), recorded as unavailable; own and the others ran.
    refused = [r for r in records if r["kind"] == "error"]
    assert {(r["op"], r["selection"]["name"]) for r in refused} == {("allgather", "two_proc"), ("alltoall", "two_proc")}
    for record in refused:
        assert record["reason"] == "unsupported" and not record["selection"]["available"]
        assert "MPI_ERR_UNSUPPORTED_OPERATION" in record["selection"]["reason"]
    assert sum(r["kind"] == "result" for r in records) == len(records) - 2 * len(SIZES)


def test_sweep_mpich_writes_only_enumerated_values(
    commbench_builds: dict[str, CommbenchBuild], record_validator: jsonschema.Draft202012Validator, tmp_path: Path
) -> None:
    records, enums = sweep_all(commbench_builds["mpich"], 2, tmp_path, record_validator)
    assert all(r["kind"] == "result" for r in records)
    # every value written is one of MPI_T's items: the set of values is exactly the enumeration
    for op in COLLECTIVES:
        assert {r["selection"]["value"] for r in records if r["op"] == op} == set(enums[op].values())


@pytest.mark.parametrize("mpi", ["openmpi", "mpich"])
def test_sweep_named_selections_and_validation(
    commbench_builds: dict[str, CommbenchBuild], tmp_path: Path, mpi: str
) -> None:
    """A LIST keeps own plus the named ones, interleaved; planted corruption fails every selection."""
    done, records = sweep_op(commbench_builds[mpi], 2, "allreduce", "recursive_doubling", tmp_path,
                             ("--inject", "corrupt"))
    assert done.returncode == 1, done.stderr[-3000:]
    assert [(r["requested_bytes"], r["selection"]["name"]) for r in records] == [
        (size, name) for size in SIZES for name in ("own", "recursive_doubling")]
    assert all(not r["valid"] and r["wrong_elements"] > 0 and r["reason"] == "validation" for r in records)


def test_sweep_keeps_named_selections_in_the_order_named(
    commbench_builds: dict[str, CommbenchBuild], tmp_path: Path
) -> None:
    """own first, then the named ones as named, whatever their order in the library's list (and own may be named)."""
    done, records = sweep_op(commbench_builds["mpich"], 2, "allreduce",
                             "reduce_scatter_allgather,own,recursive_doubling", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [(r["requested_bytes"], r["selection"]["name"]) for r in records] == [
        (size, name) for size in SIZES for name in ("own", "reduce_scatter_allgather", "recursive_doubling")]


def test_sweep_unknown_selection_names_the_known_ones(
    commbench_builds: dict[str, CommbenchBuild], tmp_path: Path
) -> None:
    done, (record,) = sweep_op(commbench_builds["mpich"], 2, "allreduce", "ring_of_fire", tmp_path)
    assert done.returncode == 4
    assert record["kind"] == "error" and "ring_of_fire" in record["error"]
    assert "recursive_doubling" in record["error"] and "reduce_scatter_allgather" in record["error"]


def test_sweep_openmpi_refuses_without_dynamic_rules(
    commbench_builds: dict[str, CommbenchBuild], tmp_path: Path
) -> None:
    done, (record,) = sweep_op(commbench_builds["openmpi"], 2, "bcast", "all", tmp_path,
                               env={"OMPI_MCA_coll_tuned_use_dynamic_rules": "0"})
    assert done.returncode == 4
    assert record["kind"] == "error" and record["reason"] == "unsupported"
    assert "OMPI_MCA_coll_tuned_use_dynamic_rules=1" in record["error"]


@pytest.mark.parametrize("args, named", [
    (["--op", "pingpong", "--selections", "all"], "pingpong"),
    (["--selections", "Ring"], "Ring"),
    (["--rounds", "0"], "--rounds"),
    (["--rounds", "7"], "--rounds applies to a selection sweep"),  # accepted and ignored: one block of --iters
    (["--stop-slower", "2"], "--selections"),
    (["--selections", "all", "--stop-slower", "2", "--stop-after", "2"], "--stop-after"),
    (["--selections", "all", "--rounds", "7", "--stop-slower", "2"], "give --rounds >= 8 (now 7)"),
    # a name twice made the candidate filter memmove a negative size (memory corruption)
    (["--op", "allreduce", "--selections", "ring,recursive_doubling,ring"], "--selections: 'ring' is named twice"),
    (["--op", "allreduce", "--selections", "own,own"], "--selections: 'own' is named twice"),
])
def test_sweep_bad_arguments_exit_2(commbench_builds: dict[str, CommbenchBuild], args: list[str], named: str) -> None:
    done = run_commbench(commbench_builds["mpich"], 1, args)
    assert done.returncode == 2 and named in done.stderr


@pytest.mark.parametrize("mpi", ["openmpi", "mpich"])
def test_sweep_stop_slower_stops_exactly_what_the_rule_names(
    commbench_builds: dict[str, CommbenchBuild], record_validator: jsonschema.Draft202012Validator, tmp_path: Path,
    mpi: str
) -> None:
    """--stop-slower F --stop-after K: a selection that took >= F x own's time in K - 1 or all of the even-indexed
    rounds 0, 2, ..., 2K-2 runs no more rounds (its record: rounds 0 .. 2K-2, selection.stopped_after 2K-1); every
    other one runs all of them.
    Checked against the rule (tuners.per_size.stops_early, what the tuner replays) on the records' own round
    medians. F = 1 stops any selection not faster than own in most judged rounds: some always do, as the library's
    own choice is seldom beaten everywhere; F = 10^6 stops none. A judged round whose time equals F x own's to the
    records' 9 digits can fall either way in commbench's doubles: such a selection is not checked against the rule
    (seen once in 15 runs at F = 1: two 0.3505 us rounds)."""
    rounds, after = 8, 3
    sizes = [8, 64, 512, 4096, 32768]  # more chances to stop than SIZES: MPICH's allreduce has few selections
    stopped_counts = []
    for factor in ("1", "1000000"):
        (tmp_path / factor).mkdir()
        done, records = sweep_op(commbench_builds[mpi], 2, "allreduce", "all", tmp_path / factor,
                                 ("--rounds", str(rounds), "--stop-slower", factor, "--stop-after", str(after),
                                  "--sizes", ",".join(map(str, sizes))))
        assert done.returncode == 0, done.stderr[-3000:]
        stopped = 0
        for size in sizes:
            of_size = {r["selection"]["name"]: r for r in records if r["requested_bytes"] == size}
            own = of_size.pop("own")["round_medians"]
            assert len(own) == rounds
            for name, record in of_size.items():
                record_validator.validate(record)
                medians, selection = record["round_medians"], record["selection"]
                tie = any(math.isclose(medians[r], float(factor) * own[r], rel_tol=1e-8) for r in range(0, 2 * after, 2))
                if "stopped_after" in selection:
                    stopped += 1
                    assert selection["stopped_after"] == 2 * after - 1 == record["rounds"] == len(medians)
                    assert record["iters"] == (2 * after - 1) * ITERS == len(record["samples_us"])
                    assert selection["reason"].startswith(f"stopped after {2 * after - 1} rounds: ")
                    assert tie or stops_early(own, medians + own[len(medians):], float(factor), after), (size, name)
                else:
                    assert record["rounds"] == rounds == len(medians) and selection["reason"] is None
                    assert tie or not stops_early(own, medians, float(factor), after), (size, name)
        stopped_counts.append(stopped)
    assert stopped_counts[0] > 0 and stopped_counts[1] == 0


def test_sweep_without_run_time_switch_measures_own_per_process(
    commbench_builds: dict[str, CommbenchBuild], tmp_path: Path
) -> None:
    """Open MPI without coll_tuned has no algorithm variable: own alone, mechanism process, reason given."""
    done, records = sweep_op(commbench_builds["openmpi"], 2, "allreduce", "all", tmp_path, env={"OMPI_MCA_coll": "^tuned"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["requested_bytes"] for r in records] == SIZES
    for record in records:
        assert record["kind"] == "result" and record["valid"] and len(record["round_medians"]) == ROUNDS
        assert record["selection"]["name"] == "own" and record["selection"]["mechanism"] == "process"
        assert record["selection"]["cvar"] is None and "coll_tuned_allreduce_algorithm" in record["selection"]["reason"]


def test_sweep_timeout_record_names_the_selection(commbench_builds: dict[str, CommbenchBuild], tmp_path: Path) -> None:
    done, (record,) = sweep_op(commbench_builds["mpich"], 2, "allreduce", "nb", tmp_path,
                               ("--inject", "hang", "--timeout", "3"))
    assert done.returncode == 3
    assert record["reason"] == "timeout" and record["selection"]["name"] == "own"
    assert record["selection"]["cvar"] == "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM"


# A transport that keeps its result in a buffer of its own (a GPU build's staging: a pinned host bounce buffer)
# and whose step does nothing for one call leaves the previous call's result there. This MPI_Allreduce (PMPI,
# LD_PRELOAD) plays it on the cpu build: float calls copy their result into a bounce buffer, and call
# number STALE_SKIP_CALL does not communicate but hands back what the bounce buffer holds.
STALE_SHIM = r"""
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
static char bounce[1 << 16];
static int calls;
int MPI_Allreduce(const void *send, void *recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm)
{
    size_t bytes = (size_t)count * sizeof(float);
    if (type != MPI_FLOAT || bytes > sizeof bounce)
        return PMPI_Allreduce(send, recv, count, type, op, comm);
    const char *skip = getenv("STALE_SKIP_CALL");
    if (++calls == (skip ? atoi(skip) : 0)) {
        memcpy(recv, bounce, bytes);
        return MPI_SUCCESS;
    }
    int rc = PMPI_Allreduce(send, recv, count, type, op, comm);
    memcpy(bounce, recv, bytes);
    return rc;
}
"""


def test_sweep_stale_result_of_another_selection_fails_validation(
    commbench_builds: dict[str, CommbenchBuild], tmp_path: Path
) -> None:
    """A selection whose allreduce did nothing, its output the previous cell's (own's, same size and round)
    left in the transport's buffer: it passed validation, every cell being filled with the same seed. The
    seed now mixes op, size, instance, selection and round in: its data differs."""
    shim = tmp_path / "stale.so"
    built = subprocess.run(["mpicc.mpich", "-shared", "-fPIC", "-O1", "-o", str(shim), "-x", "c", "-"],
                           input=STALE_SHIM, capture_output=True, text=True, timeout=120, check=False)
    assert built.returncode == 0, built.stderr
    output = tmp_path / "out.jsonl"
    # float allreduce calls: 1 own round 0, 2 recursive_doubling round 0 (skipped), 3 and 4 the extra checks
    done = run_commbench(commbench_builds["mpich"], 2, [
        "--op", "allreduce", "--transport", "mpi", "--sizes", "64", "--rounds", "1", "--iters", "1", "--warmup", "0",
        "--selections", "recursive_doubling", "--output", str(output)],
        env={"LD_PRELOAD": str(shim), "STALE_SKIP_CALL": "2"})
    assert done.returncode == 1, done.stdout + done.stderr
    own, stale = read_records(output)
    assert own["selection"]["name"] == "own" and own["valid"] is True
    assert stale["selection"]["name"] == "recursive_doubling"
    assert stale["valid"] is False and stale["wrong_elements"] > 0 and stale["reason"] == "validation"
    # the shim does what it says: without a skipped call, both cells are valid
    done = run_commbench(commbench_builds["mpich"], 2, [
        "--op", "allreduce", "--transport", "mpi", "--sizes", "64", "--rounds", "1", "--iters", "1", "--warmup", "0",
        "--selections", "recursive_doubling"], env={"LD_PRELOAD": str(shim), "STALE_SKIP_CALL": "0"})
    assert done.returncode == 0, done.stdout + done.stderr
