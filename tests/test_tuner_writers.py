"""Recommendation outputs: .env sourced by bash, the modulefile loaded by real Lmod, tuner-plugin
config rows, recommendations.yaml round trip, atomic writes, and the recommend lookup."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import optuna
import pydantic
import pytest
import yaml
from fixtures_cli import commcamp
from fixtures_tuner import catalog, make_scope, sqlite_url  # noqa: F401  (fixtures)

from tuners.catalog import KnobCatalog, Library, UnsafeValueError
from tuners.evaluation import buckets_for_sizes
from tuners.finalize import Candidate, Thresholds, finalize
from tuners.per_size import PerSizeResult, Selection, SizeRange, TunerRule, parse_config
from tuners.recommend import format_lookup, lookup
from tuners.recommendation import Recommendation, build_recommendation, with_per_size
from tuners.space import build_space
from tuners.study import Tuner
from tuners.synthetic import SCENARIOS, SYNTHETIC_SIZES, SyntheticEvaluator
from tuners.writers import cleared_names, env_file_text, load_recommendations, publish, write_atomic

LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")
PLUGIN = "/opt/commcamp/lib/libnccl-tuner-commcamp.so"
BUCKETS = buckets_for_sizes(SYNTHETIC_SIZES)
SMALL_WINNER = {"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL", "NCCL_MAX_CTAS": "8"}
LARGE_WINNER = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_MAX_CTAS": "32"}


@pytest.fixture
def nccl_recommendation(catalog: KnobCatalog, sqlite_url: str) -> Recommendation:  # noqa: F811
    """A real pipeline on the SYNTHETIC landscape: a short study, then finalization of three
    hand-picked candidates: one best for small messages, one forcing ring/simple, and the
    library defaults (best overall: unsetting the planted site defaults)."""
    scenario = SCENARIOS["nvlink-bad-default"]
    site = catalog.for_site({"defaults": dict(scenario.site_defaults)}, "test site")
    space = build_space(site, {Library.NCCL: "2.28.3"}, knobs=["NCCL_ALGO", "NCCL_PROTO", "NCCL_MAX_CTAS"])
    evaluator = SyntheticEvaluator(scenario, seed=2)
    tuner = Tuner(make_scope(), space, evaluator, sqlite_url, BUCKETS, n_trials=4, seed=0)
    study = tuner.run()
    candidates = [Candidate(SMALL_WINNER), Candidate(LARGE_WINNER), Candidate({})]
    # Ablation off: this fixture feeds the publishing tests the winner as chosen (unsetting both planted
    # defaults); ablation has its own tests (tests/test_tuner_finalize.py). never_slower off: unsetting the
    # planted NCCL_PROTO=LL makes the small sizes slower, which the per-size rows the test adds restore (the
    # guard judges the environment alone and would pick SMALL_WINNER: tests/test_tuner_finalize.py).
    report = finalize(evaluator, tuner.baseline_env, candidates, BUCKETS,
                      thresholds=Thresholds(ablation_rounds=0, never_slower=False))
    return build_recommendation(make_scope(), report, BUCKETS, study, {"nccl": "2.28.3", "cuda": "13.0"})


def mpi_recommendation(nodes: int = 2, transport: str = "mpi") -> Recommendation:
    """A hand-made 'change' recommendation for an Open MPI scope (values as the study would give)."""
    scope = make_scope(library="openmpi", library_version="4.1.4", transport=transport, nodes=nodes)
    return Recommendation.model_validate(
        {
            "scope": scope.model_dump(),
            "decision": "change",
            "env": {
                "OMPI_MCA_coll_tuned_allreduce_algorithm": "ring",
                "OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
                "UCX_TLS": "rc,sm,cuda_copy,cuda_ipc",
            },
            "unset": [],
            "baseline_env": {},
            "gain": {
                "median": 0.12,
                "ci_low": 0.08,
                "ci_high": 0.15,
                "confidence": 0.95,
                "p_value": 0.001,
                "p_adjusted": 0.002,
                "rounds": 10,
                "ratios": [1.12] * 10,
            },
            "per_size": [
                {
                    "bucket": "8B-1MiB",
                    "min_bytes": 8,
                    "max_bytes": 1 << 20,
                    "metric": "goodput",
                    "decision": "keep-defaults",
                    "env": {},
                }
            ],
            "evidence": {
                "test": "Wilcoxon",
                "alpha": 0.01,
                "min_effect": 0.03,
                "confidence": 0.95,
                "rounds_run": 10,
                "rounds_used": 10,
                "notes": ["note with $(id) and\nnewline"],
                "study": "s",
                "trials_counted": 40,
                "trials_complete": 38,
                "trials_failed": 2,
            },
            "date": "2026-11-21T12:00:00+00:00",
            "versions": {"openmpi": "4.1.4"},
        }
    )


def shell_env(script: str, start_env: dict[str, str]) -> dict[str, str]:
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), **start_env}
    out = subprocess.run(
        ["bash", "-c", f"{script}\nenv -0"], env=base, capture_output=True, text=True, check=True
    ).stdout
    return dict(item.split("=", 1) for item in out.split("\0") if item)


def env_changes(script: str, start_env: dict[str, str]) -> tuple[dict[str, str], set[str]]:
    """(variables set or changed, variables removed) by `script`, against the same shell without it."""
    before, after = shell_env(":", start_env), shell_env(script, start_env)
    return {k: v for k, v in after.items() if before.get(k) != v}, set(before) - set(after)


def test_nccl_pipeline_publishes_plugin_rows_env_and_yaml(
    tmp_path: Path, nccl_recommendation: Recommendation, catalog: KnobCatalog
) -> None:  # noqa: F811
    # The per-size stage (its sweep is tests/test_per_size.py's) chose tree/LL/8 channels for 8 B .. 32 KiB.
    tree_ll = Selection(name="Tree/LL/8", mechanism="plugin")
    per_size = PerSizeResult(
        op="allreduce", library="nccl", ranks=8, nodes=2, rounds=26, selection_rounds=13, confirmation_rounds=13,
        family_size=4, test="t", sizes=[],
        ranges=[SizeRange(min_bytes=8, max_bytes=32768, selection=tree_ll, gains=[0.2, 0.1]),
                SizeRange(min_bytes=65536, max_bytes=1 << 27, selection=None, gains=[])],
    )
    # as a tune gives it: every knob the trials ran without, the site setting none (cleared_names)
    rec = with_per_size(nccl_recommendation, per_size).model_copy(update={
        "cleared": cleared_names(catalog, catalog.default_env(), Library.NCCL)})
    assert rec.decision == "change" and rec.gain is not None and rec.gain.ci_low > 0
    assert rec.env == {} and rec.unset == ["NCCL_MAX_CTAS", "NCCL_PROTO"]
    assert [(s.decision, s.env) for s in rec.per_size] == [("change", SMALL_WINNER)] * 2 + [("change", {})] * 2
    files = publish(tmp_path, rec, catalog, plugin_library=PLUGIN)
    config = files.tuner_config
    assert config is not None and config.parent == tmp_path / "testsite" / "gpusys"
    text = config.read_text()
    assert text.startswith(
        "# collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff"
    )
    assert all(len(line) < 256 for line in text.splitlines())
    assert parse_config(text) == [TunerRule("allreduce", 8, 32768, "tree", "ll", 8, 2, 8)]
    assert "# sizes [8, 32768] B: Tree/LL/8 (median speed-up per size, confirmation rounds, which also decided it: +20.0%, +10.0%)" in text
    # The .env removes the planted site defaults and points NCCL at the plugin and its config; a knob of NCCL the
    # job inherited (every trial ran without it) is unset too; another library's (the job's MPI settings: they
    # were unset as well, and a job sourcing an MPI recommendation and this one lost the first) and anything
    # else stay.
    inherited = {"NCCL_ALGO": "Ring", "OMPI_MCA_btl_tcp_sndbuf": "65536", "UCX_TLS": "rc,sm", "KEEP": "x"}
    changed, removed = env_changes(f"source {files.env_file}", {"NCCL_PROTO": "LL", "NCCL_MAX_CTAS": "4", **inherited})
    assert changed == {"NCCL_TUNER_PLUGIN": PLUGIN, "NCCL_TUNER_CONFIG_FILE": str(config.resolve())}
    assert removed == {"NCCL_PROTO", "NCCL_MAX_CTAS", "NCCL_ALGO"}
    loaded = load_recommendations(files.recommendations).recommendations
    cleared = loaded[0].cleared
    assert "NCCL_ALGO" in cleared and "NCCL_SOCKET_NTHREADS" in cleared and not set(cleared) & {*changed, *rec.unset}
    assert loaded == [rec.model_copy(update={"plugin_env": changed, "cleared": cleared})]
    result = lookup(tmp_path, "testsite", "gpusys", op="allreduce", nodes=2, size=1 << 20)
    assert result.measured and result.settings == changed and result.unset == ["NCCL_MAX_CTAS", "NCCL_PROTO"]
    assert result.cleared == cleared and "unset NCCL_ALGO" in format_lookup(result)
    assert result.size_result is not None and result.size_result.bucket == "256KiB-128MiB"
    printed = format_lookup(result)
    assert f"export NCCL_TUNER_PLUGIN='{PLUGIN}'" in printed and "measured scope: site=testsite" in printed


def test_env_file_and_lmod_modulefile_set_exactly_the_values(tmp_path: Path, catalog: KnobCatalog) -> None:  # noqa: F811
    rec = mpi_recommendation().model_copy(update={"cleared": cleared_names(catalog, catalog.default_env(),
                                                                          Library.OPENMPI)})
    # an Open MPI tune's env file unsets what its runs go over (UCX), not a GPU job's NCCL settings
    assert {"UCX_TLS", "OMPI_MCA_btl_tcp_sndbuf"} <= set(rec.cleared) and "NCCL_IB_HCA" not in rec.cleared
    # an MPICH tune's unsets every spelling MPICH reads a control variable as (an inherited alias would run), and
    # publishes them (publish refused every alias as "not a knob of the catalog": no MPICH tune could publish)
    algorithm = "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM"
    mpich = rec.model_copy(update={
        "scope": make_scope(library="mpich", library_version="4.0.2", transport="mpi", nodes=2),
        "env": {algorithm: "recursive_doubling"}, "cleared": cleared_names(catalog, catalog.default_env(),
                                                                           Library.MPICH)})
    assert {algorithm, "MPICH_ALLREDUCE_INTRA_ALGORITHM", "MPIR_PARAM_ALLREDUCE_INTRA_ALGORITHM"} <= set(mpich.cleared)
    (tmp_path / "mpich").mkdir()
    mpich_env = publish(tmp_path / "mpich", mpich, catalog).env_file
    assert "unset MPICH_ALLREDUCE_INTRA_ALGORITHM" in mpich_env.read_text()
    inherited = {"MPIR_PARAM_ALLREDUCE_INTRA_ALGORITHM": "ring"}
    assert env_changes(f"source {mpich_env}", inherited) == ({algorithm: "recursive_doubling"}, set(inherited))
    files = publish(tmp_path, rec, catalog)
    assert files.tuner_config is None
    text = files.env_file.read_text()
    assert "# note: note with $(id) and?newline" in text  # comments cannot break out of their line
    assert env_changes(f"source {files.env_file}", {}) == (rec.env, set())
    assert "unset OMPI_MCA_btl_tcp_sndbuf" in text and "unset OMPI_MCA_coll_tuned_allreduce_algorithm" not in text
    lmod = f"source {LMOD_INIT}\nmodule use {files.modulefile.parent.parent}"
    changed, _ = env_changes(f"{lmod}\nmodule load {files.module_name}", {})
    assert {k: v for k, v in changed.items() if k in rec.env or k.startswith(("NCCL", "UCX", "OMPI"))} == rec.env
    assert files.module_name in changed["LOADEDMODULES"]
    unloaded = shell_env(f"{lmod}\nmodule load {files.module_name}\nmodule unload {files.module_name}", {})
    assert not set(rec.env) & set(unloaded)
    # A job's own values: the module sets what was measured (a knob every trial ran without, unset), and unloading
    # it gives them back (setenv/unsetenv left them unset).
    own = {"OMPI_MCA_coll_tuned_allreduce_algorithm": "recursive_doubling", "OMPI_MCA_btl_tcp_sndbuf": "65536"}
    loaded = shell_env(f"{lmod}\nmodule load {files.module_name}", own)
    assert loaded["OMPI_MCA_coll_tuned_allreduce_algorithm"] == "ring" and "OMPI_MCA_btl_tcp_sndbuf" not in loaded
    unloaded = shell_env(f"{lmod}\nmodule load {files.module_name}\nmodule unload {files.module_name}", own)
    assert {name: unloaded.get(name) for name in own} == own


def test_a_scope_scored_over_every_bucket_names_the_sizes_it_measured(tmp_path: Path, catalog: KnobCatalog) -> None:  # noqa: F811
    """A study over every bucket has size_bucket "all"; its files and recommend name the span measured,
    since "sizes=all" reads as every message size."""
    files = publish(tmp_path, mpi_recommendation(), catalog)
    for text in (files.env_file.read_text(), files.modulefile.read_text()):
        assert "sizes=8B-1MiB" in text and "sizes=all" not in text
    result = lookup(tmp_path, "testsite", "gpusys", op="allreduce", nodes=2)
    assert "sizes=8B-1MiB" in result.message


def test_modules_of_two_systems_load_side_by_side(tmp_path: Path, catalog: KnobCatalog) -> None:  # noqa: F811
    """The same scope on two systems of a site: two module names, each loads its own settings."""
    first = mpi_recommendation()
    second = first.model_copy(update={"scope": first.scope.model_copy(update={"system": "othersys"}),
                                      "env": {**first.env, "OMPI_MCA_coll_tuned_allreduce_algorithm": "recursive_doubling"}})
    files = [publish(tmp_path, rec, catalog) for rec in (first, second)]
    assert files[0].module_name != files[1].module_name and "othersys" in files[1].module_name
    use = " ".join(str(f.modulefile.parent.parent) for f in files)
    for rec, published in zip((first, second), files, strict=True):
        changed, _ = env_changes(f"source {LMOD_INIT}\nmodule use {use}\nmodule load {published.module_name}", {})
        assert changed["OMPI_MCA_coll_tuned_allreduce_algorithm"] == rec.env["OMPI_MCA_coll_tuned_allreduce_algorithm"]


def test_writes_are_atomic(tmp_path: Path, catalog: KnobCatalog, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    target = tmp_path / "x.env"
    write_atomic(target, "old\n")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, "new\n")
    assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["x.env"]
    monkeypatch.undo()
    files = publish(tmp_path, mpi_recommendation(), catalog)
    snapshot = {p: p.read_text() for p in files.env_file.parent.rglob("*") if p.is_file()}
    outside_domain = mpi_recommendation().model_copy(update={"env": {"UCX_TLS": "rc,sm"}})
    with pytest.raises(UnsafeValueError, match="UCX_TLS"):
        publish(tmp_path, outside_domain, catalog)
    with pytest.raises(ValueError, match="plugin_library"):
        publish(
            tmp_path,
            mpi_recommendation().model_copy(
                update={
                    "plugin_rules": [
                        {
                            "collective": "allreduce",
                            "min_bytes": 0,
                            "max_bytes": 8,
                            "algorithm": "ring",
                            "protocol": "ll",
                            "channels": 2,
                            "n_nodes": 2,
                            "n_ranks": 8,
                        }
                    ]
                }
            ),
            catalog,
        )
    assert {p: p.read_text() for p in files.env_file.parent.rglob("*") if p.is_file()} == snapshot


def test_a_publish_that_fails_before_its_renames_changes_no_file(
        tmp_path: Path, catalog: KnobCatalog, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The trial's case: `modulefiles` a plain file. The scope's .env used to be rewritten before the
    modulefile failed, while recommendations.yaml kept the old result; now every file is as it was."""
    published = publish(tmp_path, mpi_recommendation(), catalog)
    directory = published.env_file.parent

    def snapshot() -> dict[str, bytes]:
        return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()}

    newer = mpi_recommendation().model_copy(update={"date": "2026-12-24T12:00:00+00:00"})
    modulefiles = published.modulefile.parent.parent
    saved = modulefiles.with_name("saved")
    modulefiles.rename(saved)
    modulefiles.write_text("not a directory\n")
    before = snapshot()
    with pytest.raises(OSError, match="Not a directory|File exists"):
        publish(tmp_path, newer, catalog)
    assert snapshot() == before
    modulefiles.unlink()
    saved.rename(modulefiles)
    # A full disk on the last temp file (recommendations.yaml): the temp files before it are removed too.
    before = snapshot()
    real_mkstemp = tempfile.mkstemp

    def full_at_yaml(**kwargs: str) -> tuple[int, str]:
        if kwargs["prefix"].startswith(".recommendations.yaml"):
            raise OSError(28, "No space left on device")
        return real_mkstemp(**kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", full_at_yaml)
    with pytest.raises(OSError, match="No space left"):
        publish(tmp_path, newer, catalog)
    assert snapshot() == before
    monkeypatch.undo()
    publish(tmp_path, newer, catalog)
    assert "2026-12-24" in published.env_file.read_text() and "2026-12-24" in published.recommendations.read_text()


def test_the_summary_s_files_say_null_for_a_file_not_written(
        tmp_path: Path, catalog: KnobCatalog) -> None:  # noqa: F811
    files = publish(tmp_path, mpi_recommendation(), catalog)  # no tuner-plugin rows: no nccl_tuner.conf
    assert files.to_json() == {"env_file": str(files.env_file), "modulefile": str(files.modulefile),
                               "module_name": files.module_name, "tuner_config": None,
                               "recommendations": str(files.recommendations), "replaced": None}


def test_unsafe_values_never_reach_a_recommendation() -> None:
    document = mpi_recommendation().model_dump()
    for env in ({"UCX_TLS": "rc;reboot"}, {"UCX_TLS": "$(id)"}, {"BAD NAME": "1"}, {"UCX_TLS": "a\nexport X=1"}):
        with pytest.raises(pydantic.ValidationError):
            Recommendation.model_validate({**document, "env": env})
    with pytest.raises(pydantic.ValidationError):
        Recommendation.model_validate({**document, "unset": ["X;Y"]})


def test_lookup_never_extrapolates(tmp_path: Path, catalog: KnobCatalog) -> None:  # noqa: F811
    publish(tmp_path, mpi_recommendation(nodes=2), catalog)
    publish(tmp_path, mpi_recommendation(nodes=8), catalog)
    yaml_file = tmp_path / "testsite" / "gpusys" / "recommendations.yaml"
    assert [r.scope.nodes for r in load_recommendations(yaml_file).recommendations] == [2, 8]
    result = lookup(tmp_path, "testsite", "gpusys", op="allreduce", nodes=4)
    assert not result.measured and result.settings == {}
    assert result.message.startswith("not measured for 4 nodes")
    assert "nearest measured scope: site=testsite system=gpusys:gpu library=openmpi 4.1.4" in result.message
    assert "nodes=2" in result.message and "not applied" in result.message
    assert format_lookup(result).startswith("# NOT MEASURED: not measured for 4 nodes")
    exact = lookup(tmp_path, "testsite", "gpusys", op="allreduce", nodes=8, size=4096)
    assert exact.measured and exact.settings["OMPI_MCA_coll_tuned_allreduce_algorithm"] == "ring"
    # The range the bucket covers, not its name (the sizes measured in it, which reads like a range too).
    assert "size 4096 B falls in the bucket [8, 1048576] B, which the tune measured at 8B-1MiB: keep-defaults for this " \
        "bucket alone (no candidate shown faster here); the scope's environment below was not shown slower here" \
        in exact.message
    # A bucket that chose another environment of its own: said as not deployed, beside the scope's exports.
    rec = mpi_recommendation(nodes=16)
    rec.per_size[0] = rec.per_size[0].model_copy(update={"decision": "change", "env": {"UCX_TLS": "sm"}})
    publish(tmp_path, rec, catalog)
    own = lookup(tmp_path, "testsite", "gpusys", op="allreduce", nodes=16, size=4096)
    assert own.settings["OMPI_MCA_coll_tuned_allreduce_algorithm"] == "ring"
    assert own.message.endswith("which the tune measured at 8B-1MiB: change for this bucket alone (UCX_TLS=sm), not deployed: "
                                "one environment serves every size, the lines below are the scope's")
    # one whose winner unsets the site's defaults: said so (it read "change for this bucket alone ()")
    rec = rec.model_copy(update={"baseline_env": {"UCX_TLS": "^cuda_ipc"}, "env": {**rec.env, "UCX_TLS": "^cuda_ipc"}})
    rec.per_size[0] = rec.per_size[0].model_copy(update={"env": {}})
    publish(tmp_path, rec, catalog)
    own = lookup(tmp_path, "testsite", "gpusys", op="allreduce", nodes=16, size=4096)
    assert "change for this bucket alone (unset UCX_TLS), not deployed" in own.message, own.message
    # A size outside every bucket: the scope's environment was tuned on other sizes, so it is not applied.
    unmeasured = lookup(tmp_path, "testsite", "gpusys", op="allreduce", nodes=8, size=1 << 30)
    assert not unmeasured.measured and unmeasured.settings == {} and unmeasured.unset == []
    assert unmeasured.message.startswith("size 1073741824 B was not measured for site=testsite")
    assert "(its size buckets: [8, 1048576] B)" in unmeasured.message and "not applied" in unmeasured.message
    assert "export" not in format_lookup(unmeasured)
    publish(tmp_path, mpi_recommendation(nodes=8, transport="mpi-staging"), catalog)
    ambiguous = lookup(tmp_path, "testsite", "gpusys", op="allreduce", nodes=8)
    assert not ambiguous.measured and "2 measured scopes match" in ambiguous.message
    assert lookup(tmp_path, "testsite", "gpusys", op="allreduce", nodes=8, transport="mpi").measured
    assert "nothing measured for op=alltoall" in lookup(tmp_path, "testsite", "gpusys", op="alltoall", nodes=8).message
    assert "no recommendations published" in lookup(tmp_path, "othersite", "gpusys", op="allreduce", nodes=2).message
    assert optuna.__version__ == "5.0.0"


LOCAL = ("--root", "{root}", "--site", "local", "--system", "local")


@pytest.mark.parametrize(("args", "option"), [
    (("--op", "allreducee", "--nodes", "1"), "--op 'allreducee' is not a commbench op"),
    (("--op", "allreduce", "--nodes", "1", "--transport", "tcp"), "--transport 'tcp' is not a commbench transport"),
    (("--op", "allreduce", "--nodes", "1", "--library", "foo"), "--library 'foo' is not a library of the knob"),
    (("--op", "allreduce", "--nodes", "1", "--site", "nosuch"), "--site 'nosuch' is not a site"),
    (("--op", "allreduce", "--nodes", "1", "--site", "../../etc"), "--site '../../etc' is not a name"),
    (("--op", "allreduce", "--nodes", "1", "--system", "nosys"), "--system 'nosys' is not a system of site 'local'"),
    (("--op", "allreduce", "--nodes", "1", "--partition", "gpu"), "partition 'gpu' (--system local:gpu or --partition) "
     "is not a partition"),
    (("--op", "allreduce", "--nodes", "1", "--gpus-per-node", "0"), "--gpus-per-node 0 must be at least 1"),
    (("--op", "allreduce", "--nodes", "0"), "--nodes 0 must be at least 1"),
    (("--op", "allreduce", "--nodes", "-2"), "--nodes -2 must be at least 1"),
    (("--op", "allreduce", "--nodes", "1", "--size", "0"), "--size 0: sizes [0] outside 1 B .. 1 TiB"),
    (("--op", "allreduce", "--nodes", "1", "--size", "5T"), "--size 5T: sizes [5497558138880] outside 1 B .. 1 TiB"),
    (("--op", "allreduce", "--nodes", "1", "--size", "1MB"), "--size 1MB: '1MB' is ambiguous"),
    (("--op", "allreduce", "--nodes", "1", "--library-version", "4.1;id"), "--library-version '4.1;id' is not a"),
    (("--op", "allreduce", "--nodes", "1", "--root", "/no/such/root"), "--root /no/such/root: no such directory"),
])
def test_recommend_refuses_bad_input_as_a_usage_error(
        tmp_path: Path, catalog: KnobCatalog, args: tuple[str, ...], option: str) -> None:  # noqa: F811
    """A typo is exit 2 with one line naming the option, never exit 3 ("not measured") that a job script
    would read as a context nobody tuned; nothing is looked up outside the root."""
    publish(tmp_path, local_recommendation(), catalog)
    code, stdout, stderr = commcamp("recommend", *(a.format(root=tmp_path) for a in LOCAL), *args)
    assert code == 2 and stdout == "", (code, stdout, stderr)
    assert stderr.startswith(option) and len(stderr.strip().splitlines()) == 1, stderr


@pytest.mark.parametrize("args", [
    ("--op", "allreduce", "--nodes", "8"),
    ("--op", "alltoall", "--nodes", "1"),
    ("--op", "allreduce", "--nodes", "1", "--transport", "ccl"),
    ("--op", "allreduce", "--nodes", "1", "--library", "mpich"),
    ("--op", "allreduce", "--nodes", "1", "--gpus-per-node", "4"),
    ("--op", "allreduce", "--nodes", "1", "--site", "localslurm", "--system", "localslurm"),
])
def test_recommend_says_not_measured_for_a_valid_context(
        tmp_path: Path, catalog: KnobCatalog, args: tuple[str, ...]) -> None:  # noqa: F811
    publish(tmp_path, local_recommendation(), catalog)
    assert commcamp("recommend", *(a.format(root=tmp_path) for a in LOCAL), "--nodes", "1", "--op",
                    "allreduce").code == 0
    code, stdout, stderr = commcamp("recommend", *(a.format(root=tmp_path) for a in LOCAL), *args)
    assert code == 3 and stdout.startswith("# NOT MEASURED: ") and "export" not in stdout, (stdout, stderr)


def test_recommend_names_the_library_version_when_a_scope_is_published_under_several(
        tmp_path: Path, catalog: KnobCatalog) -> None:  # noqa: F811
    """The scope tuned again after an upgrade (Open MPI 4.1.4, then 5.0.5) is published under both versions.
    Without a version recommend lists them and the option that picks one (exit 3: no version is chosen for
    the job, each one's settings were measured on it alone); --library-version, tune's option and the scope's
    library_version, picks one; a version not published is not measured, with the versions that are. Before,
    no option named the version: that context exited 3 whatever was asked."""
    older = local_recommendation()
    newer = older.model_copy(update={
        "scope": older.scope.model_copy(update={"library_version": "5.0.5"}),
        "env": {**older.env, "OMPI_MCA_coll_tuned_allreduce_algorithm": "recursive_doubling"}})
    publish(tmp_path, older, catalog)
    publish(tmp_path, newer, catalog)
    context = (*(a.format(root=tmp_path) for a in LOCAL), "--op", "allreduce", "--nodes", "1")
    code, stdout, stderr = commcamp("recommend", *context)
    assert code == 3 and stdout.startswith("# NOT MEASURED: 2 measured scopes match op=allreduce, nodes=1: "), stdout
    assert "library=openmpi 4.1.4" in stdout and "library=openmpi 5.0.5" in stdout
    assert "Say which: --library-version 4.1.4 or 5.0.5" in stdout and "export" not in stdout, stdout
    for version, algorithm in (("5.0.5", "recursive_doubling"), ("4.1.4", "ring")):
        code, stdout, stderr = commcamp("recommend", *context, "--library-version", version)
        assert code == 0 and f"# measured scope: site=local system=local:cpu library=openmpi {version} " in stdout
        assert f"export OMPI_MCA_coll_tuned_allreduce_algorithm='{algorithm}'" in stdout, (stdout, stderr)
    code, stdout, stderr = commcamp("recommend", *context, "--library", "openmpi", "--library-version", "4.1.5")
    assert code == 3 and "export" not in stdout, (stdout, stderr)
    assert stdout.startswith("# NOT MEASURED: nothing measured for op=allreduce, library=openmpi, "
                             "library_version=4.1.5 on local/local; published: --library-version 4.1.4 or 5.0.5")


def local_recommendation() -> Recommendation:
    """mpi_recommendation's values for the shipped site `local` (CPU: 1 GPU per node, as tune records it)."""
    return mpi_recommendation().model_copy(update={"scope": make_scope(
        site="local", system="local", partition="cpu", library="openmpi", library_version="4.1.4",
        transport="mpi", nodes=1, gpus_per_node=1)})


def with_plugin_rows(rec: Recommendation, op: str, low: int, high: int, name: str) -> Recommendation:
    """`rec` with a per-size result whose one range the tuner plugin serves (NCCL's per-size output)."""
    result = PerSizeResult(
        op=op, library="nccl", ranks=8, nodes=2, rounds=26, selection_rounds=13, confirmation_rounds=13,
        family_size=1, test="t", sizes=[],
        ranges=[SizeRange(min_bytes=low, max_bytes=high, selection=Selection(name=name, mechanism="plugin"),
                          gains=[0.2])])
    return with_per_size(rec, result)


def test_a_scope_s_tuner_config_holds_no_rows_of_another_partition_or_library_version(
    tmp_path: Path, nccl_recommendation: Recommendation, catalog: KnobCatalog
) -> None:  # noqa: F811
    """The plugin rows of one partition and NCCL version serve its scopes (every op and node count: the rows
    name them), never another partition's or version's jobs, where they were not measured: a job of the gpu2
    partition got the gpu partition's tree/LL/8 at 8 B .. 32 KiB, which its own sweep had left to NCCL."""

    def scope(**fields: str) -> Recommendation:
        return nccl_recommendation.model_copy(update={"scope": nccl_recommendation.scope.model_copy(update=fields)})

    gpu = with_plugin_rows(nccl_recommendation, "allreduce", 8, 32768, "Tree/LL/8")
    gpu_bcast = with_plugin_rows(scope(op="bcast"), "bcast", 8, 1024, "Ring/LL/4")
    gpu2 = with_plugin_rows(scope(partition="gpu2"), "allreduce", 65536, 1 << 20, "Ring/Simple/4")
    newer = with_plugin_rows(scope(library_version="2.29.1"), "allreduce", 1 << 20, 1 << 22, "Ring/LL128/16")
    files = {key: publish(tmp_path, rec, catalog, plugin_library=PLUGIN)
             for key, rec in (("gpu", gpu), ("gpu_bcast", gpu_bcast), ("gpu2", gpu2), ("newer", newer))}

    def rows_of(key: str) -> list[TunerRule]:
        changed, _ = env_changes(f"source {files[key].env_file}", {})
        return parse_config(Path(changed["NCCL_TUNER_CONFIG_FILE"]).read_text())

    assert rows_of("gpu2") == [TunerRule("allreduce", 65536, 1 << 20, "ring", "simple", 4, 2, 8)]
    assert rows_of("newer") == [TunerRule("allreduce", 1 << 20, 1 << 22, "ring", "ll128", 16, 2, 8)]
    both = [TunerRule("allreduce", 8, 32768, "tree", "ll", 8, 2, 8),
            TunerRule("broadcast", 8, 1024, "ring", "ll", 4, 2, 8)]
    assert sorted(rows_of("gpu"), key=str) == sorted(rows_of("gpu_bcast"), key=str) == sorted(both, key=str)
    # A scope republished without rows leaves its group's file, which stays after the group's last rows (a job
    # queued with the earlier .env reads it); the new .env unsets the plugin's lines.
    published = publish(tmp_path, gpu2.model_copy(update={"plugin_rules": [], "per_size_selection": None,
                                                          "cleared": cleared_names(catalog, catalog.default_env(),
                                                                                   Library.NCCL)}),
                        catalog)
    assert files["gpu2"].tuner_config is not None and files["gpu2"].tuner_config.exists()
    assert published.tuner_config is None and "unset NCCL_TUNER_CONFIG_FILE" in published.env_file.read_text()
    assert files["gpu"].tuner_config is not None and files["gpu"].tuner_config.exists()


def test_a_tuner_config_of_the_old_name_stays_and_the_republished_scope_moves_to_its_own(
    tmp_path: Path, nccl_recommendation: Recommendation, catalog: KnobCatalog
) -> None:  # noqa: F811
    """Before the config's name said partition and library version, every scope's rows went to nccl_tuner.conf.
    A scope published then keeps it while its .env points there; republished, it moves to its own config, and the
    old file stays for a job queued with the earlier .env."""
    rec = with_plugin_rows(nccl_recommendation, "allreduce", 8, 32768, "Tree/LL/8")
    files = publish(tmp_path, rec, catalog, plugin_library=PLUGIN)
    assert files.tuner_config is not None
    directory = files.recommendations.parent
    old = (directory / "nccl_tuner.conf").resolve()
    old.write_text(files.tuner_config.read_text())  # as that code published it: its rows, its paths
    files.tuner_config.unlink()
    document = yaml.safe_load(files.recommendations.read_text())
    document["recommendations"][0]["plugin_env"]["NCCL_TUNER_CONFIG_FILE"] = str(old)
    files.recommendations.write_text(yaml.safe_dump(document, sort_keys=False))
    other = nccl_recommendation.model_copy(update={"scope": nccl_recommendation.scope.model_copy(
        update={"op": "bcast"}), "plugin_rules": [], "per_size_selection": None})
    # Another scope: the old scope still points at the old file, which keeps its rows; no config of the new name is
    # written for rows no .env points at (before, it was written, then removed, and named in the return value).
    assert publish(tmp_path, other, catalog).tuner_config is None
    assert old.exists() and not files.tuner_config.exists()
    publish(tmp_path, rec, catalog, plugin_library=PLUGIN)
    assert old.exists() and files.tuner_config.exists()
    changed, _ = env_changes(f"source {files.env_file}", {})
    assert changed["NCCL_TUNER_CONFIG_FILE"] == str(files.tuner_config.resolve())


def test_tuner_config_rows_are_validated() -> None:
    for bad in (
        "allreduce,0,8,ring,ll,0,1,4,-1,-1",
        "allreduce,9,8,ring,ll,1,1,4,-1,-1",
        "allreduce,0,8,star,ll,1,1,4,-1,-1",
        "allreduce,0,8,ring,ll,1,1,4",
        "alltoall,0,8,ring,ll,1,1,4,-1,-1",
    ):
        with pytest.raises(ValueError):
            parse_config(bad)


def test_a_related_scope_s_published_winner_is_enqueued_as_a_marked_warm_start(
        tmp_path: Path, catalog: KnobCatalog, sqlite_url: str) -> None:  # noqa: F811
    """A tune for 3 nodes starts from what was published for 2 nodes of the same site, system, library, op
    and transport (after the defaults and the seeds), marked with where it came from; another transport's
    winner is not used; with no publish directory there is nothing to start from. A new study of the 2-node scope
    (other sizes, another knob setup) starts from what is deployed for it now (before, a scope's own published
    winner was never a warm start: the issue's 'other size sets' had none)."""
    from campaigns.tuning.session import warm_start_envs
    from tuners.study import ROLE, WARM_START, WARM_START_FROM

    root = tmp_path / "rec"
    two = mpi_recommendation(nodes=2)  # without its UCX_TLS, a knob this tune does not search (else skipped:
    two = two.model_copy(update={"env": {k: v for k, v in two.env.items() if k != "UCX_TLS"}})  # another baseline)
    publish(root, two, catalog)
    publish(root, mpi_recommendation(nodes=4, transport="other"), catalog)
    knobs = ["OMPI_MCA_coll_tuned_allreduce_algorithm", "OMPI_MCA_coll_tuned_use_dynamic_rules"]
    space = build_space(catalog, {Library.OPENMPI: "4.1.4"}, knobs=knobs)
    scope = make_scope(library="openmpi", library_version="4.1.4", transport="mpi", nodes=3)
    warm = warm_start_envs(root, scope, space)
    winner = {"OMPI_MCA_coll_tuned_allreduce_algorithm": "ring", "OMPI_MCA_coll_tuned_use_dynamic_rules": "1"}
    assert warm == [(winner, mpi_recommendation(nodes=2).describe_scope())]
    assert warm_start_envs(None, scope, space) == []
    assert warm_start_envs(root, make_scope(library="openmpi", library_version="4.1.4", transport="mpi", nodes=2),
                           space) == warm  # what is deployed for the scope itself

    def evaluate(env, *, validate=False):  # noqa: ANN001, ANN202  (the trials' outcome does not matter here)
        from tuners.evaluation import Evaluation
        return Evaluation(times_us={size: [10.0] for size in (8, 1 << 20)}, validated=validate)

    buckets = buckets_for_sizes([8, 1 << 20])
    study = Tuner(scope, space, evaluate, sqlite_url, buckets, n_trials=3, seed=0,
                  seed_envs=[{**winner, "OMPI_MCA_coll_tuned_allreduce_algorithm": "recursive_doubling"}],
                  warm_starts=warm).run()
    first = sorted(study.trials, key=lambda t: t.number)[:3]
    assert [t.user_attrs.get(ROLE) for t in first] == ["defaults", "seeded", WARM_START]
    assert first[2].user_attrs[WARM_START_FROM] == mpi_recommendation(nodes=2).describe_scope()
    assert {k: v for k, v in first[2].user_attrs["env"].items() if k in knobs} == winner


def test_a_warm_start_is_the_related_winner_on_top_of_the_site_defaults(
        tmp_path: Path, catalog: KnobCatalog) -> None:  # noqa: F811
    """A published winner says what to export and what to unset on top of the site's jobs (its .env): a knob the
    related tune did not search ran there at the site default, and runs so in the warm start too; one the winner
    unsets is unset. Before, every searched knob the winner's env did not name was left unset: the warm start
    dropped the site's TCP send buffer that the 2-node winner ran with, a setting never measured there."""
    from campaigns.tuning.session import warm_start_envs

    site = catalog.for_site({"defaults": {"OMPI_MCA_btl_tcp_sndbuf": "65536", "OMPI_MCA_btl_tcp_rcvbuf": "65536"}},
                            "site.yaml")
    # The 2-node tune searched the algorithm and the receive buffer: its winner forces ring and unsets the
    # receive buffer; the send buffer, not searched there, ran at the site default.
    related = mpi_recommendation(nodes=2).model_copy(update={
        "env": {"OMPI_MCA_coll_tuned_allreduce_algorithm": "ring", "OMPI_MCA_coll_tuned_use_dynamic_rules": "1"},
        "unset": ["OMPI_MCA_btl_tcp_rcvbuf"], "baseline_env": {"OMPI_MCA_btl_tcp_rcvbuf": "65536"}})
    root = tmp_path / "rec"
    publish(root, related, site)
    knobs = ["OMPI_MCA_coll_tuned_allreduce_algorithm", "OMPI_MCA_coll_tuned_use_dynamic_rules",
             "OMPI_MCA_btl_tcp_sndbuf", "OMPI_MCA_btl_tcp_rcvbuf"]
    space = build_space(site, {Library.OPENMPI: "4.1.4"}, knobs=knobs)
    scope = make_scope(library="openmpi", library_version="4.1.4", transport="mpi", nodes=3)
    assert warm_start_envs(root, scope, space) == [(
        {"OMPI_MCA_coll_tuned_allreduce_algorithm": "ring", "OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
         "OMPI_MCA_btl_tcp_sndbuf": "65536"}, related.describe_scope())]


def test_the_site_s_documented_settings_are_measured_after_the_seeds_with_their_source(
        catalog: KnobCatalog, sqlite_url: str) -> None:  # noqa: F811
    """site.yaml `knobs.documented`: each setting the space can measure is enqueued after the seeds, on top of
    the site defaults, marked with where it is documented; one naming a knob the space does not search is
    about another scope and is left out. Bad settings are refused with the site file's path."""
    from campaigns.tuning.session import documented_envs
    from tuners.catalog import CatalogError
    from tuners.study import DOCUMENTED, DOCUMENTED_FROM, ENV, ROLE

    aws = "NVIDIA/nccl src/transport/net_socket.cc: NCCL's own choice for AWS NICs (2 threads x 8 sockets)"
    site = catalog.for_site({"defaults": {"NCCL_BUFFSIZE": "8388608"}, "documented": [
        {"env": {"NCCL_SOCKET_NTHREADS": 2, "NCCL_NSOCKS_PERTHREAD": 8}, "source": aws},
        {"env": {"NCCL_PROTO": "Simple"}, "source": "another scope's advice"}]}, "h200/site.yaml")
    knobs = ["NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_BUFFSIZE"]
    space = build_space(site, {Library.NCCL: "2.28.3"}, knobs=knobs)
    documented = documented_envs(site, space)
    expected = {"NCCL_SOCKET_NTHREADS": "2", "NCCL_NSOCKS_PERTHREAD": "8", "NCCL_BUFFSIZE": "8388608"}
    assert documented == [(expected, aws)]

    def evaluate(env, *, validate=False):  # noqa: ANN001, ANN202  (the trials' outcome does not matter here)
        from tuners.evaluation import Evaluation
        return Evaluation(times_us={size: [10.0] for size in (8, 1 << 20)}, validated=validate)

    scope = make_scope(library="nccl", library_version="2.28.3", transport="ccl", nodes=2)
    study = Tuner(scope, space, evaluate, sqlite_url, buckets_for_sizes([8, 1 << 20]), n_trials=3, seed=0,
                  seed_envs=[{}], documented=documented).run()
    first = sorted(study.trials, key=lambda t: t.number)[:3]
    assert [t.user_attrs.get(ROLE) for t in first] == ["defaults", "seeded", DOCUMENTED]
    assert first[2].user_attrs[DOCUMENTED_FROM] == aws and first[2].user_attrs[ENV] == expected

    for bad, message in (
            ({"env": {"NCCL_SOCKET_NTHREADS": 99}, "source": "x"}, r"documented\[0\]\.env\.NCCL_SOCKET_NTHREADS"),
            ({"env": {"NCCL_NVLS_ENABLE": 1}, "source": "x"}, "forbidden or pinned"),
            ({"env": {"NCCL_SOCKET_NTHREADS": 16, "NCCL_NSOCKS_PERTHREAD": 16}, "source": "x"}, "64"),
            ({"env": {"NO_SUCH_KNOB": 1}, "source": "x"}, "not in the catalog"),
            ({"env": {"NCCL_SOCKET_NTHREADS": 2}}, "source")):
        with pytest.raises(CatalogError, match=message):
            catalog.for_site({"pinned": {"NCCL_NVLS_ENABLE": "0"}, "documented": [bad]}, "h200/site.yaml")


def test_the_console_and_recommend_show_the_held_out_gain_and_say_no_candidate_tested(
        tmp_path: Path, catalog: KnobCatalog) -> None:  # noqa: F811
    """Beside the finalization rounds' gain, tune's and pretune's summary and `recommend` print the held-out
    gain (rounds run after the choice, README); a keep-defaults without a tested candidate says so, as its
    .env does."""
    from campaigns.cli.tune import report_lines
    from campaigns.tuning.session import TuningOutcome
    from tuners.recommendation import HeldOut

    held_out = HeldOut(median=0.095, ci_low=0.05, ci_high=0.14, rounds=6, ratios=[1.095] * 6, coverage=0.96875)
    change = mpi_recommendation().model_copy(update={"held_out": held_out})
    study = optuna.create_study()
    lines = report_lines(TuningOutcome(study, {}, recommendation=change))
    (decision,) = [line for line in lines if line.startswith("decision: ")]
    # the interval's level is said (6 rounds: [min, max], 96.9 % whatever the distribution)
    assert decision.startswith("decision: change: +12.0% median speed-up") and \
        "; held out: +9.5% median speed-up of what is deployed (96.9% CI +5.0% .. +14.0%), 6 rounds" in decision
    publish(tmp_path, change, catalog)
    found = lookup(tmp_path, "testsite", "gpusys", op="allreduce", nodes=2)
    assert "(change: +12.0% median speed-up" in found.message and "held out: +9.5%" in found.message
    untested = change.model_copy(update={"decision": "keep-defaults", "gain": None, "held_out": None})
    assert "decision: keep-defaults (no candidate tested)" in report_lines(TuningOutcome(study, {},
                                                                                      recommendation=untested))
    # a size bucket whose own winner is another environment: its held-out gain is that winner's, not deployed
    own = change.per_size[0].model_copy(update={"decision": "change", "env": {"OMPI_MCA_btl_tcp_sndbuf": "4096"},
                                                "gain": change.gain, "held_out": held_out})
    text = env_file_text(change.model_copy(update={"per_size": [own]}), change.env, change.unset)
    joined = " ".join(line.lstrip("#").strip() for line in text.splitlines())  # comments wrap
    assert "held out: +9.5% median speed-up of this bucket's own winner (not deployed)" in joined, text


def test_a_bad_recommendations_file_is_one_line_naming_where(tmp_path: Path) -> None:
    """Malformed YAML names its line, wrong content its first field and how many more problems there are: one
    line each (pydantic's report was 3-43 lines with links)."""
    path = tmp_path / "recommendations.yaml"
    path.write_text("schema_version: 1\nsite: s\nsystem: [x\n")
    with pytest.raises(ValueError) as malformed:
        load_recommendations(path)
    assert str(malformed.value).startswith(f"{path}:4: not a valid recommendations file: malformed YAML")
    path.write_text("schema_version: 1\nsite: s\nsystem: x\nrecommendations: [{scope: 3}, {}]\n")
    with pytest.raises(ValueError) as invalid:
        load_recommendations(path)
    message = str(invalid.value)
    assert "\n" not in message and "errors.pydantic.dev" not in message
    assert message.startswith(f"{path}:4: not a valid recommendations file: recommendations[0].") and "more)" in message
    path.write_text("schema_version: 1\nsite: s\nsystem: x\nrecommendations:\n  - scope: {}\n    decison: x\n")
    with pytest.raises(ValueError) as typo:  # the misspelled key, not the "missing" one it leaves, goes first
        load_recommendations(path)
    assert str(typo.value).startswith(f"{path}:6: not a valid recommendations file: recommendations[0].decison: "
                                      "unknown field (and 16 more)"), str(typo.value)


LOCAL_JOB = ("--site", "local", "--system", "local", "--op", "allreduce", "--nodes", "1")


def edited(path: Path, change: Any) -> None:
    """recommendations.yaml after a hand edit: `change` mutates the loaded document."""
    document = yaml.safe_load(path.read_text())
    change(document)
    path.write_text(yaml.safe_dump(document, sort_keys=False))


@pytest.mark.parametrize(("change", "problem"), [
    (lambda d: d["recommendations"][0]["env"].update(LD_PRELOAD="/tmp/evil.so"),
     "published settings refused: LD_PRELOAD is not a knob of the catalog"),
    (lambda d: d["recommendations"][0]["env"].update(NCCL_NVLS_ENABLE="1"),
     "published settings refused: NCCL_NVLS_ENABLE is forbidden by the knob catalog"),
    (lambda d: d["recommendations"][0]["env"].update(OMPI_MCA_coll_tuned_allreduce_algorithm="bogus"),
     "published settings refused: OMPI_MCA_coll_tuned_allreduce_algorithm"),
    (lambda d: d["recommendations"][0].update(unset=["PATH"]), "published settings refused: unset PATH: not a knob"),
    (lambda d: d["recommendations"][0]["plugin_env"].update(LD_PRELOAD="/tmp/evil.so"),
     "published settings refused: LD_PRELOAD: not a variable of the per-size rules'"),  # exported after env
    (lambda d: d["recommendations"][0].update(unset=["OMPI_MCA_btl_tcp_rcvbuf"]),
     "unset OMPI_MCA_btl_tcp_rcvbuf: not a setting of the site's defaults"),
    (lambda d: d["recommendations"].append(d["recommendations"][0]), "entries 0 and 1 have the same scope"),
    (lambda d: d["recommendations"][0]["per_size"][0].update(max_bytes=4), "max_bytes 4 below min_bytes"),
    # "keep the defaults" above export lines of a change never accepted
    (lambda d: d["recommendations"][0].update(decision="keep-defaults", gain=None),
     "decision keep-defaults, but its settings are not the site's defaults it was measured against (baseline_env): "
     "OMPI_MCA_coll_tuned_allreduce_algorithm, OMPI_MCA_coll_tuned_use_dynamic_rules, UCX_TLS"),
    (lambda d: d["recommendations"][0].update(env={}), "decision change, but its settings are the site's defaults"),
    (lambda d: d["recommendations"][0]["scope"].update(nodes=True), "scope.nodes"),
    (lambda d: d["recommendations"][0]["scope"].update(nodes="1"), "scope.nodes"),
])
def test_recommend_refuses_published_settings_that_publish_would_not_write(
        tmp_path: Path, catalog: KnobCatalog, change: Any, problem: str) -> None:  # noqa: F811
    """A hand-edited recommendations.yaml is checked against the site's catalog before anything is printed (it
    printed `export LD_PRELOAD=...`, a forbidden knob, `unset PATH`, exit 0); two entries of one scope are an
    invalid file (they gave an empty "Say which:")."""
    files = publish(tmp_path, local_recommendation(), catalog)
    edited(files.recommendations, change)
    code, stdout, stderr = commcamp("recommend", "--root", tmp_path, *LOCAL_JOB, "--size", "64K")
    assert code == 2 and stdout == "" and problem in stderr and str(files.recommendations) in stderr, (code, stdout, stderr)


def test_a_forbidden_knob_the_site_pins_is_published_and_recommended(tmp_path: Path) -> None:
    """h200 pins the forbidden NCCL_NVLS_ENABLE to 0: trial 0 and every winner carry it. Publish and recommend
    take it at the pinned value (the first version of the read check refused every h200 scope) and refuse 1."""
    site = KnobCatalog.load().for_site({"pinned": {"NCCL_NVLS_ENABLE": "0"}}, "h200-like")
    rec = mpi_recommendation().model_copy(update={"scope": make_scope(
        site="h200", system="h200", partition="gpu", library="nccl", library_version="2.28.3", transport="ccl",
        nodes=2, gpus_per_node=1), "env": {"NCCL_NVLS_ENABLE": "0", "NCCL_ALGO": "Ring"},
        "baseline_env": {"NCCL_NVLS_ENABLE": "0"}})
    files = publish(tmp_path, rec, site)
    job = ("--root", tmp_path, "--site", "h200", "--system", "h200", "--op", "allreduce", "--nodes", "2")
    code, stdout, stderr = commcamp("recommend", *job)
    assert code == 0 and "export NCCL_NVLS_ENABLE='0'" in stdout, (stdout, stderr)
    edited(files.recommendations, lambda d: d["recommendations"][0]["env"].update(NCCL_NVLS_ENABLE="1"))
    code, stdout, stderr = commcamp("recommend", *job)
    assert code == 2 and "NCCL_NVLS_ENABLE: the site pins it to '0', not '1'" in stderr, (stdout, stderr)
    for change in (lambda d: d["recommendations"][0]["plugin_env"].update(NCCL_NVLS_ENABLE="1"),
                   lambda d: d["recommendations"][0].update(env={"NCCL_ALGO": "Ring"}, unset=["NCCL_NVLS_ENABLE"])):
        edited(files.recommendations, lambda d: d["recommendations"][0]["env"].update(NCCL_NVLS_ENABLE="0"))
        edited(files.recommendations, change)  # the pin set to 1 after env, or unset: NCCL's default, NVLS on
        code, stdout, stderr = commcamp("recommend", *job)
        assert code == 2 and "published settings refused: " in stderr and "NCCL_NVLS_ENABLE" in stderr, stderr
    with pytest.raises(UnsafeValueError, match="NCCL_NVLS_ENABLE is forbidden"):
        publish(tmp_path, rec.model_copy(update={"env": {"NCCL_NVLS_ENABLE": "1"}}), KnobCatalog.load())


def test_recommend_refuses_a_scope_whose_per_size_rules_are_gone(tmp_path: Path, catalog: KnobCatalog,
                                                                 nccl_recommendation: Recommendation) -> None:  # noqa: F811
    """The environment points the library at a rule file, tuner config or tuner plugin that was deleted or garbled:
    the job would run without the per-size rules, so nothing is printed (exit 2, naming the file)."""
    from test_per_size import result_with

    rec = with_per_size(local_recommendation(), result_with("allreduce", "ring", 4, 65536, 1 << 20))
    publish(tmp_path, rec, catalog)
    (rules,) = (tmp_path / "local" / "local").glob("*.coll_tuned_rules")
    code, stdout, _ = commcamp("recommend", "--root", tmp_path, *LOCAL_JOB, "--size", "64K")
    assert code == 0 and "rule file" in stdout
    good = rules.read_text()
    for garbled in ("garbage here\n", "", good[:len(good) // 2]):  # Open MPI would run on without its rules
        rules.write_text(garbled)
        code, stdout, stderr = commcamp("recommend", "--root", tmp_path, *LOCAL_JOB, "--size", "64K")
        assert code == 2 and stdout == "" and f"its per-size rules {rules} cannot be used" in stderr, (garbled, stderr)
    rules.unlink()
    code, stdout, stderr = commcamp("recommend", "--root", tmp_path, *LOCAL_JOB, "--size", "64K")
    assert code == 2 and stdout == "" and f"its per-size rules {rules} cannot be used" in stderr, (stdout, stderr)
    gpu = with_plugin_rows(nccl_recommendation, "allreduce", 8, 32768, "Tree/LL/8")
    plugin = tmp_path / "libnccl-tuner-commcamp.so"
    plugin.write_bytes(b"")
    files = publish(tmp_path, gpu, catalog, plugin_library=str(plugin))
    job = ("--root", tmp_path, "--site", gpu.scope.site, "--system", gpu.scope.system, "--op", "allreduce",
           "--nodes", str(gpu.scope.nodes), "--size", "1K")
    plugin.unlink()  # NCCL goes on without a plugin it cannot load: the rules would not apply
    code, stdout, stderr = commcamp("recommend", *job)
    assert code == 2 and stdout == "" and f"its tuner plugin {plugin} cannot be read" in stderr, (stdout, stderr)
    plugin.write_bytes(b"")
    code, stdout, stderr = commcamp("recommend", *job)
    # a plugin row has no control variable: its mechanism and the tuner config, not "plugin None=None"
    assert code == 0 and "Tree/LL/8 (plugin; range [8, 32768] B" in stdout and "None" not in stdout, stdout
    assert f"tuner config {files.tuner_config}" in stdout
    assert files.tuner_config is not None
    files.tuner_config.write_text("allreduce,garbage\n")
    code, stdout, stderr = commcamp("recommend", *job)
    assert code == 2 and f"its per-size rules {files.tuner_config} cannot be used" in stderr, (stdout, stderr)


def test_recommend_says_what_a_keep_defaults_scope_with_per_size_rules_deploys(tmp_path: Path,
                                                                               catalog: KnobCatalog) -> None:  # noqa: F811
    """The environment stayed the defaults', the per-size rules passed the deployed-set check: recommend printed
    only "keep-defaults" above the lines that enable the rules, and the module said "tuned" whatever it was."""
    from test_per_size import result_with

    from tuners.recommendation import DeployedGain, HeldOut

    gain = HeldOut(median=0.2, ci_low=0.1, ci_high=0.3, rounds=6, ratios=[1.2] * 6)
    rec = with_per_size(local_recommendation(), result_with("allreduce", "ring", 4, 65536, 1 << 20))
    rec = rec.model_copy(update={"decision": "keep-defaults", "env": {}, "gain": None,
                                 "deployed": DeployedGain(overall=gain, buckets={}, rounds=6)})
    files = publish(tmp_path, rec, catalog)
    code, stdout, stderr = commcamp("recommend", "--root", tmp_path, *LOCAL_JOB)
    assert code == 0 and "(keep-defaults (no candidate tested)); deployed set (environment + per-size rules) vs " \
        "the site's defaults, 6 rounds: overall +20.0%" in stdout, (stdout, stderr)
    assert "export OMPI_MCA_coll_tuned_dynamic_rules_filename=" in stdout
    assert 'whatis("commcamp communication settings (keep-defaults): ' in files.modulefile.read_text()


def test_scopes_of_two_rank_layouts_are_published_side_by_side_and_recommend_asks_which(
        tmp_path: Path, catalog: KnobCatalog) -> None:  # noqa: F811
    """A CPU scope has 1 GPU per node whatever its ranks: a tune with 4 ranks per node replaced the published
    1-rank one (one scope), and recommend answered any layout with it."""
    local = local_recommendation()
    one, four = (local.model_copy(update={"scope": local.scope.model_copy(update={"tasks_per_node": tpn}),
                                          "env": {**local.env, "OMPI_MCA_coll_tuned_allreduce_algorithm": algorithm}})
                 for tpn, algorithm in ((1, "ring"), (4, "recursive_doubling")))
    files = [publish(tmp_path, rec, catalog) for rec in (one, four)]
    assert files[0].env_file != files[1].env_file and files[1].env_file.name.endswith("_n1_g1_t4.env")
    assert len(load_recommendations(files[0].recommendations).recommendations) == 2
    code, stdout, stderr = commcamp("recommend", "--root", tmp_path, *LOCAL_JOB)
    assert code == 3 and "Say which: --tasks-per-node 1 or 4" in stdout, (stdout, stderr)
    code, stdout, _ = commcamp("recommend", "--root", tmp_path, *LOCAL_JOB, "--tasks-per-node", "4")
    assert code == 0 and "tasks_per_node=4" in stdout
    assert "export OMPI_MCA_coll_tuned_allreduce_algorithm='recursive_doubling'" in stdout
    code, stdout, _ = commcamp("recommend", "--root", tmp_path, *LOCAL_JOB, "--tasks-per-node", "2")
    assert code == 3 and "nothing measured" in stdout
    assert "; published: --tasks-per-node 1 or 4" in stdout, stdout  # named, as another library version is
    code, _, stderr = commcamp("recommend", "--root", tmp_path, *LOCAL_JOB, "--tasks-per-node", "0")
    assert code == 2 and "--tasks-per-node 0 must be at least 1" in stderr


def test_a_scope_published_before_it_named_its_ranks_per_node_is_replaced_by_its_next_tune(
        tmp_path: Path, catalog: KnobCatalog) -> None:  # noqa: F811
    """An entry without ranks per node (published before scopes named them) and the same scope tuned again: one
    entry, the newer (two would leave recommend asking "--tasks-per-node None or 2")."""
    old = local_recommendation()
    new = old.model_copy(update={"scope": old.scope.model_copy(update={"tasks_per_node": 2})})
    publish(tmp_path, old, catalog)
    files = publish(tmp_path, new, catalog)
    assert [r.scope for r in load_recommendations(files.recommendations).recommendations] == [new.scope]
    code, stdout, _ = commcamp("recommend", "--root", tmp_path, *LOCAL_JOB)
    assert code == 0 and "tasks_per_node=2" in stdout


def test_publishing_a_scope_again_says_which_entry_it_replaced(tmp_path: Path, catalog: KnobCatalog) -> None:  # noqa: F811
    """A scope tuned again on other sizes replaced its published entry without a word, and recommend then
    called the sizes measured before 'not measured'."""
    rec = mpi_recommendation()
    assert publish(tmp_path, rec, catalog).replaced is None
    other_sizes = rec.model_copy(update={"date": "2026-11-28T06:00:00+00:00", "per_size": [
        rec.per_size[0].model_copy(update={"bucket": "8B-64KiB", "max_bytes": 1 << 16})]})
    again = publish(tmp_path, other_sizes, catalog)
    assert again.replaced == "sizes=8B-1MiB, change, published 2026-11-21T12:00:00+00:00", again.replaced
    assert again.to_json()["replaced"] == again.replaced
