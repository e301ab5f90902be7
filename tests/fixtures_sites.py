"""Copies of the example sites with an edited site.yaml, for tests that need a site the shipped ones are not."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

SITE_CONFIGS = Path(__file__).resolve().parents[1] / "site_configs"


def copy_site(tmp_path: Path, name: str, edit: Callable[[dict[str, Any]], None] | None = None,
              source: str | None = None, site_dir: Path | None = None) -> Path:
    """A copy of site_configs/<source or name> (site.yaml edited by `edit(data)`) in `site_dir` (default
    tmp_path/site-<name>) whose reframe_config.py loads it; returns the copy's reframe_config.py. A copy in
    a directory named after the site on $COMMCAMP_SITE_PATH stands in for the shipped site."""
    site_dir = site_dir or tmp_path / f"site-{name}"
    site_dir.mkdir(parents=True)
    data = yaml.safe_load((SITE_CONFIGS / (source or name) / "site.yaml").read_text())
    if edit:
        edit(data)
    (site_dir / "site.yaml").write_text(yaml.safe_dump(data))
    (site_dir / "reframe_config.py").write_text(
        f"import sys\nsys.path.insert(0, {str(SITE_CONFIGS)!r})\n"
        "from reframe_site import site_configuration_for\nsite_configuration = site_configuration_for(__file__)\n")
    return site_dir / "reframe_config.py"
