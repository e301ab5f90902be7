"""commcamp tuner: knob catalog, Optuna study, statistics and recommendation files (see README.md)."""
