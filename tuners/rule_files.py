"""The per-size stage's ranges as each MPI library's own per-size rule file.

Sizes: commbench's `bytes` of a collective is the size each library below compares, so a range
[min_bytes, max_bytes] of measured sizes is written as is:
- Open MPI 4.1 coll_tuned (ompi/mca/coll/tuned/coll_tuned_decision_dynamic.c at v4.1.4): allreduce
  and bcast count * type size, alltoall and allgather comm size * count * type size,
  reduce_scatter_block recvcount * comm size * type size: the whole buffer, as commbench's bytes.
- MPICH 4.0 csel (src/mpi/coll/src/csel.c at v4.0.2): `avg_msg_size` is count * type size for
  allreduce, bcast and reduce (= bytes); `total_msg_size` is comm size * count * type size for
  alltoall, allgather and reduce_scatter_block (= bytes). Each op uses the one that equals bytes.

Open MPI dynamic rules file (coll_tuned_dynamic_file.c at v4.1.4): whitespace-separated integers,
`#` to end of line is a comment: <number of collectives>, then per collective <COLLTYPE id>
<number of comm sizes>, per comm size <comm size> <number of message rules>, per message rule
<message size> <algorithm> <fan-in/out> <segment size>. The first message rule must be size 0;
a call uses the rule with the largest comm size <= its own (else the first) and in it the last
message rule whose size is <= the call's; algorithm 0 falls back to the fixed decision (the
library's own choice). Comm sizes other than the measured one get their own 0 rule, so the file
changes nothing but the measured communicator size.

MPICH JSON (MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE): REPLACES MPICH's whole built-in tree, so
the file is MPICH 4.0.2's own tree (tuners/data/mpich-4.0.2-mpir-generic.json) with, for the
tuned collective, a branch for the measured comm size in front of the built-in one: sizes inside a
range get the range's algorithm, every other size falls through to the built-in subtree. What MPICH 4.0.2
(source at tag v4.0.2) does with such a file, and what the stage therefore leaves out:
- The file is read by the MPIR-level selection only. On a communicator over several nodes with more than one
  rank on a node, the ch4 device (Debian's 4.0.2 is ch4:ucx) runs allreduce, bcast and reduce as a node-aware
  composition (src/mpid/ch4/src/ch4_coll_impl.h, MPIDI_<Coll>_intra_composition_alpha; chosen by ch4's own
  tree, maint/tuning/coll/ch4/generic.json): the MPIR selection then sees only the node leaders' communicator
  (one rank per node) and each node's, never the tuned comm size, while a sweep's forced algorithm
  (MPIR_CVAR_<COLL>_INTRA_ALGORITHM through MPI_T) changed the leaders' step. Such a layout gets no rules
  (mpich_layout_problem).
- An algorithm forced through MPIR_CVAR_<COLL>_INTRA_ALGORITHM runs without the selection file: a
  deployed environment that sets it for the op never consults the rules, and the sweep's `own` (value 0,
  auto) is not what it deploys (mpich_forced_by_env).
- Algorithms have restrictions (src/mpi/coll/coll_algorithms.txt: power-of-two, parent-comm, inplace,
  noinplace, commutative, builtin-op, size-ge-pof2). The forced-variable path checks them
  (maint/gen_coll.py dump_fallback: MPII_COLLECTIVE_FALLBACK_CHECK) and with
  MPIR_CVAR_COLLECTIVE_FALLBACK=silent, the default, runs auto instead, so a sweep "measures" an
  algorithm that never ran; a container of the selection file runs unchecked (wrong data, or an
  assertion). An algorithm commbench's call cannot run is no candidate (mpich_restrict_sweep); in the file
  each call-dependent restriction becomes the csel key that tests it (comm_hierarchy=parent,
  is_sendbuf_inplace, is_commutative, is_op_built_in, count<pow2), whose other side is the built-in subtree.
  (Setting MPIR_CVAR_COLLECTIVE_FALLBACK=error for the sweep instead would abort it: commbench runs MPICH's
  selections on MPI_COMM_WORLD, whose error handler stays MPI_ERRORS_ARE_FATAL, mpi_selection.c.)
- csel reads each bound with atoi into an int (src/mpi/coll/src/csel.c:463-491): a bound above INT_MAX
  wraps, so a range's upper bound is clipped to INT_MAX and a range starting above it is left out (a
  comment in the file says so).
- csel's search evaluates `comm_size<N` as `<=` (csel.c:1212; the per-communicator pruning, csel.c:619, is
  right): the built-in subtrees copied below the branch's message-size keys, which the search evaluates, get
  their comm-size keys resolved for the measured comm size first.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from importlib import resources
from typing import Any

from tuners.catalog import env_names
from tuners.per_size import PerSizeResult, SizeRange

# COLLTYPE_T of ompi/mca/coll/base/coll_base_functions.h (v4.1.4) for the ops commbench runs.
OMPI_COLLTYPE = {"allgather": 0, "allreduce": 2, "alltoall": 3, "bcast": 7, "reduce": 11, "reduce_scatter": 13}
OMPI_COLLTYPE_COUNT = 22  # COLLCOUNT
OMPI_FANINOUT = 4  # coll_tuned_<coll>_algorithm_{tree,chain}_fanout default: what a forced selection used
OMPI_SEGSIZE = 0  # coll_tuned_<coll>_algorithm_segmentsize default: what a forced selection without a segsize used
OMPI_MCA = ("OMPI_MCA_coll_tuned_use_dynamic_rules", "OMPI_MCA_coll_tuned_dynamic_rules_filename")
MPICH_JSON_ENV = "MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE"
# op -> (csel collective, size key equal to commbench's bytes, MPIR name prefix)
MPICH_COLLECTIVES = {
    "allreduce": ("allreduce", "avg_msg_size", "MPIR_Allreduce_intra_"),
    "bcast": ("bcast", "avg_msg_size", "MPIR_Bcast_intra_"),
    "reduce": ("reduce", "avg_msg_size", "MPIR_Reduce_intra_"),
    "alltoall": ("alltoall", "total_msg_size", "MPIR_Alltoall_intra_"),
    "allgather": ("allgather", "total_msg_size", "MPIR_Allgather_intra_"),
    "reduce_scatter": ("reduce_scatter_block", "total_msg_size", "MPIR_Reduce_scatter_block_intra_"),
}
# Containers MPII_Create_container (src/mpi/coll/src/csel_container.c, v4.0.2) knows for them; any
# other name makes MPICH abort at MPI_Init ("unrecognized key").
MPICH_ALGORITHMS = frozenset(
    {
        "MPIR_Allgather_intra_brucks", "MPIR_Allgather_intra_recursive_doubling", "MPIR_Allgather_intra_ring",
        "MPIR_Allreduce_intra_recursive_doubling", "MPIR_Allreduce_intra_reduce_scatter_allgather",
        "MPIR_Allreduce_intra_smp", "MPIR_Alltoall_intra_brucks", "MPIR_Alltoall_intra_pairwise",
        "MPIR_Alltoall_intra_pairwise_sendrecv_replace", "MPIR_Alltoall_intra_scattered",
        "MPIR_Bcast_intra_binomial", "MPIR_Bcast_intra_scatter_recursive_doubling_allgather",
        "MPIR_Bcast_intra_scatter_ring_allgather", "MPIR_Bcast_intra_smp",
        "MPIR_Reduce_scatter_block_intra_noncommutative", "MPIR_Reduce_scatter_block_intra_pairwise",
        "MPIR_Reduce_scatter_block_intra_recursive_doubling", "MPIR_Reduce_scatter_block_intra_recursive_halving",
        "MPIR_Reduce_intra_binomial", "MPIR_Reduce_intra_reduce_scatter_gather", "MPIR_Reduce_intra_smp",
        "MPIR_Allgather_allcomm_nb", "MPIR_Allreduce_allcomm_nb", "MPIR_Alltoall_allcomm_nb", "MPIR_Bcast_allcomm_nb",
        "MPIR_Reduce_allcomm_nb", "MPIR_Reduce_scatter_block_allcomm_nb",
    }
)
# Restrictions of the algorithms above (src/mpi/coll/coll_algorithms.txt at v4.0.2, "restrictions:"; the
# algorithm sources assert or silently misbehave without them, e.g. allgather_intra_recursive_doubling.c:45
# asserts a power of two, allreduce_intra_smp.c on a flat communicator only copies its own input).
MPICH_RESTRICTIONS: dict[str, tuple[str, ...]] = {
    "MPIR_Allgather_intra_recursive_doubling": ("power-of-two",),
    "MPIR_Allreduce_intra_smp": ("commutative", "parent-comm"),
    "MPIR_Allreduce_intra_reduce_scatter_allgather": ("size-ge-pof2", "builtin-op"),
    "MPIR_Alltoall_intra_brucks": ("noinplace",),
    "MPIR_Alltoall_intra_pairwise": ("noinplace",),
    "MPIR_Alltoall_intra_pairwise_sendrecv_replace": ("inplace",),
    "MPIR_Alltoall_intra_scattered": ("noinplace",),
    "MPIR_Bcast_intra_smp": ("parent-comm",),
    "MPIR_Reduce_intra_smp": ("commutative", "parent-comm"),
    "MPIR_Reduce_intra_reduce_scatter_gather": ("size-ge-pof2", "builtin-op"),
    "MPIR_Reduce_scatter_block_intra_noncommutative": ("power-of-two",),
    "MPIR_Reduce_scatter_block_intra_pairwise": ("commutative",),
    "MPIR_Reduce_scatter_block_intra_recursive_halving": ("commutative",),
}
# The csel keys (src/mpi/coll/src/csel.c at v4.0.2) that test a restriction per call: (the side where the algorithm
# may run, the other side). power-of-two needs none: the branch holds one comm size, checked when it is written.
MPICH_GUARDS = {
    "parent-comm": ("comm_hierarchy=parent", "comm_hierarchy=any"),
    "inplace": ("is_sendbuf_inplace=yes", "is_sendbuf_inplace=no"),
    "noinplace": ("is_sendbuf_inplace=no", "is_sendbuf_inplace=yes"),
    "commutative": ("is_commutative=yes", "is_commutative=no"),
    "builtin-op": ("is_op_built_in=yes", "is_op_built_in=no"),
    "size-ge-pof2": ("count=any", "count<pow2"),  # written the other way round: count<pow2 first
}
# commbench's calls (bench_src/src/transports/mpi.c): MPI_FLOAT, MPI_SUM (built in, commutative), separate send and
# receive buffers (never MPI_IN_PLACE), on MPI_COMM_WORLD; its bytes are count x 4 for allreduce and bcast.
COMMBENCH_TYPE_SIZE = 4
INT_MAX = 2**31 - 1  # csel's bounds are ints (atoi)
# Intel MPI I_MPI_ADJUST_<COLL> algorithm ids (Intel MPI Library Developer Reference, "I_MPI_ADJUST
# Family"), for the MPICH algorithms they share. NOT run here: no Intel MPI on this machine.
INTEL_IDS = {
    "MPIR_Allreduce_intra_recursive_doubling": 1,
    "MPIR_Allreduce_intra_reduce_scatter_allgather": 2,
    "MPIR_Bcast_intra_binomial": 1,
    "MPIR_Bcast_intra_scatter_recursive_doubling_allgather": 2,
    "MPIR_Bcast_intra_scatter_ring_allgather": 3,
    "MPIR_Allgather_intra_recursive_doubling": 1,
    "MPIR_Allgather_intra_brucks": 2,
    "MPIR_Allgather_intra_ring": 3,
    "MPIR_Alltoall_intra_brucks": 1,
    "MPIR_Alltoall_intra_scattered": 2,
    "MPIR_Alltoall_intra_pairwise": 3,
}


class RuleFileError(ValueError):
    pass


def _changed(result: PerSizeResult) -> list[SizeRange]:
    return [r for r in result.ranges if r.selection is not None]


def _with_changes(
    results: Sequence[PerSizeResult], known: Mapping[str, object], library: str
) -> Iterator[tuple[PerSizeResult, list[SizeRange]]]:
    """The results with at least one changed range; an op the library's file cannot hold is an error."""
    for result in results:
        if result.op not in known:
            raise RuleFileError(f"op {result.op} has no {library} collective in its per-size rule file")
        changed = _changed(result)
        if changed:
            yield result, changed


def _comments(prefix: str, lines: Sequence[str]) -> list[str]:
    return [f"{prefix} {re.sub(r'[^ -~]', '?', line)}" for line in lines]


# ---- Open MPI ------------------------------------------------------------------------------------


def ompi_algorithm(size_range: SizeRange, op: str) -> tuple[int, int]:
    """(algorithm, segment size) of a changed range: the values the sweep wrote through MPI_T."""
    selection = size_range.selection
    assert selection is not None
    expected = f"coll_tuned_{'reduce_scatter_block' if op == 'reduce_scatter' else op}_algorithm"
    if selection.mechanism != "mpi_t" or selection.cvar != expected or selection.value is None or selection.value < 1:
        raise RuleFileError(
            f"{op} selection {selection.name!r} ({selection.mechanism} {selection.cvar}={selection.value}) is not an "
            f"Open MPI {expected} value >= 1"
        )
    return selection.value, OMPI_SEGSIZE if selection.segsize is None else selection.segsize


def ompi_rules_text(results: Sequence[PerSizeResult], evidence: Sequence[str]) -> str:
    """The dynamic rules file for every op of `results` that has a change (module docstring)."""
    blocks: list[tuple[int, list[str]]] = []
    for result, changed in _with_changes(results, OMPI_COLLTYPE, "Open MPI coll_tuned"):
        own = (0, OMPI_SEGSIZE)
        rules = [(0, own)]
        for size_range in changed:
            if rules[-1][0] == size_range.min_bytes:
                rules.pop()
            rules += [(size_range.min_bytes, ompi_algorithm(size_range, result.op)), (size_range.max_bytes + 1, own)]
        comms = [(result.ranks, rules), (result.ranks + 1, [(0, own)])]
        if result.ranks > 1:
            comms.insert(0, (1, [(0, own)]))
        lines = [
            f"# {result.op}: measured on {result.ranks} ranks / {result.nodes} nodes; other comm sizes: library's choice",
            f"{OMPI_COLLTYPE[result.op]} {len(comms)}  # collective id, comm sizes",
        ]
        for comm_size, messages in comms:
            lines.append(f"{comm_size} {len(messages)}  # comm size, message rules")
            lines.extend(f"{size} {alg} {OMPI_FANINOUT} {segsize}" for size, (alg, segsize) in messages)
        blocks.append((OMPI_COLLTYPE[result.op], lines))
    if len({cid for cid, _ in blocks}) != len(blocks):
        raise RuleFileError("two per-size results for the same Open MPI collective")
    text = "\n".join(
        [
            "# Open MPI coll_tuned dynamic rules (coll_tuned_dynamic_rules_filename); generated by commcamp",
            *_comments("#", evidence),
            f"{len(blocks)}  # collectives",
            *(line for _, lines in sorted(blocks) for line in lines),
        ]
    )
    parse_ompi_rules(text)
    return text + "\n"


def parse_ompi_rules(text: str) -> dict[int, list[tuple[int, list[tuple[int, int, int, int]]]]]:
    """Reads the file as coll_tuned_dynamic_file.c (v4.1.4) does, with its checks; collective id ->
    [(comm size, [(message size, algorithm, fan-in/out, segment size)])]."""
    numbers: list[int] = []
    for number, line in enumerate(text.splitlines(), 1):
        for token in line.split("#", 1)[0].split():
            try:
                numbers.append(int(token))
            except ValueError:
                raise RuleFileError(f"line {number}: {token!r} is not an integer") from None
    stream = iter(numbers)

    def take(what: str) -> int:
        value = next(stream, None)
        if value is None or value < 0:
            raise RuleFileError(f"{what}: missing or negative")
        return value

    rules: dict[int, list[tuple[int, list[tuple[int, int, int, int]]]]] = {}
    for _ in range(take("number of collectives")):
        collective = take("collective id")
        if collective >= OMPI_COLLTYPE_COUNT or collective in rules:
            raise RuleFileError(f"collective id {collective} out of range or repeated")
        comms = []
        for _ in range(take(f"collective {collective}: number of comm sizes")):
            comm_size = take(f"collective {collective}: comm size")
            messages = [
                (take("message size"), take("algorithm"), take("fan-in/out"), take("segment size"))
                for _ in range(take(f"collective {collective} comm size {comm_size}: number of message rules"))
            ]
            if messages and messages[0][0] != 0:
                raise RuleFileError(f"collective {collective} comm size {comm_size}: first message rule must be size 0")
            if [m[0] for m in messages] != sorted({m[0] for m in messages}):
                raise RuleFileError(f"collective {collective} comm size {comm_size}: message sizes not increasing")
            comms.append((comm_size, messages))
        if [c for c, _ in comms] != sorted({c for c, _ in comms}):
            raise RuleFileError(f"collective {collective}: comm sizes not increasing")
        rules[collective] = comms
    if next(stream, None) is not None:
        raise RuleFileError("numbers after the last collective")
    return rules


# ---- MPICH ---------------------------------------------------------------------------------------


def mpich_container(op: str, name: str) -> str:
    """The container name of the MPI_T enum item `name` of op's MPIR_CVAR_<COLL>_INTRA_ALGORITHM: the enum names the
    algorithm without its prefix; "nb" is the container MPIR_<Coll>_allcomm_nb."""
    prefix = MPICH_COLLECTIVES[op][2]
    return prefix.replace("_intra_", "_allcomm_nb") if name == "nb" else prefix + name


def mpich_algorithm(size_range: SizeRange, op: str) -> str:
    selection = size_range.selection
    assert selection is not None
    prefix = MPICH_COLLECTIVES[op][2]
    name = mpich_container(op, selection.name)
    if selection.mechanism != "mpi_t" or name not in MPICH_ALGORITHMS:
        raise RuleFileError(f"{op} selection {selection.name!r} is not an MPICH 4.0.2 {prefix}* algorithm")
    return name


def mpich_op_variable(op: str) -> str | None:
    """The variable that forces op's algorithm (what commbench's sweep writes through MPI_T), or None."""
    collective = MPICH_COLLECTIVES.get(op)
    return None if collective is None else f"MPIR_CVAR_{collective[0].upper()}_INTRA_ALGORITHM"


def mpich_forced_by_env(op: str, env: Mapping[str, str]) -> str | None:
    """Why per-size rules for op cannot apply under `env` (None: they can): env forces op's algorithm, so MPICH
    runs that algorithm at every size without reading the selection file (mpir_coll.c at v4.0.2: the switch on
    MPIR_CVAR_<COLL>_INTRA_ALGORITHM calls the selection only for auto), and the sweep's baseline `own` (the
    variable written to 0, auto, through MPI_T: bench_src/src/transports/mpi_selection.c) is not what deploys."""
    variable = mpich_op_variable(op)
    if variable is None:
        return None
    # the spelling MPICH takes where several are set (MPIR_CVAR_, then MPIR_PARAM_, then MPICH_: env_names)
    variable = next((name for name in env_names(variable) if name in env), variable)
    value = env.get(variable)
    if value is None or value.strip().lower() in ("", "auto"):
        return None
    return (f"the environment sets {variable}={value}: MPICH then runs that {op} algorithm at every size without "
            "reading the selection file, and the sweep's baseline (the library's own choice, auto) is not what "
            "the environment deploys")


def mpich_layout_problem(ranks: int, nodes: int) -> str | None:
    """Why an MPICH selection file tuned on `ranks` ranks over `nodes` nodes would not apply there (None: it would):
    module docstring. One rank per node leaves the communicator flat (no node hierarchy: MPIR_Comm_create_subcomms,
    src/mpi/comm/commutil.c:595 at v4.0.2), one node is its own node communicator: both keep the comm size."""
    if nodes <= 1 or ranks <= nodes:
        return None
    return (f"MPICH on {nodes} nodes with more than one rank per node ({ranks} ranks): its ch4 device runs the "
            "collective as a node-aware composition (src/mpid/ch4/src/ch4_coll_impl.h, "
            "MPIDI_<Coll>_intra_composition_alpha at v4.0.2) whose MPIR-level selection reads the selection file "
            f"only on the node leaders' communicator ({nodes} ranks) and within each node, never at {ranks} "
            "ranks: a rule would never apply (the sweep's forced algorithm changed the leaders' step only)")


def _pof2(ranks: int) -> int:
    """MPL_pof2: the largest power of two <= ranks (comm->coll.pof2)."""
    return 1 << (max(ranks, 1).bit_length() - 1)


def mpich_cannot_run(algorithm: str, ranks: int, nodes: int, size: int) -> str | None:
    """Why MPICH 4.0.2 cannot run `algorithm` (a container name) for commbench's call of `size` bytes on `ranks`
    ranks over `nodes` nodes (None: it can), from the algorithm's restrictions (MPICH_RESTRICTIONS)."""
    failed = []
    for restriction in MPICH_RESTRICTIONS.get(algorithm, ()):
        if restriction == "parent-comm" and ranks <= nodes:
            failed.append("parent-comm: needs a node with more than one rank of the communicator (one rank per node "
                          "leaves it flat)")
        elif restriction == "power-of-two" and ranks & (ranks - 1):
            failed.append(f"power-of-two: {ranks} ranks")
        elif restriction == "inplace":
            failed.append("inplace: commbench's send buffer is never MPI_IN_PLACE")
        elif restriction == "size-ge-pof2" and size // COMMBENCH_TYPE_SIZE < _pof2(ranks):
            failed.append(f"size-ge-pof2: count {size // COMMBENCH_TYPE_SIZE} < {_pof2(ranks)}")
    return "; ".join(failed) or None


def mpich_restrict_sweep(records: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The sweep's records with every selection MPICH 4.0.2 cannot run at that size and layout marked unavailable
    (its forced run fell back to MPICH's own choice: MPIR_CVAR_COLLECTIVE_FALLBACK=silent; a rule would run it
    unchecked), and a note per such selection."""
    out: list[dict[str, Any]] = []
    left_out: dict[tuple[str, str, str], list[int]] = {}
    for record in records:
        selection = record.get("selection")
        op = record.get("op")
        if (record.get("kind", "result") != "result" or not isinstance(selection, Mapping)
                or selection.get("mechanism") != "mpi_t" or selection.get("name") in (None, "own")
                or not selection.get("available", True) or op not in MPICH_COLLECTIVES):
            out.append(dict(record))
            continue
        name = str(selection["name"])
        size = int(record.get("bytes", 0))
        why = mpich_cannot_run(mpich_container(op, name), int(record["ranks"]), int(record["nodes"]), size)
        if why is None:
            out.append(dict(record))
            continue
        out.append({**record, "selection": {**selection, "available": False,
                                            "reason": f"MPICH 4.0.2 cannot run it here ({why})"}})
        left_out.setdefault((op, name, why), []).append(size)
    notes = [f"{op} {name} is no candidate at {', '.join(f'{s} B' for s in sorted(set(sizes)))}: MPICH 4.0.2's "
             f"restriction ({why}; src/mpi/coll/coll_algorithms.txt) - its forced run in the sweep ran MPICH's own "
             "choice instead (MPIR_CVAR_COLLECTIVE_FALLBACK=silent), and a rule would run it unchecked"
             for (op, name, why), sizes in left_out.items()]
    return out, notes


def mpich_ranges(result: PerSizeResult) -> tuple[list[tuple[SizeRange, int]], list[str]]:
    """The changed ranges as the selection file can hold them, each with its upper bound (clipped to INT_MAX: csel
    reads bounds with atoi into an int, src/mpi/coll/src/csel.c:463-491 at v4.0.2), and a note per range clipped or
    left out (one that starts above INT_MAX)."""
    kept: list[tuple[SizeRange, int]] = []
    notes: list[str] = []
    for size_range in _changed(result):
        where = f"{result.op} [{size_range.min_bytes}, {size_range.max_bytes}] B"
        if size_range.min_bytes > INT_MAX:
            notes.append(f"{where}: left out, MPICH 4.0.2 reads a selection-file bound as an int (at most {INT_MAX})")
        elif size_range.max_bytes > INT_MAX:
            notes.append(f"{where}: upper bound clipped to {INT_MAX}, MPICH 4.0.2 reads a selection-file bound as an "
                         "int: larger sizes keep MPICH's choice")
            kept.append((size_range, INT_MAX))
        else:
            kept.append((size_range, size_range.max_bytes))
    return kept, notes


def _resolve_comm_size(tree: object, ranks: int) -> object:
    """`tree` with its comm-size keys decided for `ranks` (csel.c's pruning, right where its search is not: the
    search takes `comm_size<N` as <=, csel.c:1212 at v4.0.2)."""
    if not isinstance(tree, dict):
        return tree
    keys = [key.replace(" ", "") for key in tree]
    if keys and all(key.startswith("comm_size") and key != "comm_size=node_comm_size" for key in keys):
        for key, value in zip(keys, tree.values(), strict=True):
            bound = key.removeprefix("comm_size<=").removeprefix("comm_size<")
            taken = (key == "comm_size=any" or (key == "comm_size=pow2" and not ranks & (ranks - 1))
                     or (key.startswith("comm_size<=") and ranks <= int(bound))
                     or (key.startswith("comm_size<") and not key.startswith("comm_size<=") and ranks < int(bound)))
            if taken:
                return _resolve_comm_size(value, ranks)
        raise RuleFileError(f"no comm-size branch of the built-in tree takes {ranks} ranks")
    return {key: value if key.replace(" ", "").startswith(("algorithm=", "composition="))
            else _resolve_comm_size(value, ranks) for key, value in tree.items()}


def _guarded(algorithm: str, built_in: object) -> dict[str, object]:
    """The container of `algorithm` below the csel keys that test its call-dependent restrictions, the built-in
    subtree on their other side (a call at the tuned comm size that breaks one takes MPICH's own choice)."""
    node: dict[str, object] = {f"algorithm={algorithm}": {}}
    for restriction in reversed(MPICH_RESTRICTIONS.get(algorithm, ())):
        if restriction not in MPICH_GUARDS:
            continue
        runs, other = MPICH_GUARDS[restriction]
        pair = [(runs, node), (other, copy.deepcopy(built_in))]
        node = dict(reversed(pair) if restriction == "size-ge-pof2" else pair)
    return node


def mpich_generic_tree() -> dict[str, object]:
    text = resources.files("tuners").joinpath("data/mpich-4.0.2-mpir-generic.json").read_text()
    tree: dict[str, object] = json.loads(text)
    return tree


def mpich_json_text(results: Sequence[PerSizeResult], evidence: Sequence[str]) -> str:
    """MPICH's built-in tree with the per-size branches spliced in (module docstring). json-c, which
    MPICH parses the file with, takes C comments: the evidence goes in one."""
    tree = mpich_generic_tree()
    notes: list[str] = []
    for result, _ in _with_changes(results, MPICH_COLLECTIVES, "MPICH"):
        problem = mpich_layout_problem(result.ranks, result.nodes)
        if problem is not None:
            raise RuleFileError(f"no MPICH selection file for {result.op}: {problem}")
        collective, size_key, _ = MPICH_COLLECTIVES[result.op]
        built_in = tree[f"collective={collective}"]["comm_type=intra"]  # type: ignore[index]
        at_size = _resolve_comm_size(built_in, result.ranks)  # what MPICH chooses at the measured comm size
        ranges, clipped = mpich_ranges(result)
        notes += clipped
        branch: dict[str, object] = {}
        for size_range, upper in ranges:
            algorithm = mpich_algorithm(size_range, result.op)
            why = mpich_cannot_run(algorithm, result.ranks, result.nodes, size_range.min_bytes)
            if why is not None:
                raise RuleFileError(f"{result.op} [{size_range.min_bytes}, {size_range.max_bytes}] B: MPICH 4.0.2 "
                                    f"cannot run {algorithm} on {result.ranks} ranks / {result.nodes} nodes ({why})")
            if size_range.min_bytes > 0:
                branch[f"{size_key}<{size_range.min_bytes}"] = copy.deepcopy(at_size)
            branch[f"{size_key}<={upper}"] = _guarded(algorithm, at_size)
        branch[f"{size_key}=any"] = copy.deepcopy(at_size)
        tree[f"collective={collective}"]["comm_type=intra"] = {  # type: ignore[index]
            f"comm_size<{result.ranks}": copy.deepcopy(built_in),
            f"comm_size<={result.ranks}": branch,
            "comm_size=any": built_in,
        }
    body = json.dumps(tree, indent=1)
    check_mpich_tree(json.loads(body))
    header = "\n".join([
        "/* MPICH collective selection (MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE); generated by commcamp",
        *_comments(" *", [line.replace("*/", "* /") for line in [*evidence, *notes]]),  # nothing may end it early
        " */",
    ])
    return header + "\n" + body + "\n"


def strip_c_comment(text: str) -> str:
    return re.sub(r"^/\*.*?\*/", "", text, count=1, flags=re.S)


def check_mpich_tree(tree: object, path: str = "top") -> None:
    """Every object on the way to a container is non-empty (csel asserts it)."""
    if not isinstance(tree, dict) or not tree:
        raise RuleFileError(f"{path}: must be a non-empty object")
    for key, value in tree.items():
        if not key.replace(" ", "").startswith(("algorithm=", "composition=")):
            check_mpich_tree(value, f"{path}/{key}")


# ---- not run here --------------------------------------------------------------------------------


def intel_mpi_lines(result: PerSizeResult) -> list[str]:
    """I_MPI_ADJUST_<COLL>=<id>:<min>-<max>[;...] for the ranges whose MPICH algorithm Intel MPI
    shares (NOT run here: no Intel MPI on this machine)."""
    parts = []
    for size_range in _changed(result):
        if size_range.selection is None or size_range.selection.mechanism != "mpi_t" or result.op not in MPICH_COLLECTIVES:
            continue
        try:
            name = mpich_algorithm(size_range, result.op)
        except RuleFileError:
            continue
        if name in INTEL_IDS:
            parts.append(f"{INTEL_IDS[name]}:{size_range.min_bytes}-{size_range.max_bytes}")
    if not parts:
        return []
    coll = "REDUCE_SCATTER_BLOCK" if result.op == "reduce_scatter" else result.op.upper()
    return [f"export I_MPI_ADJUST_{coll}='{';'.join(parts)}'  # Intel MPI, not run here"]
