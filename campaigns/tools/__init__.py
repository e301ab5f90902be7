"""Scripts that produced committed evidence or measure commcamp itself (tuning and per-size demonstrations, the
store's ingest benchmark); not part of `commcamp`."""
