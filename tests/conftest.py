"""Shared pytest fixtures. Each area keeps its fixtures in tests/fixtures_<area>.py; import them here."""
from fixtures_store import *  # noqa: E402,F401,F403  (results store fixtures)
from fixtures_slurm import *  # noqa: E402,F401,F403  (local Slurm cluster fixtures)
from fixtures_bench import *  # noqa: E402,F401,F403  (commbench build and launch fixtures)
from fixtures_pg import *  # noqa: E402,F401,F403  (one PostgreSQL server per session)
