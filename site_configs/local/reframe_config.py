"""ReFrame configuration of site 'local': this machine, one node (usage: env.sh). Data: site.yaml beside this file."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reframe_site import site_configuration_for  # noqa: E402

site_configuration = site_configuration_for(__file__)
