"""The campaign kinds: `table` (what `commcamp run` does after the cases of a run, characterize or health
campaign), health (nightly verdicts, pair isolation, attribution); placements are campaigns/slurm/placement.py."""
