"""ReFrame configuration of site 'local' (data: site.yaml beside this file).

    reframe -C site_configs/local/reframe_config.py -c reframe_checks -r
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reframe_site import site_configuration as _site_configuration  # noqa: E402

site_configuration = _site_configuration(Path(__file__).with_name("site.yaml"))
