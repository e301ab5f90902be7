"""Shared pytest fixtures. Each area keeps its fixtures in tests/fixtures_<area>.py; import them here."""
