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
range get the range's algorithm, every other size falls through to the built-in subtree.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from importlib import resources

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


def mpich_algorithm(size_range: SizeRange, op: str) -> str:
    selection = size_range.selection
    assert selection is not None
    prefix = MPICH_COLLECTIVES[op][2]
    # MPI_T's enum names the algorithm without its prefix; "nb" is the container MPIR_<Coll>_allcomm_nb.
    name = prefix.replace("_intra_", "_allcomm_nb") if selection.name == "nb" else prefix + selection.name
    if selection.mechanism != "mpi_t" or name not in MPICH_ALGORITHMS:
        raise RuleFileError(f"{op} selection {selection.name!r} is not an MPICH 4.0.2 {prefix}* algorithm")
    return name


def mpich_generic_tree() -> dict[str, object]:
    text = resources.files("tuners").joinpath("data/mpich-4.0.2-mpir-generic.json").read_text()
    tree: dict[str, object] = json.loads(text)
    return tree


def mpich_json_text(results: Sequence[PerSizeResult], evidence: Sequence[str]) -> str:
    """MPICH's built-in tree with the per-size branches spliced in (module docstring). json-c, which
    MPICH parses the file with, takes C comments: the evidence goes in one."""
    tree = mpich_generic_tree()
    for result, changed in _with_changes(results, MPICH_COLLECTIVES, "MPICH"):
        collective, size_key, _ = MPICH_COLLECTIVES[result.op]
        built_in = tree[f"collective={collective}"]["comm_type=intra"]  # type: ignore[index]
        branch: dict[str, object] = {}
        for size_range in changed:
            if size_range.min_bytes > 0:
                branch[f"{size_key}<{size_range.min_bytes}"] = copy.deepcopy(built_in)
            branch[f"{size_key}<={size_range.max_bytes}"] = {f"algorithm={mpich_algorithm(size_range, result.op)}": {}}
        branch[f"{size_key}=any"] = copy.deepcopy(built_in)
        tree[f"collective={collective}"]["comm_type=intra"] = {  # type: ignore[index]
            f"comm_size<{result.ranks}": copy.deepcopy(built_in),
            f"comm_size<={result.ranks}": branch,
            "comm_size=any": built_in,
        }
    body = json.dumps(tree, indent=1)
    check_mpich_tree(json.loads(body))
    header = "\n".join([
        "/* MPICH collective selection (MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE); generated by commcamp",
        *_comments(" *", [line.replace("*/", "* /") for line in evidence]),  # nothing may end the comment early
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
