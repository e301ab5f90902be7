"""ReFrame configuration of site 'alps': CSCS Alps GH200, not verified on the machine (usage: site.yaml). Data: site.yaml beside this file."""
import os
import sys
from pathlib import Path

# reframe_site.py is in $COMMCAMP_DATA/site_configs (commcamp sets it; so does env.sh of a site kept outside
# commcamp's examples), else beside this site's directory. Appended, never inserted first: ReFrame loads this
# file inside its temp_sys_path, which removes sys.path[len before] afterwards (the last entry if one was
# inserted at 0: a wheel install then lost its dependencies' directory).
sys.path.append(os.path.join(os.environ["COMMCAMP_DATA"], "site_configs") if os.environ.get("COMMCAMP_DATA")
                else str(Path(__file__).resolve().parents[1]))
from reframe_site import site_configuration_for  # noqa: E402

site_configuration = site_configuration_for(__file__)
