"""The workspace (--workspace, COMMCAMP_HOME), the site search path (COMMCAMP_SITE_PATH) and `site new`,
in process. tests/test_install.py runs the same from an installed wheel."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from campaigns import paths
from campaigns.cli.app import app
from campaigns.model.site import available_sites, find_site_file
from fixtures_cli import commcamp

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (paths.HOME_ENV, paths.SITE_PATH_ENV, paths.DATA_ENV):
        monkeypatch.setenv(name, "")  # what the test sets, the command too, is undone after it
        monkeypatch.delenv(name)


def test_a_checkout_writes_to_its_results_unless_a_workspace_is_named(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    assert paths.workspace() == REPO / "results" and paths.build_dir() == REPO / "build"
    assert paths.CHECKOUT == REPO and paths.BENCH_SRC == REPO / "bench_src"
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path))
    assert paths.runs_dir() == tmp_path / "runs" and paths.build_dir() == tmp_path / "build"
    assert paths.recommendations_dir() == tmp_path / "recommendations"


def test_workspace_option_names_the_workspace_for_the_command_and_its_children(tmp_path: Path) -> None:
    code, out, err = commcamp("--workspace", tmp_path / "ws", "paths")
    assert code == 0, err
    assert f"workspace: {tmp_path / 'ws'}" in out.splitlines()
    assert f"results database: sqlite:///{tmp_path / 'ws' / 'commcamp.db'}" in out.splitlines()
    # what ReFrame and Slurm workers inherit (commcamp() undoes it for the tests that follow)
    CliRunner().invoke(app, ["--workspace", str(tmp_path / "ws"), "paths"])
    assert os.environ[paths.HOME_ENV] == str(tmp_path / "ws")
    code, out, _ = commcamp("--workspace", tmp_path / "ws", "paths", "--env")
    assert f"export COMMCAMP_HOME={tmp_path / 'ws'}" in out.splitlines()


def test_a_site_path_directory_that_is_not_there_is_warned_about(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    """A mistyped $COMMCAMP_SITE_PATH directory was searched in silence: a site of the same name among the shipped
    examples (a site's own `local`) ran instead. Every command says so on its standard error."""
    (tmp_path / "sites").mkdir()
    monkeypatch.setenv("COMMCAMP_SITE_PATH", f"{tmp_path / 'sties'}:{tmp_path / 'sites'}")
    code, out, err = commcamp("paths", "--env")
    assert code == 0 and "warning" not in out, out
    assert err.strip() == (f"warning: $COMMCAMP_SITE_PATH names {tmp_path / 'sties'}, which is not a directory: no "
                           "site is found there (`commcamp site new` makes the first one)")


def test_tune_and_run_make_a_new_workspace(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A workspace that does not exist yet is made on first use, by tune (its study lives in the workspace's
    database) as by run (which opens the store at that database's URL)."""
    from campaigns.store import URL_ENV, open_store, workspace_url

    monkeypatch.delenv(URL_ENV, raising=False)
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "unused"))  # undone after the test, as --workspace sets it
    code, out, err = commcamp("--workspace", tmp_path / "new-ws", "tune", "--site", "local", "--system", "local:cpu",
                              "--library", "openmpi", "--op", "allreduce", "--sizes", "64K", "--dry-run")
    assert code == 0, out + err
    assert (tmp_path / "new-ws").is_dir() and "knobs asked for" in out
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "run-ws"))
    with open_store(workspace_url()):  # `commcamp run` opens the store at db or default_url()
        pass
    assert (tmp_path / "run-ws" / "commcamp.db").is_file()


def test_a_workspace_that_takes_no_run_directories_is_named_as_such(tmp_path: Path) -> None:
    """COMMCAMP_HOME a file: `run` blamed --runs-dir, which was not given."""
    (tmp_path / "afile").write_text("x\n")
    spec = REPO / "campaigns" / "smoke.yaml"
    code, out, err = commcamp("run", spec, "--dry-run", "--db", f"sqlite:///{tmp_path / 'r.db'}",
                              env={paths.HOME_ENV: str(tmp_path / "afile")})
    assert code == 2 and "the workspace's runs directory (--runs-dir names another): cannot write" in err, out + err


def test_run_refuses_a_site_whose_scheduler_reframe_does_not_know(tmp_path: Path) -> None:
    """`scheduler: lcoal` passed `site check`, and `run` stored every case as an error whose reason, ReFrame's "no
    such scheduler", was only in reframe.out: refused before anything runs or is made."""
    import shutil

    shutil.copytree(REPO / "site_configs" / "local", tmp_path / "sites" / "typo")
    site_yaml = tmp_path / "sites" / "typo" / "site.yaml"
    site_yaml.write_text(site_yaml.read_text().replace("name: local\n", "name: typo\n", 1)
                         .replace("scheduler: local", "scheduler: lcoal"))
    code, out, err = commcamp("run", REPO / "campaigns" / "smoke.yaml", "--site", "typo", "--db",
                              f"sqlite:///{tmp_path / 'r.db'}", "--runs-dir", tmp_path / "runs",
                              env={"COMMCAMP_SITE_PATH": str(tmp_path / "sites")})
    assert code == 2 and "scheduler: ReFrame has no such scheduler: 'lcoal'" in err, out + err
    assert not (tmp_path / "r.db").exists() and not (tmp_path / "runs").exists()


def test_run_names_a_modules_system_reframe_cannot_find(tmp_path: Path) -> None:
    """`modules_system: lmod` where there is no Lmod: every case became an error whose reason ("could not find a
    sane Lmod installation") was only in reframe.out. Refused before anything runs, the dry run aside."""
    import shutil

    shutil.copytree(REPO / "site_configs" / "local", tmp_path / "sites" / "lmodless")
    site_yaml = tmp_path / "sites" / "lmodless" / "site.yaml"
    site_yaml.write_text(site_yaml.read_text().replace("name: local\n", "name: lmodless\n", 1)
                         .replace("    hostnames: ['.*']\n", "    hostnames: ['.*']\n    modules_system: lmod\n"))
    environ = {"COMMCAMP_SITE_PATH": str(tmp_path / "sites"), "LMOD_CMD": ""}
    code, out, err = commcamp("run", REPO / "campaigns" / "smoke.yaml", "--site", "lmodless", "--db",
                              f"sqlite:///{tmp_path / 'r.db'}", "--runs-dir", tmp_path / "runs", env=environ)
    assert code == 2 and "modules_system lmod: ReFrame: could not find a sane Lmod installation" in err, out + err
    assert not (tmp_path / "r.db").exists() and not (tmp_path / "runs").exists()


def test_site_search_path_comes_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "site.yaml").write_text("schema_version: 1\n")
    monkeypatch.setenv(paths.SITE_PATH_ENV, str(tmp_path))
    assert find_site_file("local") == tmp_path / "local" / "site.yaml"
    assert "h200" in available_sites() and find_site_file("nosuchsite") is None


def test_site_new_scaffolds_a_checked_site_where_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    code, out, err = commcamp("site", "new", "mysite", "--from", "local", "--dir", tmp_path)
    assert code == 0, err
    assert out.strip() == str(tmp_path / "mysite") and "add " in err  # not on the search path yet
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mysite"]
    assert "name: mysite\n" in (tmp_path / "mysite" / "site.yaml").read_text()
    assert 'eval "$(commcamp paths --env)"' in (tmp_path / "mysite" / "env.sh").read_text()
    # sourced without COMMCAMP_HOME, ReFrame's results database lies in the workspace the paths line exports
    # (it was computed before that line ran: beside the site repository, e.g. $HOME/results/reframe)
    environ = {k: v for k, v in os.environ.items() if k not in ("COMMCAMP_HOME", "RFM_SQLITE_DB_FILE")}
    environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environ['PATH']}"
    shown = subprocess.run(["bash", "-c", f'. {tmp_path}/mysite/env.sh && echo "$COMMCAMP_HOME" && '
                            'echo "$RFM_SQLITE_DB_FILE"'], env=environ, capture_output=True, text=True, check=True)
    home, database = shown.stdout.split()
    assert database == f"{home}/reframe/results.db", shown.stdout
    monkeypatch.setenv(paths.SITE_PATH_ENV, str(tmp_path))
    assert commcamp("site", "check", "mysite")[1].strip() == "site mysite: ok"
    code, _, err = commcamp("site", "new", "mysite", "--from", "local", "--dir", tmp_path)
    assert code == 2 and "exists" in err


def test_site_new_says_which_site_the_new_one_hides_and_refuses_one_that_would_be_hidden(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`site new local` hid the shipped `local` without a word (make demo's spec then ran on the Slurm template):
    it is said (an override may be meant: an unverified example replaced by the real site). A new site that an
    earlier directory of the search path hides would never be used: refused, nothing written."""
    first, second = tmp_path / "first", tmp_path / "second"
    monkeypatch.setenv("COMMCAMP_SITE_PATH", f"{first}:{second}")
    code, out, err = commcamp("site", "new", "local", "--from", "generic-slurm", "--dir", first)
    assert code == 0 and "site local hides" in err and "a shipped example" in err, out + err
    code, out, err = commcamp("site", "new", "local", "--from", "generic-slurm", "--dir", second)
    assert code == 2 and f"site 'local' is {first / 'local'}, which comes first" in err, out + err
    assert not (second / "local").exists()


def test_site_new_writes_nothing_when_the_new_site_has_problems(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    templates = tmp_path / "templates"
    (templates / "broken").mkdir(parents=True)
    for name in ("site.yaml", "reframe_config.py"):
        text = (REPO / "site_configs" / "local" / name).read_text()
        (templates / "broken" / name).write_text(text.replace("name: local", "name: broken"))
    (templates / "broken" / "env.sh").write_text("# sets nothing\n")
    monkeypatch.setenv(paths.SITE_PATH_ENV, str(templates))
    target = tmp_path / "sites"
    code, _, err = commcamp("site", "new", "newsite", "--from", "broken", "--dir", target)
    assert code == 2 and "does not export RFM_CONFIG_FILES" in err and f"{target}/newsite/env.sh" in err
    assert not target.exists()  # nothing written: not even the --dir it made (it was left behind, empty)
    code, _, err = commcamp("site", "new", "newsite", "--from", "broken", "--dir", target / "deep" / "er")
    assert code == 2 and not target.exists()
    target.mkdir()
    # --dir a file, or where no directory can be made: a message, not a traceback
    (tmp_path / "afile").write_text("x\n")
    for where in (tmp_path / "afile", Path("/proc/sys"), tmp_path / "made" / ("x" * 300)):  # a name too long
        code, _, err = commcamp("site", "new", "newsite", "--dir", where)
        assert code == 2 and f"--dir {where}: cannot create the site there" in err and "Traceback" not in err, err
    assert not (tmp_path / "made").exists()  # made for it, then the next level failed: removed again
    code, _, err = commcamp("site", "new", "9lives", "--dir", target)
    assert code == 2 and "site name '9lives'" in err
    code, _, err = commcamp("site", "new", "other", "--from", "nosuchsite", "--dir", target)
    assert code == 2 and "unknown site 'nosuchsite'" in err and list(target.iterdir()) == []
