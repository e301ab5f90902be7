"""One parser per format that commcamp reads.

- `nccl_tests`: nccl-tests / rccl-tests text output and nccl-tests JSON (`-J`, JSON_FILE_VERSION 3,
  per-iteration data with `-I`).
- `osu`: OSU micro-benchmark text output (osu_latency, osu_bw, osu_bibw, the collectives, osu_xccl_*).
- `foreign`: turns either into commbench-schema records (with a `source` field naming the benchmark), so
  the store, health, report and export treat them like commbench's own; their statistics and busbw are
  commbench's definitions (campaigns.model.records: sample_stats, busbw_factor), and `check_filter_names` knows
  the names such records can have (the filters of `results list|export` and `report`).
- commbench JSON Lines: `campaigns.model.records`; YAML: `campaigns.model.yamlio`.

The parsers use the standard library only: scripts that run on a GPU machine without commcamp's
dependencies (bench_src/scripts, bench_src/nccl_tuner/scripts) import them too.
"""
