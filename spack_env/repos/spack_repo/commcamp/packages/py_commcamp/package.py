# commcamp: Spack recipe of commcamp itself (the `commcamp` command; pyproject.toml of the repository).
# Package API v2.2 (Spack >= 1.0); not executed here: Spack cannot be installed on the project's
# machines (spack_env/README.md). spack_env/spack_check.py (tests/test_spack_env.py) reads it with `ast`
# and checks its dependencies against pyproject.toml's pins and against Spack's builtin package names.

from spack_repo.builtin.build_systems.python import PythonPackage

from spack.package import *


class PyCommcamp(PythonPackage):
    """Slurm-integrated campaign runner and tuner for GPU interconnects: runs the ReFrame checks of
    commbench, nightly health checks, an Optuna tuner of communication settings, and publishes
    recommendation files. The wheel ships commbench's and the tuner plugin's sources, the ReFrame
    checks, the example sites and the knob catalog (`commcamp bench build` builds commbench from them).

    No release is published: build it from a commcamp checkout with a Spack environment that has a
    `develop:` entry (spack_env/<site>/spack.yaml: develop: {py-commcamp: {spec: py-commcamp@=0.1.0,
    path: ../..}})."""

    license("BSD-3-Clause")

    version("0.1.0")

    # psycopg 3 (pyproject's PostgreSQL driver) is not a Spack builtin package; psycopg2 is, and
    # SQLAlchemy drives it with postgresql+psycopg2:// URLs.
    variant("postgresql", default=False, description="PostgreSQL results store and parallel tuning workers")

    depends_on("python@3.11:", type=("build", "run"))
    depends_on("py-setuptools@77:", type="build")

    # pyproject.toml's pins, exactly: a campaign's numbers must be reproducible with the same toolchain.
    with default_args(type=("build", "run")):
        depends_on("reframe@=4.10.4")
        depends_on("py-optuna@=5.0.0")
        depends_on("py-sqlalchemy@=2.1.9")
        depends_on("py-alembic@=1.20.1")
        depends_on("py-pydantic@=2.14.3")
        depends_on("py-pyyaml@=6.0.3")
        depends_on("py-jsonschema@=4.26.0")
        depends_on("py-rich@=15.0.0")
        depends_on("py-typer@=0.29.1")
        depends_on("py-plotly@=7.1.0")
        depends_on("py-pandas@=3.1.1")
        depends_on("py-pyarrow@=26.0.1")
        depends_on("py-scipy@=1.17.1")
        depends_on("py-packaging@=26.3")
        # Imported directly (records, store, statistics); pandas and scipy bring the version.
        depends_on("py-numpy")
        depends_on("py-psycopg2", when="+postgresql")

    # `commcamp bench build` / `plugin build` and the ReFrame build fixture compile the shipped sources.
    depends_on("cmake@3.18:", type="run")
    depends_on("gmake", type="run")
