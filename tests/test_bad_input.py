"""Bad input through the real CLI: every case runs `commcamp ...` as a subprocess and must exit non-zero with a
message naming the problem, and write nothing (no results database, no run directory, no recommendation or
env file; an existing database byte for byte unchanged). The cases run concurrently in one module fixture
(each is a Python start-up of the CLI), then each is judged on its own.

Covered here: malformed and schema-violating YAML (campaign spec, site.yaml, knob override files and a site's
`knobs:`), unknown site / system / environment / check / knob, knob values outside their domain, values with
shell metacharacters, newlines or `$(...)` (campaign env and extra_args, knob overrides, run tag), absurd
message sizes (0, negative, beyond commbench's 1 TiB), node counts above the partition, and truncated or forged
commbench JSON lines on ingest.

The same loaders are also tested in process, message by message: tests/test_campaign_spec.py (spec errors
with file:line), tests/test_site_configs.py (site check), tests/test_tuner_catalog.py (the base catalog file,
shell attacks on every writer), tests/test_store_records.py (record schema), tests/test_store_cli.py (ingest
usage), tests/test_tuning.py (forbidden knob, workers on SQLite, pretune outside an allocation). A size that
passes these checks but exceeds a node's memory fails at run time with commbench's "cannot allocate" error
record (tests/test_commbench.py); tests/test_fuzz_loaders.py throws generated input at the loaders.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from campaigns.store import RunInfo, open_store
from fixtures_store import commbench_record

REPO = Path(__file__).resolve().parents[1]
COMMCAMP = Path(sys.executable).with_name("commcamp")
# The real CLI with campaigns.model.site reading a copy of site_configs/ (the first argument): for broken sites.
CLI_WITH_SITES = ("import sys; from pathlib import Path; import campaigns.model.site as site; "
                  "site.SITE_CONFIGS_DIR = Path(sys.argv.pop(1)); sys.argv[0] = 'commcamp'; "
                  "from campaigns.cli.app import main; main()")

SPEC = """\
name: bad
site: local
environments: [openmpi]
node_counts: [1]
checks:
  - check: commbench_run
    ops: [pingpong]
    sizes: [8, 1024]
"""
SLURM_SPEC = SPEC.replace("site: local", "site: localslurm")
TUNE = ("tune", "--site", "local", "--system", "local:cpu", "--library", "openmpi", "--library-version", "4.1.4",
        "--op", "allreduce", "--executor", "launcher", "--launcher", "mpirun.openmpi -np 2", "--trials", "1",
        "--db", "{db}", "--runs-dir", "{runs}", "--publish-dir", "{rec}")
SIZES = ("--sizes", "64K")
RUN = ("run", "{dir}/spec.yaml", "--db", "{db}", "--runs-dir", "{runs}")
INGEST = ("results", "ingest", "{dir}/records.jsonl", "--site", "local", "--system", "local", "--db", "{db}")
NOT_ALLOWED = "is not allowed: only letters, digits and _ . , : ^ / + = - may appear"


def spec(old: str, new: str, base: str = SPEC) -> dict[str, str]:
    assert old in base, old
    return {"spec.yaml": base.replace(old, new, 1)}


def records(*lines: str) -> dict[str, str]:
    return {"records.jsonl": "".join(line + "\n" for line in lines)}


GOOD_RECORD = json.dumps(commbench_record())


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    expect: tuple[str, ...]
    files: dict[str, str] | None = None
    code: int = 2
    site_edit: tuple[str, str, str] | None = None  # (file under site_configs/, old, new) in a copy


CASES = [
    # campaign spec YAML
    Case("spec-malformed-yaml", RUN, ("invalid campaign spec", "spec.yaml:", "malformed YAML"),
         spec("ops: [pingpong]", "ops: [pingpong")),
    Case("spec-unknown-field", RUN, ("spec.yaml:9: checks[0].itres: unknown field",),
         spec("    sizes: [8, 1024]", "    sizes: [8, 1024]\n    itres: 10")),
    # unknown names
    Case("spec-unknown-site", RUN, ("spec.yaml:2: site", "unknown site 'mars'"), spec("site: local", "site: mars")),
    Case("spec-unknown-system", RUN, ("system 'local' of site 'local' has no partition 'gpu'",),
         spec("site: local", "site: local\nsystem: local:gpu")),
    Case("spec-unknown-environment", RUN, ("'intelmpi' is not an environment of local:local",),
         spec("[openmpi]", "[intelmpi]")),
    Case("spec-unknown-check", RUN, ("checks[0].check: Input should be 'commbench_run'",),
         spec("commbench_run", "commbench_walk")),
    # sizes and node counts
    Case("spec-size-zero", RUN, ("checks[0].sizes[0]: Input should be greater than or equal to 1",),
         spec("[8, 1024]", "[0, 1024]")),
    Case("spec-size-beyond-commbench", RUN, ("checks[0].sizes[1]: Input should be less than or equal to "
                                             "1099511627776",), spec("[8, 1024]", "[8, 2199023255552]")),
    Case("spec-nodes-above-partition", RUN,
         ("node_counts[0]: 4 nodes requested, but partition localslurm:debug of site 'localslurm' has 3",),
         spec("node_counts: [1]", "node_counts: [4]", SLURM_SPEC)),
    # shell metacharacters, newlines, command substitution
    Case("spec-env-command-substitution", RUN, ("checks[0].env: UCX_TLS: value '$(touch pwned)' " + NOT_ALLOWED,),
         spec("    sizes: [8, 1024]", "    sizes: [8, 1024]\n    env: {UCX_TLS: \"$(touch pwned)\"}")),
    Case("spec-env-newline", RUN, ("checks[0].env: UCX_TLS: value 'tcp\\nrm -rf x' " + NOT_ALLOWED,),
         spec("    sizes: [8, 1024]", "    sizes: [8, 1024]\n    env: {UCX_TLS: \"tcp\\nrm -rf x\"}")),
    Case("spec-extra-args-injection", RUN, ("checks[0].extra_args: extra_args: value '--peer;touch pwned' "
                                            + NOT_ALLOWED,),
         spec("    sizes: [8, 1024]", "    sizes: [8, 1024]\n    extra_args: ['--peer;touch pwned']")),
    Case("run-tag-metacharacters", (*RUN, "--tag", "2026;touch pwned"), ("--tag '2026;touch pwned'",
                                                                         "use letters, digits and . _ -"),
         {"spec.yaml": SPEC}),
    # site.yaml (a copy of site_configs/ with one edit)
    Case("site-malformed-yaml", RUN, ("invalid campaign spec", "site_configs/local/site.yaml:", "malformed YAML"),
         {"spec.yaml": SPEC}, site_edit=("local/site.yaml", "environments: [openmpi, mpich]",
                                         "environments: [openmpi, mpich")),
    Case("site-schema-violation", ("site", "check", "local"), ("systems[0].partitions[0].max_jobz: unknown field",),
         code=1, site_edit=("local/site.yaml", "max_jobs: 1", "max_jobz: 1")),
    Case("site-knob-out-of-domain", (*TUNE, *SIZES), ("site_configs/local/site.yaml", "OMPI_MCA_btl_tcp_sndbuf"),
         site_edit=("local/site.yaml", "environments:\n  - name: openmpi",
                    "knobs:\n  defaults: {OMPI_MCA_btl_tcp_sndbuf: 1000}\nenvironments:\n  - name: openmpi")),
    # knob override files (the catalog's site-override format)
    Case("knobs-malformed-yaml", (*TUNE, *SIZES, "--knob-overrides", "{dir}/knobs.yaml"),
         ("knobs.yaml:2: malformed YAML",), {"knobs.yaml": "defaults: {OMPI_MCA_btl_tcp_sndbuf: [4096\n"}),
    Case("knobs-duplicate-key", (*TUNE, *SIZES, "--knob-overrides", "{dir}/knobs.yaml"),
         ("knobs.yaml:2: malformed YAML: duplicate key 'defaults'",),
         {"knobs.yaml": "defaults: {OMPI_MCA_btl_tcp_sndbuf: 4096}\ndefaults: {OMPI_MCA_btl_tcp_rcvbuf: 4096}\n"}),
    Case("knobs-unknown-knob", (*TUNE, *SIZES, "--knob-overrides", "{dir}/knobs.yaml"),
         ("knobs.yaml", "NCCL_NO_SUCH_KNOB"), {"knobs.yaml": "defaults: {NCCL_NO_SUCH_KNOB: 1}\n"}),
    Case("knobs-out-of-domain", (*TUNE, *SIZES, "--knob-overrides", "{dir}/knobs.yaml"),
         ("knobs.yaml", "OMPI_MCA_btl_tcp_sndbuf", "1000"),
         {"knobs.yaml": "defaults: {OMPI_MCA_btl_tcp_sndbuf: 1000}\n"}),
    Case("knobs-not-a-mapping", (*TUNE, *SIZES, "--knob-overrides", "{dir}/knobs.yaml"),
         ("knobs.yaml:1: knobs: expected a mapping of defaults, forbidden, pinned, restrict, documented, unset_equals "
          "and inert_unless_set, not int",),
         {"knobs.yaml": "42\n"}),
    Case("knobs-command-substitution", (*TUNE, *SIZES, "--knob-overrides", "{dir}/knobs.yaml"),
         ("knobs.yaml", "'$(touch pwned)' " + NOT_ALLOWED),
         {"knobs.yaml": "pinned: {OMPI_MCA_btl_tcp_sndbuf: \"$(touch pwned)\"}\n"}),
    Case("knobs-newline", (*TUNE, *SIZES, "--knob-overrides", "{dir}/knobs.yaml"),
         ("knobs.yaml", "'4096\\nexport LD_PRELOAD=x' " + NOT_ALLOWED),
         {"knobs.yaml": "pinned: {OMPI_MCA_btl_tcp_sndbuf: \"4096\\nexport LD_PRELOAD=x\"}\n"}),
    # tune options
    Case("tune-unknown-knob", (*TUNE, *SIZES, "--knobs", "NCCL_NO_SUCH_KNOB"),
         ("NCCL_NO_SUCH_KNOB is not in the knob catalog",)),
    Case("tune-unknown-site", (*TUNE, *SIZES, "--site", "mars"), ("unknown site 'mars'",)),
    Case("tune-unknown-system", (*TUNE, *SIZES, "--system", "local:gpu"),
         ("site 'local' has no system:partition 'local:gpu' (it has: local:cpu)",)),
    Case("tune-unknown-environ", (*TUNE, *SIZES, "--environ", "intelmpi"),
         ("environ 'intelmpi' is not an environment of local:cpu",)),
    Case("tune-nodes-above-partition", (*TUNE, *SIZES, "--site", "localslurm", "--system", "localslurm:debug",
                                        "--nodes", "4"),
         ("4 nodes requested, but partition localslurm:debug of site 'localslurm' has 3",)),
    # the launcher executor too: mpirun would run on this one host, the published scope claim 5 nodes
    Case("tune-nodes-above-local-partition", (*TUNE, *SIZES, "--nodes", "5"),
         ("nodes: 5 nodes requested, but partition local:cpu of site 'local' has 1",)),
    Case("tune-gpus-above-partition", (*TUNE, *SIZES, "--gpus-per-node", "8"),
         ("gpus_per_node: 8 GPUs per node requested, but partition local:cpu of site 'local' has 0",)),
    Case("tune-size-zero", (*TUNE, "--sizes", "0"), ("sizes [0] outside 1 B .. 1 TiB",)),
    Case("tune-size-negative", (*TUNE, "--sizes", "-64K"), ("'-64K' is not a size",)),
    Case("tune-size-ambiguous", (*TUNE, "--sizes", "64K,1MB"), ("'1MB' is ambiguous",)),
    Case("tune-size-beyond-commbench", (*TUNE, "--sizes", "64K,2T"), ("sizes [2199023255552] outside 1 B .. 1 TiB",)),
    Case("tune-bad-budget", (*TUNE, *SIZES, "--budget", "10 parsecs"), ("'10 parsecs' is not a duration",)),
    # outputs checked before any run (the later option wins over TUNE's --publish-dir)
    Case("tune-publish-dir-unwritable", (*TUNE, *SIZES, "--publish-dir", "/proc/commcamp-rec"),
         ("--publish-dir /proc/commcamp-rec: cannot create files in /proc",)),
    Case("tune-runs-dir-under-a-file", (*TUNE, *SIZES, "--runs-dir", "{dir}/notes.txt/runs"),
         ("--runs-dir", "/notes.txt/runs: cannot create files in", "/notes.txt (Not a directory)"), {"notes.txt": "x\n"}),
    Case("tune-summary-in-a-missing-directory", (*TUNE, *SIZES, "--summary", "{dir}/rec/summary.json"),
         ("--summary", "/rec/summary.json: directory", "/rec does not exist")),
    # commbench JSON lines on ingest
    Case("ingest-truncated-line", INGEST, ("records.jsonl:2: not a complete JSON object (truncated line?)",),
         records(GOOD_RECORD, GOOD_RECORD[:200])),
    Case("ingest-forged-sample-count", INGEST, ("records.jsonl:1: samples_us: 3 samples for 8 iterations",),
         records(json.dumps({**commbench_record(), "samples_us": [1.0, 2.0, 3.0]}))),
    Case("ingest-forged-hostnames", INGEST, ("records.jsonl:1: hostnames: 1 hostnames for 4 ranks",),
         records(json.dumps({**commbench_record(), "hostnames": ["n1"]}))),
    Case("ingest-not-commbench", INGEST, ("records.jsonl:1:", "is a required property"),
         records(json.dumps({"hello": "world"}))),
]


@dataclass
class Outcome:
    directory: Path
    returncode: int
    output: str
    db_before: str | None


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


_MIGRATION_LOCK = threading.Lock()


def _run(case: Case, root: Path) -> Outcome:
    directory = root / case.id
    directory.mkdir()
    for name, text in (case.files or {}).items():
        (directory / name).write_text(text)
    if case.argv[:2] == ("results", "ingest"):  # ingest into an existing database: it must stay as it was
        # one at a time: alembic's migration context is process-global, not safe across the pool's threads
        # (two concurrent upgrades failed with KeyError 'script' / a NULL from sqlite3)
        with _MIGRATION_LOCK, open_store(f"sqlite:///{directory / 'results.db'}") as store:
            store.ingest(RunInfo(run_key="earlier", campaign="c", site="s", system="x", partition="p",
                                 environ="e", check_name="commbench", parameters={}, num_nodes=2, num_tasks=4,
                                 status="pass"), [commbench_record()])
    before = _digest(directory / "results.db")
    args = [a.format(dir=directory, db=f"sqlite:///{directory / 'results.db'}", runs=directory / "runs",
                     rec=directory / "rec") for a in case.argv]
    if case.site_edit:
        copy = directory / "site_configs"
        shutil.copytree(REPO / "site_configs", copy, ignore=shutil.ignore_patterns("cluster", "knobs", "__pycache__"))
        name, old, new = case.site_edit
        text = (copy / name).read_text()
        assert old in text, old
        (copy / name).write_text(text.replace(old, new, 1))
        cmd = [sys.executable, "-c", CLI_WITH_SITES, str(copy), *args]
    else:
        cmd = [str(COMMCAMP), *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, cwd=directory,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(directory), "COLUMNS": "400",
                                 "COMMCAMP_DB_URL": f"sqlite:///{directory / 'default.db'}"})
    return Outcome(directory, result.returncode, result.stdout + result.stderr, before)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    root = tmp_path_factory.mktemp("bad-input")
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {case.id: pool.submit(_run, case, root) for case in CASES}
        return {name: future.result() for name, future in futures.items()}


def test_case_ids_are_unique() -> None:
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_refused_and_nothing_is_written(case: Case, outcomes: dict[str, Outcome]) -> None:
    outcome = outcomes[case.id]
    assert outcome.returncode == case.code, outcome.output
    for fragment in case.expect:
        assert fragment in outcome.output, f"{fragment!r} not in:\n{outcome.output}"
    assert "Traceback" not in outcome.output
    directory = outcome.directory
    assert _digest(directory / "results.db") == outcome.db_before  # absent, or byte for byte unchanged
    for written in ("runs", "rec", "default.db", "pwned"):
        assert not (directory / written).exists(), written
