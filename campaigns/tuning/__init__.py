"""Tuning campaigns: the tuning spec, the executors that run commbench for a trial, the session (trials, finalize, publish, summary)."""
