"""`commcamp plugin build|path|install`: the tuner plugin built by its CMake project, located and installed."""
from __future__ import annotations

import subprocess
from pathlib import Path

from fixtures_cli import commcamp
from test_nccl_tuner import EXPORTED  # what the plugin exports: the tuner interfaces and the control path


def test_build_path_and_install(tmp_path: Path) -> None:
    build = tmp_path / "build"
    code, out, err = commcamp("plugin", "path", "--build-dir", str(build))
    assert code == 1 and "no plugin at" in err and "commcamp plugin build" in err
    code, out, err = commcamp("plugin", "build", "--build-dir", str(build))
    assert code == 0, err
    built = Path(out.strip())
    assert built == (build / "libnccl-tuner-commcamp.so").resolve() and built.is_file()
    code, out, _ = commcamp("plugin", "path", "--build-dir", str(build))
    assert code == 0 and Path(out.strip()) == built
    prefix = tmp_path / "prefix"
    code, out, err = commcamp("plugin", "install", "--prefix", str(prefix), "--build-dir", str(build))
    assert code == 0, err
    installed = Path(out.strip())
    assert installed == prefix.resolve() / "lib" / "libnccl-tuner-commcamp.so"
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(installed)], capture_output=True, text=True,
                             check=True).stdout
    assert {line.split()[-1] for line in symbols.splitlines()} == EXPORTED
    assert not any(p.name.endswith(".a") for p in prefix.rglob("*"))  # only the plugin is installed


def test_a_build_directory_that_is_a_file_is_bad_input(tmp_path: Path) -> None:
    blocker = tmp_path / "build"
    blocker.write_text("a file where the build directory should be\n")
    code, _, err = commcamp("plugin", "build", "--build-dir", str(blocker))
    assert code == 2 and f"--build-dir {blocker}: not a directory" in err, err
    assert blocker.read_text() == "a file where the build directory should be\n"


def test_a_build_of_another_project_or_a_user_s_files_are_never_removed(tmp_path: Path) -> None:
    """`plugin build --build-dir DIR` where DIR was a CMake build of another project (its CMakeCache.txt naming
    other sources) deleted DIR with the user's files in it, exit 0: only a build directory commcamp made (its cache
    names commcamp's projects, or bench_src/Makefile's marker) is emptied; anything else is refused, exit 2, naming
    --build-dir, and left as it was. `bench build` refuses such a variant directory too, before any build."""
    other = tmp_path / "other" / "build"
    other.mkdir(parents=True)
    (other / "CMakeCache.txt").write_text("CMAKE_HOME_DIRECTORY:INTERNAL=/home/me/myproject\n"
                                          "CMAKE_PROJECT_NAME:STATIC=myproject\n")
    (other / "results.txt").write_text("a week of work\n")
    before = sorted(p.name for p in other.iterdir())
    code, _, err = commcamp("plugin", "build", "--build-dir", other)
    assert code == 2 and f"--build-dir {other}: a CMake build of another project (myproject" in err, err
    assert sorted(p.name for p in other.iterdir()) == before
    code, _, err = commcamp("plugin", "install", "--prefix", tmp_path / "prefix", "--build-dir", other)
    assert code == 2 and "a CMake build of another project" in err and (other / "results.txt").is_file()

    files = tmp_path / "mine"
    files.mkdir()
    (files / "notes.txt").write_text("mine\n")
    code, _, err = commcamp("plugin", "build", "--build-dir", files)
    assert code == 2 and "holds files but no CMake build commcamp made" in err and (files / "notes.txt").is_file()

    variant = tmp_path / "bench" / "cpu-openmpi"  # bench build: the Makefile rm -rf'ed a directory without its marker
    variant.mkdir(parents=True)
    (variant / "notes.txt").write_text("mine\n")
    code, _, err = commcamp("bench", "build", "cpu-openmpi", "--build-dir", tmp_path / "bench")
    assert code == 2 and f"{variant}: holds files but no CMake build commcamp made" in err, err
    assert (variant / "notes.txt").is_file()


def test_bench_src_makefile_empties_only_its_own_build_directories(tmp_path: Path) -> None:
    """bench_src/Makefile starts a variant's build directory afresh when its configure command changed (rm -rf): a
    BUILD_DIR whose variant directory holds anything else stops it (exit 2); `make clean` leaves such a one alone."""
    from campaigns import paths

    variant = tmp_path / "cpu-openmpi"
    variant.mkdir()
    (variant / "notes.txt").write_text("mine\n")
    make = subprocess.run(["make", "-C", str(paths.BENCH_SRC), f"BUILD_DIR={tmp_path}", "cpu-openmpi"],
                          capture_output=True, text=True, check=False)
    assert make.returncode != 0 and "holds files but no commbench build: not removed" in make.stderr, make.stderr
    clean = subprocess.run(["make", "-C", str(paths.BENCH_SRC), f"BUILD_DIR={tmp_path}", "clean"],
                           capture_output=True, text=True, check=False)
    assert clean.returncode == 0 and "not a commbench build directory, left alone" in clean.stderr, clean.stderr
    assert (variant / "notes.txt").read_text() == "mine\n"


def test_a_build_directory_configured_from_another_install_s_sources_is_configured_again(tmp_path: Path) -> None:
    """A workspace shared by two installs at different prefixes (Spack's hashed prefixes, /opt/commcamp/0.1 ->
    0.2): the build directory's CMake cache names the other tree's sources. CMake refused it ("does not match the
    source ... used to generate cache") and every later build failed; `bench build` rebuilt the other tree's
    sources. Now such a directory is configured again from the shipped sources; one of these sources is kept."""
    from campaigns import paths
    from campaigns.cli.bench import forget_other_sources_build

    build = tmp_path / "build"
    assert commcamp("plugin", "build", "--build-dir", str(build))[0] == 0
    cache = build / "CMakeCache.txt"
    ours = f"CMAKE_HOME_DIRECTORY:INTERNAL={paths.PLUGIN_SRC.resolve()}"
    assert ours in cache.read_text()
    cache.write_text(cache.read_text().replace(ours, "CMAKE_HOME_DIRECTORY:INTERNAL=/opt/commcamp/0.1/nccl_tuner"))
    code, out, err = commcamp("plugin", "build", "--build-dir", str(build))
    assert code == 0, err
    assert ours in cache.read_text() and Path(out.strip()).is_file()
    forget_other_sources_build(build, paths.PLUGIN_SRC)  # its own sources: kept as it is
    assert cache.is_file()
