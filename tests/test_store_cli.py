"""`commcamp results ...` (campaigns/cli/results.py) on a real SQLite store, through typer's test runner."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pandas
import pytest
import typer
from fixtures_store import commbench_record, error_record, write_jsonl
from typer.testing import CliRunner, Result

from campaigns.cli.results import human_size, register
from campaigns.store import open_store


def _invoke(*args: str) -> Result:
    app = typer.Typer()

    @app.callback()
    def main() -> None:  # a group, as in campaigns/cli/app.py, so that `results` is a subcommand
        """commcamp"""

    register(app)
    return CliRunner(env={"COLUMNS": "250"}).invoke(app, ["results", *map(str, args)])


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "site-run.jsonl", [
        commbench_record(op="allreduce", size=1024, seed=1),
        commbench_record(op="allreduce", size=1 << 20, seed=2),
        commbench_record(op="pingpong", size=8, seed=3, transport="mpi-p2p"),
        error_record()])


def _ingest(jsonl: Path, store_url: str, *extra: str) -> Result:
    return _invoke("ingest", jsonl, "--site", "localslurm", "--system", "localslurm", "--db", store_url, *extra)


def test_ingest_then_list(jsonl: Path, store_url: str) -> None:
    result = _ingest(jsonl, store_url, "--param", "nodes=2", "--job-id", "77")
    assert result.exit_code == 0, result.output
    assert "stored run 1" in result.output and "4 measurements" in result.output
    with open_store(store_url) as store:
        [run] = store.runs()
        assert (run.site, run.system, run.campaign, run.status, run.job_id, run.parameters) == (
            "localslurm", "localslurm", "manual", "fail", "77", {"nodes": "2"})
        assert run.reason == "1 of 4 records not valid"
        assert (run.num_nodes, run.num_tasks) == (2, 4)
        assert run.run_key.startswith("manual:")

    listed = _invoke("list", "--db", store_url)
    assert listed.exit_code == 0, listed.output
    assert "1 KiB" in listed.output and "1 MiB" in listed.output and "8 B" in listed.output
    assert "no (timeout)" in listed.output
    filtered = _invoke("list", "--db", store_url, "--op", "allreduce", "--min-size", "4K")
    assert "1 MiB" in filtered.output and "1 KiB" not in filtered.output
    limited = _invoke("list", "--db", store_url, "--limit", "2")
    assert "showing 2 of 4" in limited.output

    runs = _invoke("runs", "--db", store_url, "--status", "fail")
    assert runs.exit_code == 0 and "localslurm" in runs.output and "localslurm:debug" in runs.output
    assert "localslurm" not in _invoke("runs", "--db", store_url, "--status", "pass").output
    typo = _invoke("runs", "--db", store_url, "--campaign", "smok")  # was an empty table, exit 0
    assert typo.exit_code == 2 and 'no runs in' in typo.output and '{"campaign": "smok"}' in typo.output
    none_failed = _invoke("runs", "--db", store_url, "--site", "localslurm", "--status", "pass", "--format", "json")
    assert none_failed.exit_code == 0 and none_failed.output.strip() == "[]"  # an answer, not a typo


def test_ingest_twice_needs_replace(jsonl: Path, store_url: str) -> None:
    assert _ingest(jsonl, store_url).exit_code == 0
    again = _ingest(jsonl, store_url, "--run-key", "another-key")  # the same records: not stored twice
    assert again.exit_code == 0, again.output
    assert "skipped: the records of" in again.output and "already stored as run 1" in again.output
    copy = jsonl.with_name("copy.jsonl")
    shutil.copy(jsonl, copy)
    assert "skipped" in _ingest(copy, store_url).output  # found by content, not by file name
    same_key = _invoke("ingest", jsonl, "--site", "local", "--system", "local", "--db", store_url, "--run-key",
                       (run_key := _only_run(store_url).run_key), "--replace", "--status", "pass")
    assert same_key.exit_code == 0 and run_key in same_key.output, same_key.output
    with open_store(store_url) as store:
        [run] = store.runs()
    assert (run.site, run.status) == ("local", "pass")
    clash = _invoke("ingest", write_jsonl(jsonl.with_name("other.jsonl"), [commbench_record(seed=9)]), "--site",
                    "local", "--system", "local", "--db", store_url, "--run-key", run_key)
    assert clash.exit_code == 2  # bad input, as the exit code table says (it was 1)
    assert "is stored under it; --replace" in clash.output and "Traceback" not in clash.output
    replaced = _ingest(jsonl, store_url, "--replace", "--status", "pass")
    assert replaced.exit_code == 0, replaced.output
    with open_store(store_url) as store:
        assert [run.status for run in store.runs()] == ["pass"]
    # Test data may repeat records on purpose (another key).
    duplicate = _ingest(copy, store_url, "--run-key", "again", "--allow-duplicate")
    assert duplicate.exit_code == 0 and "stored run" in duplicate.output, duplicate.output
    with open_store(store_url) as store:
        assert [run.run_key for run in store.runs()][1:] == ["again"]


def test_ingest_never_replaces_a_campaign_s_test_case(jsonl: Path, store_url: str) -> None:
    """`--replace --run-key` of a key `commcamp run` stored deleted the case's passed runs and put the file's
    records, of other ops and another environment, under it: the campaign then skipped the case as stored. Without
    --replace, a key of that shape not stored yet made a later run skip a case never measured."""
    from campaigns.store import RunInfo

    key = "smoke/local/local:cpu/openmpi/commbench_run/allreduce/mpi/1n/ec53be2d7af90f60~72c20f318b"
    with open_store(store_url) as store:
        for seed in (1, 2):  # two passed runs (the second by --force)
            store.ingest(RunInfo(run_key=key, campaign="smoke", site="local", system="local", partition="cpu",
                                 environ="openmpi", check_name="commbench_run", parameters={}, num_nodes=1,
                                 num_tasks=2, status="pass"), [commbench_record(op="allreduce", seed=seed)],
                         new_attempt=True)
    result = _invoke("ingest", jsonl, "--site", "local", "--system", "local", "--db", store_url, "--run-key", key,
                     "--replace", "--allow-duplicate")
    assert result.exit_code == 2 and "has the shape of a campaign's test case key" in result.output, result.output
    with open_store(store_url) as store:
        assert [(run.campaign, run.status) for run in store.runs(run_key=key)] == [("smoke", "pass")] * 2
    later = key.replace("openmpi", "mpich")  # a case of the same campaign no run stored yet
    result = _invoke("ingest", jsonl, "--site", "local", "--system", "local", "--db", store_url, "--run-key", later,
                     "--allow-duplicate")
    assert result.exit_code == 2 and "has the shape of a campaign's test case key" in result.output, result.output
    with open_store(store_url) as store:
        assert store.runs(run_key=later) == []
    # a descriptive key with a colon and six parts is no case key (the shape matched it once)
    mine = "ref/alps/daint:normal/PrgEnv-gnu/nccl-tests/run1"
    result = _invoke("ingest", jsonl, "--site", "local", "--system", "local", "--db", store_url, "--run-key", mine,
                     "--allow-duplicate")
    assert result.exit_code == 0, result.output
    from campaigns.model.spec import CASE_KEY, load_campaign  # every key a campaign makes has the shape

    smoke = load_campaign(Path(__file__).resolve().parents[1] / "campaigns" / "smoke.yaml")
    assert all(CASE_KEY.match(case.run_key) for tag in (None, "n1") for case in smoke.cases(tag))


def _only_run(store_url: str) -> Any:
    with open_store(store_url) as store:
        [run] = store.runs()
    return run


@pytest.mark.parametrize(("where", "message"), [
    (("--site", "nosuchsite", "--system", "x"), "--site: unknown site 'nosuchsite'; known sites:"),
    (("--site", "local", "--system", "nosuchsystem"), "--system: site 'local' has no system 'nosuchsystem' (it has: "
                                                       "local)"),
    # a made-up partition (before: "default" whatever the site) joins no health series and no report's system
    (("--site", "local", "--system", "local", "--partition", "gpu"),
     "--partition: system 'local' of site 'local' has no partition 'gpu' (it has: cpu)"),
    (("--site", "local", "--system", "local:gpu"),  # tune's and recommend's form of a partition
     "--partition: system 'local' of site 'local' has no partition 'gpu' (it has: cpu)"),
    (("--site", "local", "--system", "local:cpu", "--partition", "gpu"),
     "--system names partition 'cpu', --partition 'gpu': give one")])
def test_ingest_names_an_unknown_site_or_system(jsonl: Path, store_url: str, where: tuple[str, ...],
                                                message: str) -> None:
    result = _invoke("ingest", jsonl, *where, "--db", store_url)
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
    with open_store(store_url) as store:
        assert store.runs() == []


def test_ingest_takes_system_colon_partition_and_names_a_missing_file_first(jsonl: Path, store_url: str,
                                                                            tmp_path: Path) -> None:
    """`--system local:cpu` (as tune and recommend take it) was "site 'local' has no system 'local:cpu'", and a
    missing file or a mistyped --format got that same message."""
    result = _invoke("ingest", tmp_path / "nosuch.jsonl", "--site", "local", "--system", "local:cpu", "--db", store_url)
    assert result.exit_code == 2 and "nosuch.jsonl" in result.output and "--system" not in result.output, result.output
    result = _invoke("ingest", jsonl, "--site", "local", "--system", "local:cpu", "--db", store_url)
    assert result.exit_code == 0, result.output
    assert (_only_run(store_url).system, _only_run(store_url).partition) == ("local", "cpu")


def test_ingest_bad_file_stores_nothing(tmp_path: Path, store_url: str) -> None:
    bad = write_jsonl(tmp_path / "bad.jsonl", [commbench_record(), commbench_record(iters=3, samples_us=[1, 2])])
    result = _ingest(bad, store_url)
    assert result.exit_code == 2
    assert f"{bad}:2: samples_us: 2 samples for 3 iterations" in " ".join(result.output.split())
    with open_store(store_url) as store:
        assert store.runs() == []


def test_ingest_empty_file(tmp_path: Path, store_url: str) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    result = _ingest(tmp_path / "empty.jsonl", store_url)
    assert result.exit_code == 2 and "holds no commbench records" in result.output


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_export_reads_back(jsonl: Path, store_url: str, tmp_path: Path, suffix: str) -> None:
    assert _ingest(jsonl, store_url).exit_code == 0
    output = tmp_path / "out" / f"results.{suffix}"
    output.parent.mkdir()
    umask = os.umask(0o027)
    try:
        result = _invoke("export", "--db", store_url, "--output", output, "--op", "allreduce")
    finally:
        os.umask(umask)
    assert result.exit_code == 0, result.output
    assert output.stat().st_mode & 0o777 == 0o640  # as the umask says, not mkstemp's 0600
    assert "exported 2 measurements" in result.output
    assert [p.name for p in output.parent.iterdir()] == [output.name]  # no temporary file left

    exported = pandas.read_csv(output) if suffix == "csv" else pandas.read_parquet(output)
    with open_store(store_url) as store:
        stored = store.measurements(op="allreduce")
    assert list(exported.columns) == list(stored.columns)
    assert exported.measurement_id.tolist() == stored.measurement_id.tolist()
    assert exported.median_us.tolist() == stored.median_us.tolist()
    assert exported.bytes.tolist() == [1024, 1 << 20]
    assert [json.loads(text) for text in exported.hostnames] == stored.hostnames.tolist()
    assert pandas.to_datetime(exported.timestamp).tolist() == stored.timestamp.tolist()


def test_export_samples_long_format(jsonl: Path, store_url: str, tmp_path: Path) -> None:
    assert _ingest(jsonl, store_url).exit_code == 0
    output = tmp_path / "samples.parquet"
    result = _invoke("export", "--db", store_url, "--output", output, "--op", "allreduce", "--samples")
    assert result.exit_code == 0, result.output
    exported = pandas.read_parquet(output)
    with open_store(store_url) as store:
        stored = store.measurements(op="allreduce")
        expected = [value for mid in stored.measurement_id for value in store.samples(int(mid))]
    assert f"exported {len(expected)} samples" in result.output
    assert exported.time_us.tolist() == expected
    first = exported[exported.measurement_id == stored.measurement_id.iloc[0]]
    assert first.iteration.tolist() == list(range(len(first)))
    assert set(exported.bytes) == {1024, 1 << 20} and set(exported.op) == {"allreduce"}


def test_export_failure_keeps_the_old_file(jsonl: Path, store_url: str, tmp_path: Path) -> None:
    assert _ingest(jsonl, store_url).exit_code == 0
    output = tmp_path / "results.csv"
    output.write_text("previous export\n")
    result = _invoke("export", "--db", f"sqlite:///{tmp_path}/missing/x.db", "--output", output)
    assert result.exit_code == 2 and "no results database at" in result.output
    assert output.read_text() == "previous export\n"
    result = _invoke("export", "--db", store_url, "--output", tmp_path / "nodir" / "x.csv")
    assert result.exit_code == 2 and f"-o/--output {tmp_path}/nodir/x.csv: directory {tmp_path}/nodir does not " \
        "exist" in result.output, result.output  # checked before the work, as report's -o


@pytest.mark.parametrize(("args", "message"), [
    (["list", "--min-size", "lots"], "is not a size"),
    (["list", "--max-size", "1MB"], "is ambiguous"),
    (["list", "--since", "last week"], "is not a date"),
    (["export", "--output", "results.xlsx"], "cannot tell the format"),
    (["runs", "--status", "maybe"], "maybe"),
])
def test_usage_errors_exit_2(store_url: str, args: list[str], message: str) -> None:
    result = _invoke(*args, "--db", store_url)
    assert result.exit_code == 2
    assert message in result.output


def test_unreachable_database_exits_2_as_for_run(tmp_path: Path) -> None:
    for command in ("runs", "list"):  # `commcamp run` exits 2 for it too (tests/test_campaign_resume.py)
        result = _invoke(command, "--db", f"sqlite:///{tmp_path}/missing/results.db")
        assert result.exit_code == 2, result.output
        assert "no results database at" in result.output and "Traceback" not in result.output


def test_a_query_of_a_database_that_does_not_exist_creates_none(tmp_path: Path) -> None:
    """A mistyped --db made a new, empty database and answered with an empty table (exit 0), as if nothing
    had been stored: the commands that only read refuse it (exit 2) and write nothing."""
    typo = tmp_path / "reslts.db"
    for command in (["runs"], ["list"], ["export", "--output", str(tmp_path / "x.csv")]):
        result = _invoke(*command, "--db", f"sqlite:///{typo}")
        assert result.exit_code == 2 and f"no results database at {typo}" in result.output, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize(("size", "text"), [(0, "0 B"), (8, "8 B"), (1024, "1 KiB"), (1536, "1.5 KiB"),
                                            (1 << 20, "1 MiB"), (1 << 32, "4 GiB"), (None, "-")])
def test_human_size(size: int | None, text: str) -> None:
    assert human_size(size) == text


COMMBENCH = Path(__file__).resolve().parents[1] / "build" / "bench" / "cpu-openmpi" / "commbench"


@pytest.mark.skipif(not COMMBENCH.exists() or shutil.which("mpirun.openmpi") is None,
                    reason="needs build/bench/cpu-openmpi/commbench (make bench) and Open MPI")
def test_ingest_real_commbench_output(tmp_path: Path, store_url: str) -> None:
    output = tmp_path / "commbench.jsonl"
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    subprocess.run(["mpirun.openmpi", "--oversubscribe", "-np", "2", str(COMMBENCH), "--op", "allreduce,pingpong",
                    "--max-bytes", "1K", "--step-factor", "8", "--iters", "4", "--warmup", "1", "--timeout", "60",
                    "--output", str(output)], check=True, env=env, capture_output=True, timeout=120)
    lines = output.read_text().splitlines()
    result = _invoke("ingest", output, "--site", "local", "--system", "local", "--db", store_url)
    assert result.exit_code == 0, result.output
    with open_store(store_url) as store:
        frame = store.measurements()
        assert len(frame) == len(lines) >= 4
        assert set(frame.op) == {"allreduce", "pingpong"}
        for line, row in zip(lines, frame.itertuples(), strict=True):
            record = json.loads(line)
            assert store.samples(row.measurement_id) == record["samples_us"]
            assert row.median_us == record["stats"]["median_us"] and row.bytes == record["bytes"]


@pytest.mark.parametrize("filters, message", [
    (["--op", "all_reduce"], "--op: 'all_reduce' is not an op of commbench's vocabulary or of the nccl-tests and OSU"),
    (["--transport", "MPI"], "--transport: 'MPI' is not a transport of commbench's vocabulary"),
    (["--backend", "gpu"], "--backend: 'gpu' is not a backend of commbench's vocabulary"),
    (["--op", "bcast"], "no measurements in sqlite:///"),  # a name records can have, none stored
    (["--site", "nowhere"], "no measurements in sqlite:///"),
])
def test_filters_that_select_nothing_exit_2_in_list_export_and_report(jsonl: Path, tmp_path: Path,
                                                                       filters: list[str], message: str) -> None:
    """`results list --op all_reduce` printed an empty table and `results export` a header-only file, exit 0,
    while `report` with the same filters exited 2: a misspelt name read as 'nothing was measured'. Every one of
    them refuses a name no record can have and a selection of nothing, exit 2, one message, nothing written."""
    from fixtures_cli import commcamp

    url = f"sqlite:///{tmp_path / 'r.db'}"
    assert _ingest(jsonl, url).exit_code == 0
    output = tmp_path / "e.csv"
    for command in (["list"], ["export", "--output", output]):
        result = _invoke(*command, "--db", url, *filters)
        assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
    code, out, err = commcamp("report", "--db", url, "--output", tmp_path / "r.html", *filters)
    assert code == 2 and message in " ".join((out + err).split()), out + err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["r.db", "site-run.jsonl"]
    for name in ("osu_bw", "reduce", "allreduce"):  # the names of ingested nccl-tests and OSU records are known
        assert "is not an op" not in _invoke("list", "--db", url, "--op", name).output


def _variants_jsonl(tmp_path: Path) -> Path:
    """Records of one op and size that only host memory, direction, pair, batch or selection tell apart."""
    selection = {"mechanism": "mpi_t", "cvar": "coll_tuned_allreduce_algorithm", "value": 4, "available": True,
                 "reason": None}
    return write_jsonl(tmp_path / "variants.jsonl", [
        commbench_record(size=1024, seed=1, host_memory="pinned"),
        commbench_record(size=1024, seed=2, host_memory="pageable", batch=20),
        commbench_record(op="pingpong", size=1024, seed=3, direction="bi", pair={"src": 0, "dst": 3}),
        commbench_record(size=1024, seed=4, selection={**selection, "name": "ring"}),
        error_record()])


def test_export_keeps_integer_columns_integers(jsonl: Path, store_url: str, tmp_path: Path) -> None:
    """An integer column with a NULL in it (the error record's count, pair_src) was written as floats: bytes=8.0,
    count=2.0. Integers stay integers, a NULL an empty CSV field / a Parquet null."""
    import csv

    assert _ingest(jsonl, store_url).exit_code == 0
    for suffix in ("csv", "parquet"):
        output = tmp_path / f"e.{suffix}"
        result = _invoke("export", "--db", store_url, "--output", output)
        assert result.exit_code == 0, result.output
        if suffix == "csv":
            rows = list(csv.DictReader(output.open()))
            assert [row["count"] for row in rows] == ["256", str((1 << 20) // 4), "2", ""]
            assert [row["bytes"] for row in rows] == ["1024", str(1 << 20), "8", str(1 << 20)]
            assert {row["pair_src"] for row in rows} == {""} and rows[0]["iters"] == "8"
        else:
            exported = pandas.read_parquet(output)
            assert str(exported["count"].dtype) == "Int64" and exported["count"].tolist()[:3] == [256, 1 << 18, 2]
            assert str(exported["wrong_elements"].dtype) == "Int64"


def test_export_samples_carry_what_tells_measurements_apart(tmp_path: Path, store_url: str) -> None:
    """A sample row had its measurement's op, transport, size and hosts only: pinned and pageable, uni and bi,
    pairs, batches, selections and valid and invalid measurements read alike."""
    assert _ingest(_variants_jsonl(tmp_path), store_url).exit_code == 0
    output = tmp_path / "s.csv"
    result = _invoke("export", "--db", store_url, "--output", output, "--samples")
    assert result.exit_code == 0, result.output
    exported = pandas.read_csv(output)
    for column in ("valid", "kind", "backend", "campaign", "check_name", "host_memory", "direction", "pair_src",
                   "pair_dst", "batch", "selection"):
        assert column in exported.columns, column
    first = exported.groupby("measurement_id").first()
    assert first.host_memory.tolist()[:2] == ["pinned", "pageable"] and first.batch.tolist()[:2] == [1, 20]
    assert first.direction.iloc[2] == "bi" and (first.pair_src.iloc[2], first.pair_dst.iloc[2]) == (0, 3)
    assert first.selection.iloc[3] == "ring" and set(exported.valid) == {True}
    assert set(exported.campaign) == {"manual"} and set(exported.check_name) == {"commbench"}


def test_list_tells_variants_apart_and_gives_numbers_as_numbers(tmp_path: Path, store_url: str) -> None:
    """`results list` showed rows that differ only in host memory, direction, pair or selection as the same row,
    and its json/csv gave "1 KiB" and two-decimal times. A variant column; json and csv have the raw numbers."""
    assert _ingest(_variants_jsonl(tmp_path), store_url).exit_code == 0
    with open_store(store_url) as store:
        stored = store.measurements().set_index("measurement_id")
    listed = _invoke("list", "--db", store_url)
    assert listed.exit_code == 0, listed.output
    for text in ("pinned", "pageable", "bi 0->3", "selection ring", "1 KiB"):
        assert text in listed.output, text

    shown = json.loads(_invoke("list", "--db", store_url, "--format", "json").stdout)
    by_id = {row["id"]: row for row in shown}
    assert [by_id[i]["variant"] for i in (1, 2, 3, 4, 5)] == ["pinned", "pageable", "bi 0->3", "selection ring", "-"]
    assert by_id[1]["size"] == 1024 and by_id[1]["median us"] == stored.loc[1, "median_us"]
    assert by_id[1]["goodput GB/s"] == stored.loc[1, "goodput_gbs"] and by_id[5]["median us"] is None
    csv_text = _invoke("list", "--db", store_url, "--format", "csv").stdout
    assert f",1024,{float(stored.loc[1, 'median_us'])!r}," in csv_text
    # `results runs` alike: its json gave every number as text and the status with its reason in one string
    (run,) = json.loads(_invoke("runs", "--db", store_url, "--format", "json").stdout)
    assert (run["id"], run["nodes"], run["measurements"], run["status"]) == (1, 2, 5, "fail") and run["reason"], run
