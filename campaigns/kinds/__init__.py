"""The campaign kinds beyond a plain run: health (nightly verdicts, pair isolation, attribution) and characterize
(placements)."""
