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


def test_a_broken_build_is_reported(tmp_path: Path) -> None:
    blocker = tmp_path / "build"
    blocker.write_text("a file where the build directory should be\n")
    code, _, err = commcamp("plugin", "build", "--build-dir", str(blocker))
    assert code == 1 and "plugin build failed" in err


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
