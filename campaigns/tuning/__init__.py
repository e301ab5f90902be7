"""Tuning campaigns: the tuning spec, the executors that run commbench for a trial and the evaluator that judges it,
the session (trials, finalize, publish, summary)."""
