"""Where commcamp keeps things by default (a module without dependencies: the CLI imports it at start)."""
from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RUNS_DIR = REPO_ROOT / "results" / "runs"
DEFAULT_RECOMMENDATIONS_DIR = REPO_ROOT / "results" / "recommendations"
DEFAULT_PLUGIN = REPO_ROOT / "build" / "nccl_tuner-release" / "libnccl-tuner-commcamp.so"  # commcamp plugin build
