"""ReFrame configuration of site 'generic-slurm': a template for a new Slurm site (usage: site.yaml, README.md). Data: site.yaml beside this file."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reframe_site import site_configuration_for  # noqa: E402

site_configuration = site_configuration_for(__file__)
