"""Bad input through the real CLI: every case runs `commcamp ...` as a subprocess and must exit non-zero with a
message naming the problem, and write nothing (no results database, no run directory, no recommendation or
env file; an existing database byte for byte unchanged). The cases run concurrently in one module fixture
(each is a Python start-up of the CLI), then each is judged on its own.

Covered here: malformed and schema-violating YAML (campaign spec, site.yaml, knob override files and a site's
`knobs:`), unknown site / system / environment / check / knob, knob values outside their domain, values with
shell metacharacters, newlines or `$(...)` (campaign env and extra_args, knob overrides, run tag), absurd
message sizes (0, negative, beyond commbench's 1 TiB), node counts above the partition, and truncated or forged
commbench JSON lines on ingest; results databases that are in memory, not a commcamp store or at an older schema
(a read-only command writes none of them), filters beyond what the store holds (sizes, run ids, dates), output
files that are `-`, a device, a FIFO, a directory or in a missing directory, malformed health verdicts and
--nominal values, prune's --runs-dir, ingest's counts and run key, tune's seed and workers, `site new` from a site
it cannot copy. The in-process tests at the end cover what a subprocess case cannot set up (a full disk, symlinked
outputs, the site search path, published scopes).

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from campaigns.store import RunInfo, open_store
from fixtures_store import commbench_record
from fixtures_tuner import catalog  # noqa: F401  (a fixture)
from tuners.catalog import KnobCatalog

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


def foreign_database(directory: Path, name: str = "results.db") -> None:
    """`name`: another program's SQLite database (ReFrame's results.db, say), no commcamp table in it."""
    import sqlite3

    with sqlite3.connect(directory / name) as connection:
        connection.execute("CREATE TABLE sessions (uuid TEXT PRIMARY KEY, json_blob TEXT)")
        connection.execute("INSERT INTO sessions VALUES ('s1', '{}')")
    connection.close()


def older_store(directory: Path) -> None:
    """results.db: a commcamp store at its first schema revision (0001), one run in it."""
    import sqlalchemy
    from alembic import command

    from campaigns.store.migrate import alembic_config

    engine = sqlalchemy.create_engine(f"sqlite:///{directory / 'results.db'}")
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0001")
    engine.dispose()


def stored_run(directory: Path) -> None:
    """results.db: a commcamp store holding one run (as an ingest's)."""
    with open_store(f"sqlite:///{directory / 'results.db'}") as store:
        store.ingest(RunInfo(run_key="earlier", campaign="c", site="s", system="x", partition="p", environ="e",
                             check_name="commbench", parameters={}, num_nodes=2, num_tasks=4, status="pass"),
                     [commbench_record()])


def a_fifo(directory: Path) -> None:
    import os

    os.mkfifo(directory / "pipe.csv")


def a_device(path: Path) -> None:
    """A character device like /dev/full (1, 7) at `path`, where a test may lose it (never /dev/full itself: a
    run without the fix, as root, replaced it with a file); a FIFO where this process may not make devices."""
    import os
    import stat

    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    except PermissionError:
        os.mkfifo(path)


def a_symlinked_runs_file(directory: Path) -> None:
    (directory / "runs.txt").write_text("not a directory\n")


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    expect: tuple[str, ...]
    files: dict[str, str] | None = None
    code: int = 2
    site_edit: tuple[str, str, str] | None = None  # (file under site_configs/, old, new) in a copy
    prepare: Callable[[Path], None] | None = None  # makes more files in the case's directory before it runs


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
    # `--site "$SITE"` with SITE unset ran on the spec's site; `--db ""` used the default database
    Case("run-empty-site", (*RUN, "--site", ""), ("--site", "is empty: give a value, or leave the option out"),
         {"spec.yaml": SPEC}),
    Case("run-empty-db", (*RUN, "--db", ""), ("--db", "is empty: give a value"), {"spec.yaml": SPEC}),
    Case("results-empty-db", ("results", "runs", "--db", ""), ("--db", "is empty: give a value",)),
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
         ("system: site 'local' has no system:partition 'local:gpu' (it has: local:cpu)",)),
    Case("tune-unknown-environ", (*TUNE, *SIZES, "--environ", "intelmpi"),
         ("environ: 'intelmpi' is not an environment of local:cpu",)),
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
    # ingest options: nothing replaced by a default, nothing stored
    Case("ingest-negative-num-nodes", (*INGEST, "--num-nodes", "-3", "--allow-duplicate"), ("Invalid value for '--num-nodes'", "greater than or equal to 1"),
         records(GOOD_RECORD)),
    Case("ingest-zero-num-tasks", (*INGEST, "--num-tasks", "0", "--allow-duplicate"), ("Invalid value for '--num-tasks'", "greater than or equal to 1"),
         records(GOOD_RECORD)),
    Case("ingest-empty-run-key", (*INGEST, "--run-key", "", "--allow-duplicate"), ("--run-key", "is empty"), records(GOOD_RECORD)),
    # counts the records contradict: stored as a scale the run never ran at
    Case("ingest-num-nodes-the-records-contradict", (*INGEST, "--num-nodes", "4", "--allow-duplicate"),
         ("--num-nodes 4: the records of", "ran on 2 nodes"), records(GOOD_RECORD)),
    Case("ingest-num-tasks-the-records-contradict", (*INGEST, "--num-tasks", "1", "--allow-duplicate"),
         ("--num-tasks 1: the records of", "ran on 4 ranks"), records(GOOD_RECORD)),
    Case("ingest-in-memory-database", (*INGEST, "--db", "sqlite://"),
         ("sqlite:// is an in-memory SQLite database", "lost when the command ends"), records(GOOD_RECORD)),
    # the results database: in memory, not a commcamp store, an older schema (read-only commands never write it)
    Case("list-in-memory-database", ("results", "list", "--db", "sqlite:///:memory:"),
         ("sqlite:///:memory: is an in-memory SQLite database",)),
    Case("runs-in-memory-database", ("results", "runs", "--db", "sqlite://"), ("is an in-memory SQLite database",)),
    Case("run-in-memory-database", (*RUN, "--db", "sqlite://"), ("is an in-memory SQLite database",),
         {"spec.yaml": SPEC}),
    Case("tune-in-memory-database", (*TUNE, *SIZES, "--db", "sqlite://"),
         ("--db: sqlite:// is an in-memory SQLite database",)),
    Case("list-a-foreign-database", ("results", "list", "--db", "{db}"),
         ("is not a commcamp results store (it has no store_alembic_version table",), prepare=foreign_database),
    Case("runs-an-empty-file", ("results", "runs", "--db", "{db}"), ("is not a commcamp results store",),
         {"results.db": ""}),
    Case("export-a-foreign-database", ("results", "export", "--db", "{db}", "-o", "{dir}/x.csv"),
         ("is not a commcamp results store",), prepare=foreign_database),
    Case("report-a-foreign-database", ("report", "--db", "{db}", "-o", "{dir}/r.html"),
         ("is not a commcamp results store",), prepare=foreign_database),
    Case("run-dry-run-a-foreign-database", (*RUN, "--dry-run"), ("is not a commcamp results store",),
         {"spec.yaml": SPEC}, prepare=foreign_database),
    # a command that writes refuses another program's SQLite file too (it added commcamp's or Optuna's tables there)
    # (ingest's results.db holds a store already: the other program's file beside it)
    Case("ingest-into-a-foreign-database", (*INGEST[:-1], "sqlite:///{dir}/reframe.db"),
         ("reframe.db is another program's SQLite database (tables sessions; no commcamp results store or Optuna "
          "study in it)",), records(GOOD_RECORD), prepare=lambda d: foreign_database(d, "reframe.db")),
    Case("run-into-a-foreign-database", RUN, ("is another program's SQLite database (tables sessions",),
         {"spec.yaml": SPEC}, prepare=foreign_database),
    Case("tune-into-a-foreign-database", (*TUNE, *SIZES),
         ("cannot use the study storage sqlite:///", "is another program's SQLite database (tables sessions"),
         prepare=foreign_database),
    Case("list-an-older-store", ("results", "list", "--db", "{db}"),
         ("has schema revision '0001', older than this commcamp's", "upgrades it in place"), prepare=older_store),
    Case("prune-a-database-that-does-not-exist",
         ("results", "prune", "--keep-days", "0", "--yes", "--runs-dir", "{dir}/old", "--db", "{db}"),
         ("no results database at",), prepare=lambda d: (d / "old" / "smoke-20260101T000000Z").mkdir(parents=True)),
    # filters: sizes, ids and dates beyond what the store can hold
    Case("list-huge-size", ("results", "list", "--size", "99999999T", "--db", "{db}"),
         ("Invalid value for --size: '99999999T' is", "B, above 1 TiB"), prepare=stored_run),
    Case("list-huge-run-id", ("results", "list", "--run-id", "99999999999999999999", "--db", "{db}"),
         ("Invalid value for '--run-id'", "less than or equal to 9223372036854775807"), prepare=stored_run),
    Case("report-huge-max-size", ("report", "--max-size", "99999999T", "--db", "{db}", "-o", "{dir}/r.html"),
         ("--max-size", "above 1 TiB"), prepare=stored_run),
    Case("export-huge-min-size", ("results", "export", "--min-size", "99999999T", "--db", "{db}", "-o", "{dir}/x.csv"),
         ("--min-size", "above 1 TiB"), prepare=stored_run),
    Case("list-since-year-one", ("results", "list", "--since", "0001-01-01", "--db", "{db}"),
         ("--since", "'0001-01-01' is outside the dates that can be compared"), prepare=stored_run),
    Case("runs-until-the-last-day", ("results", "runs", "--until", "9999-12-31", "--db", "{db}"),
         ("--until", "'9999-12-31' is outside the dates"), prepare=stored_run),
    Case("list-negative-limit", ("results", "list", "--limit", "-5", "--db", "{db}"),
         ("Invalid value for '--limit'", "greater than or equal to 0"), prepare=stored_run),
    # report's own options
    Case("report-nominal-not-a-number", ("report", "--nominal", "x=1.2.3", "--db", "{db}", "-o", "{dir}/r.html"),
         ("--nominal", "'x=1.2.3' is not LABEL=GBPS (the bandwidth must be a number"), prepare=stored_run),
    Case("report-nominal-infinite", ("report", "--nominal", "x=inf", "--db", "{db}", "-o", "{dir}/r.html"),
         ("--nominal", "'x=inf' is not LABEL=GBPS",), prepare=stored_run),
    Case("report-nominal-zero", ("report", "--nominal", "x=0", "--db", "{db}", "-o", "{dir}/r.html"),
         ("'x=0' is not LABEL=GBPS",), prepare=stored_run),
    Case("report-verdict-wrong-types", ("report", "--verdict", "{dir}/v.json", "--db", "{db}", "-o", "{dir}/r.html"),
         ("v.json is not a commcamp health verdict: campaign: Input should be a valid string",),
         {"v.json": json.dumps({"campaign": 1, "status": 2, "metrics": 3, "nodes": 4})}, prepare=stored_run),
    Case("report-verdict-no-tag", ("report", "--verdict", "{dir}/v.json", "--db", "{db}", "-o", "{dir}/r.html"),
         ("v.json is not a commcamp health verdict: tag: Field required",),
         {"v.json": json.dumps({"campaign": "c", "status": "ok", "metrics": [], "nodes": {}})}, prepare=stored_run),
    Case("report-verdict-nodes-a-list", ("report", "--verdict", "{dir}/v.json", "--db", "{db}", "-o", "{dir}/r.html"),
         ("v.json is not a commcamp health verdict: nodes: Input should be a valid dictionary",),
         {"v.json": json.dumps({"campaign": "c", "tag": "t", "status": "ok", "metrics": [], "nodes": []})},
         prepare=stored_run),
    Case("report-verdict-metric-a-string",
         ("report", "--verdict", "{dir}/v.json", "--db", "{db}", "-o", "{dir}/r.html"),
         ("v.json is not a commcamp health verdict: metrics.0: Input should be a valid dictionary",),
         {"v.json": json.dumps({"campaign": "c", "tag": "t", "status": "ok", "metrics": ["a"], "nodes": {}})},
         prepare=stored_run),
    # output files, checked before the work: standard output, a device, a FIFO, a directory, a missing directory
    Case("report-output-stdout", ("report", "--db", "{db}", "-o", "-"),
         ("-o/--output -: give a file name (this command does not write to standard output)",), prepare=stored_run),
    Case("export-output-stdout", ("results", "export", "--format", "csv", "--db", "{db}", "-o", "-"),
         ("-o/--output -: give a file name",), prepare=stored_run),
    Case("export-output-a-device", ("results", "export", "--db", "{db}", "-o", "{dir}/full", "--format", "csv"),
         ("-o/--output", "/full: exists and is not a regular file",),
         prepare=lambda d: (stored_run(d), a_device(d / "full"))),
    Case("report-output-a-fifo", ("report", "--db", "{db}", "-o", "{dir}/pipe.csv"),
         ("pipe.csv: exists and is not a regular file",), prepare=lambda d: (stored_run(d), a_fifo(d))),
    Case("report-output-a-directory", ("report", "--db", "{db}", "-o", "{dir}"), ("-o/--output", ": is a directory"),
         prepare=stored_run),
    Case("report-output-in-a-missing-directory", ("report", "--db", "{db}", "-o", "{dir}/nodir/r.html"),
         ("-o/--output", "/nodir/r.html: directory", "/nodir does not exist"), prepare=stored_run),
    Case("export-output-unwritable", ("results", "export", "--db", "{db}", "-o", "/proc/x.csv"),
         ("-o/--output /proc/x.csv: cannot create files in /proc",), prepare=stored_run),
    Case("run-report-a-device", (*RUN, "--report", "{dir}/full"), ("--report", "/full: exists and is not a regular",),
         {"spec.yaml": SPEC.replace("name: bad", "name: bad\nkind: characterize")},
         prepare=lambda d: a_device(d / "full")),
    # prune's runs directory
    Case("prune-runs-dir-missing", ("results", "prune", "--keep-days", "1", "--runs-dir", "{dir}/nowhere",
                                    "--db", "{db}"), ("--runs-dir", "nowhere: no such directory"),
         prepare=stored_run),
    Case("prune-runs-dir-a-file", ("results", "prune", "--keep-days", "1", "--runs-dir", "{dir}/runs.txt",
                                   "--db", "{db}"), ("--runs-dir", "runs.txt: not a directory"),
         prepare=lambda d: (stored_run(d), a_symlinked_runs_file(d))),
    # run: a dry run checks --runs-dir as the run does; an empty --workspace is no directory
    Case("run-dry-run-runs-dir-a-file", (*RUN[:-1], "{dir}/spec.yaml", "--dry-run"),
         ("--runs-dir: cannot write run directories under", "spec.yaml"), {"spec.yaml": SPEC}),
    Case("workspace-empty", ("--workspace", "", *RUN), ("--workspace", "is empty: give a directory"),
         {"spec.yaml": SPEC}),
    # tune: the seed's range, the workers' count
    Case("tune-negative-seed", (*TUNE, *SIZES, "--seed", "-1"),
         ("Invalid value for '--seed'", "greater than or equal to 0")),
    Case("tune-seed-beyond-32-bits-in-the-spec", ("tune", "{dir}/tune.yaml", "--db", "{db}", "--runs-dir", "{runs}",
                                                  "--publish-dir", "{rec}"),
         ("tune.yaml:9: seed: Input should be less than or equal to 4294967295",),
         {"tune.yaml": "site: local\nsystem: local:cpu\nlibrary: openmpi\nlibrary_version: 4.1.4\nop: allreduce\n"
                       "executor: launcher\nlauncher: [mpirun.openmpi, -np, '2']\nsizes: [65536]\nseed: 4294967296\n"}),
    Case("tune-negative-workers", (*TUNE, *SIZES, "--workers", "-1"),
         ("Invalid value for '--workers'", "greater than or equal to 0")),
    # site new from a site it cannot copy
    Case("site-new-from-a-site-without-env-sh", ("site", "new", "fresh", "--from", "broken", "--dir", "{dir}/sites"),
         ("--from broken:", "env.sh is missing", "nothing written"),
         prepare=lambda d: _broken_site(d, "env.sh", None)),
    Case("site-new-from-a-site-yaml-not-utf8", ("site", "new", "fresh", "--from", "broken", "--dir", "{dir}/sites"),
         ("--from broken:", "site.yaml is not UTF-8 text", "nothing written"),
         prepare=lambda d: _broken_site(d, "site.yaml", b"name: broken\n\xff\xfe\n")),
]


def _broken_site(directory: Path, name: str, content: bytes | None) -> None:
    """A copy of site local in <dir>/path/broken ($COMMCAMP_SITE_PATH, see _run) with `name` removed (None) or
    replaced."""
    broken = directory / "path" / "broken"
    shutil.copytree(REPO / "site_configs" / "local", broken)
    (broken / "site.yaml").write_text((broken / "site.yaml").read_text().replace("name: local", "name: broken", 1))
    if content is None:
        (broken / name).unlink()
    else:
        (broken / name).write_bytes(content)


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
    if case.prepare is not None:
        with _MIGRATION_LOCK:  # alembic's context is process-global (above)
            case.prepare(directory)
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
                                 "COMMCAMP_DB_URL": f"sqlite:///{directory / 'default.db'}",
                                 "COMMCAMP_SITE_PATH": str(directory / "path")})
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
    for written in ("runs", "rec", "default.db", "pwned", "sites"):
        assert not (directory / written).exists(), written


# In process (typer's CliRunner, or the functions themselves): what the subprocess cases above cannot set up.

def test_outputs_follow_a_symlink_and_never_replace_a_special_file(tmp_path: Path) -> None:
    """write_atomic (report, verdicts, env files, publish) replaced a symbolic link by a regular file and /dev/full
    by a file of text: a link's file is replaced atomically in its own directory, the link kept; a device, FIFO or
    directory is refused (OSError naming the path), nothing written."""
    import os

    from tuners.writers import write_atomic

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "report.html").write_text("old\n")
    link = tmp_path / "link.html"
    link.symlink_to(elsewhere / "report.html")
    write_atomic(link, "new\n")
    assert link.is_symlink() and (elsewhere / "report.html").read_text() == "new\n"
    dangling = tmp_path / "dangling.html"
    dangling.symlink_to(elsewhere / "later.html")
    write_atomic(dangling, "made\n")
    assert dangling.is_symlink() and (elsewhere / "later.html").read_text() == "made\n"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["later.html", "report.html"]  # no temp file left

    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "dir").mkdir()
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    a_device(tmp_path / "full")  # as /dev/full (never that one: a run without the fix, as root, replaced it)
    for target, why in ((tmp_path / "full", "not a regular file"), (tmp_path / "pipe", "not a regular file"),
                        (tmp_path / "dir", "is a directory"), (loop, "a loop")):
        with pytest.raises(OSError, match=why) as raised:
            write_atomic(target, "text\n")
        assert raised.value.filename == str(target)
    assert not (tmp_path / "full").is_file() and (tmp_path / "pipe").is_fifo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.html", "dir", "elsewhere", "full", "link.html",
                                                          "loop", "pipe"]


def test_report_and_export_write_through_a_symlink(tmp_path: Path) -> None:
    from fixtures_cli import commcamp

    stored_run(tmp_path)
    db = f"sqlite:///{tmp_path / 'results.db'}"
    target = tmp_path / "kept" / "results.csv"
    target.parent.mkdir()
    target.write_text("previous\n")
    (tmp_path / "link.csv").symlink_to(target)
    code, out, err = commcamp("results", "export", "--db", db, "-o", tmp_path / "link.csv")
    assert code == 0, err
    assert (tmp_path / "link.csv").is_symlink() and target.read_text().startswith("measurement_id,")
    (tmp_path / "r.html").symlink_to(target.parent / "report.html")
    code, out, err = commcamp("report", "--db", db, "-o", tmp_path / "r.html")
    assert code == 0, err
    assert (tmp_path / "r.html").is_symlink() and (target.parent / "report.html").read_text().startswith("<!DOCTYPE")


def test_no_output_replaces_the_results_database(tmp_path: Path) -> None:
    """`report -o`, `results export -o` and `run --verdict` naming the results database (or its -wal file) replaced
    it whole, exit 0: every run and sample lost. Refused before any work (exit 2 naming the option); the store
    reads as before."""
    from fixtures_cli import commcamp

    stored_run(tmp_path)
    path = tmp_path / "results.db"
    db = f"sqlite:///{path}"
    (tmp_path / "results.db-wal").write_bytes(b"")
    before = path.read_bytes()
    from test_campaign_kinds import HEALTH_SPEC

    spec = tmp_path / "health.yaml"
    spec.write_text(HEALTH_SPEC)
    for args, option in ((("report", "--db", db, "-o", path), "-o/--output"),
                         (("results", "export", "--db", db, "-o", path, "--format", "csv"), "-o/--output"),
                         (("results", "export", "--db", db, "-o", f"{path}-wal", "--format", "csv"), "-o/--output"),
                         (("run", spec, "--db", db, "--dry-run", "--verdict", path), "--verdict")):
        code, out, err = commcamp(*args)
        assert code == 2 and option in err and "SQLite database" in err, (args, out + err)
    assert path.read_bytes() == before
    code, out, err = commcamp("results", "runs", "--db", db)
    assert code == 0, err
    from tuners.writers import write_target

    for companion in ("-shm", "-journal"):
        with pytest.raises(OSError, match="belongs to the SQLite database results.db"):
            write_target(tmp_path / f"results.db{companion}")
    assert write_target(tmp_path / "-wal") == tmp_path / "-wal"  # a file of that name alone is no companion


def test_read_only_commands_write_nothing_into_a_store_and_a_dry_run_reads_one(tmp_path: Path) -> None:
    """A read-only open (results list/runs/export, report, run --dry-run) switched a store to WAL and migrated
    whatever database it was given; it now reads a sound store as it is, byte for byte."""
    from fixtures_cli import commcamp

    stored_run(tmp_path)
    store = tmp_path / "results.db"
    db = f"sqlite:///{store}"
    with sqlite3_connection(store) as connection:
        connection.execute("PRAGMA journal_mode = DELETE")  # as on a network filesystem: a read must not change it
    before = _digest(store)
    for args in (("results", "runs"), ("results", "list"), ("report", "-o", tmp_path / "r.html")):
        code, _, err = commcamp(*args, "--db", db)
        assert code == 0, err
    (tmp_path / "spec.yaml").write_text(SPEC)
    code, out, err = commcamp("run", tmp_path / "spec.yaml", "--db", db, "--dry-run", "--runs-dir", tmp_path / "rd")
    assert code == 0, err
    assert f"{tmp_path / 'rd'}/bad-<time>/rfm-1" in out.replace("\n", "")  # the plan shows --runs-dir
    assert _digest(store) == before and not (tmp_path / "rd").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "results.db", "spec.yaml"]


def sqlite3_connection(path: Path):  # noqa: ANN201  (a context manager that also closes)
    import contextlib
    import sqlite3

    return contextlib.closing(sqlite3.connect(path, isolation_level=None))


def test_pretune_refuses_standard_output_as_its_env_file(tmp_path: Path) -> None:
    from fixtures_cli import commcamp

    code, _, err = commcamp("pretune", "--budget", "1m", "--env-file", "-", "--site", "local", "--system", "local:cpu",
                            "--library", "openmpi", "--library-version", "4.1.4", "--op", "allreduce", "--sizes", "64K",
                            "--db", f"sqlite:///{tmp_path / 'tune.db'}", "--runs-dir", tmp_path / "runs",
                            env={"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1"})
    assert code == 2 and "--env-file -: give a file name" in err, err
    assert list(tmp_path.iterdir()) == []


def test_site_check_all_lists_only_sites_a_command_can_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A directory mysite.bak with a site.yaml was listed, and `site check --all` crashed on it (SiteError
    traceback: "unknown site 'mysite.bak'; known sites: ..., mysite.bak"); so was a directory whose site.yaml is a
    directory. Only names a command takes, with a site.yaml file, are sites."""
    import campaigns.model.site as site_model
    from fixtures_cli import commcamp

    shipped = tmp_path / "shipped"
    shutil.copytree(REPO / "site_configs" / "local", shipped / "local")
    shutil.copytree(REPO / "site_configs" / "local", tmp_path / "path" / "mysite.bak")
    (tmp_path / "path" / "odd" / "site.yaml").mkdir(parents=True)
    monkeypatch.setattr(site_model, "SITE_CONFIGS_DIR", shipped)
    monkeypatch.setenv("COMMCAMP_SITE_PATH", str(tmp_path / "path"))
    assert site_model.available_sites() == ["local"]
    code, out, err = commcamp("site", "check", "--all")
    assert code == 0 and out.strip() == "site local: ok", (out, err)


def test_site_new_on_a_full_disk_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import errno

    from fixtures_cli import commcamp

    written = Path.write_text

    def full_disk(self: Path, *args: object, **kwargs: object) -> int:
        if self.name == "env.sh":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return written(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", full_disk)
    code, _, err = commcamp("site", "new", "fresh", "--from", "local", "--dir", tmp_path / "sites")
    assert code == 1 and "cannot write the new site in" in err and "No space left on device" in err, err
    assert "nothing was left behind" in err and list(tmp_path.iterdir()) == []


def test_plugin_install_checks_its_prefix_before_building(tmp_path: Path) -> None:
    from fixtures_cli import commcamp

    prefix = tmp_path / "prefix"
    prefix.write_text("a file\n")
    code, _, err = commcamp("plugin", "install", "--prefix", prefix, "--build-dir", tmp_path / "build")
    assert code == 2 and f"--prefix {prefix}: {prefix} is not a directory" in err, err
    assert not (tmp_path / "build").exists()  # refused before the build


def test_workspace_that_is_a_file_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from fixtures_cli import commcamp

    monkeypatch.delenv("COMMCAMP_HOME", raising=False)  # the CLI sets it: undone after the test
    (tmp_path / "ws").write_text("x\n")
    code, _, err = commcamp("--workspace", tmp_path / "ws", "paths")
    assert code == 2 and "--workspace" in err and "is not a directory" in err, err
    assert "COMMCAMP_HOME" not in __import__("os").environ


def test_recommend_names_how_to_select_a_scope_published_without_ranks_per_node(
        tmp_path: Path, catalog: KnobCatalog) -> None:  # noqa: F811
    """A scope published before scopes named their ranks per node (tasks_per_node None) beside one of 2: recommend
    said `Say which: --tasks-per-node None or 2`, and no option selects None. Leaving --tasks-per-node out now
    selects the scope without one, and says that the other is published; --tasks-per-node 2 selects that one."""
    from fixtures_cli import commcamp
    from test_tuner_writers import LOCAL_JOB, local_recommendation

    from tuners.writers import load_recommendations, publish

    local = local_recommendation()
    legacy, two = (local.model_copy(update={"scope": local.scope.model_copy(update={"tasks_per_node": tpn})})
                   for tpn in (None, 2))
    for rec in (two, legacy):  # in this order both stay (a newer scope of 2 replaces one without ranks per node)
        publish(tmp_path, rec, catalog)
    assert len(load_recommendations(tmp_path / "local" / "local" / "recommendations.yaml").recommendations) == 2
    code, stdout, stderr = commcamp("recommend", "--root", tmp_path, *LOCAL_JOB)
    assert code == 0 and "None" not in stdout, (stdout, stderr)
    assert "a scope published without ranks per node, chosen as --tasks-per-node was not given (scopes of " \
           "--tasks-per-node 2 are published too: give it for one)" in stdout
    code, stdout, stderr = commcamp("recommend", "--root", tmp_path, *LOCAL_JOB, "--tasks-per-node", "2")
    assert code == 0 and "without ranks per node" not in stdout, (stdout, stderr)
    # a scope of another library version is no older twin of the one without ranks per node: say which (it
    # answered with the 4.1.4 scope's settings for a job on 5.0.5, exit 0)
    newer = local.model_copy(update={"scope": local.scope.model_copy(update={"tasks_per_node": 4,
                                                                            "library_version": "5.0.5"})})
    publish(tmp_path, newer, catalog)
    code, stdout, stderr = commcamp("recommend", "--root", tmp_path, *LOCAL_JOB)
    assert code == 3 and "Say which: --library-version 4.1.4 or 5.0.5" in stdout + stderr, (stdout, stderr)


def test_recommend_refuses_a_system_of_several_partitions_without_one(tmp_path: Path) -> None:
    """`--system borealis` with partitions batch and debug printed batch's settings, exit 0: a job on debug got them.
    tune refused it; recommend does too, naming system:partition."""
    import copy
    import shutil

    import yaml
    from fixtures_cli import commcamp

    shutil.copytree(REPO / "site_configs" / "local", tmp_path / "sites" / "two")
    site_yaml = tmp_path / "sites" / "two" / "site.yaml"
    data = yaml.safe_load(site_yaml.read_text())
    data["name"] = "two"
    partitions = data["systems"][0]["partitions"]
    partitions.append({**copy.deepcopy(partitions[0]), "name": "debug"})
    site_yaml.write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "rec").mkdir()
    code, stdout, stderr = commcamp("recommend", "--root", tmp_path / "rec", "--site", "two", "--system", "local",
                                    "--op", "allreduce", "--nodes", "1", env={"COMMCAMP_SITE_PATH": str(tmp_path / "sites")})
    assert code == 2 and "--system local has several partitions (cpu, debug): give system:partition (--system " \
        "local:cpu)" in " ".join((stdout + stderr).split()), stdout + stderr
    code, stdout, stderr = commcamp("recommend", "--root", tmp_path / "rec", "--site", "two", "--system", "local:debug",
                                    "--op", "allreduce", "--nodes", "1", env={"COMMCAMP_SITE_PATH": str(tmp_path / "sites")})
    assert code == 3, stdout + stderr  # nothing measured there: said, not refused


def test_standard_output_on_a_full_disk_is_said_in_one_line(tmp_path: Path) -> None:
    """`commcamp recommend ... > /dev/full` printed a traceback (OSError: [Errno 28]); one line, exit 1."""
    import subprocess

    (tmp_path / "rec").mkdir()
    with open("/dev/full", "w") as full:
        done = subprocess.run([str(COMMCAMP), "recommend", "--site", "local", "--system", "local:cpu", "--op",
                               "allreduce", "--nodes", "1", "--root", str(tmp_path / "rec")], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    assert done.returncode == 1 and done.stderr.strip() == "commcamp: a write failed: No space left on device", \
        done.stderr
