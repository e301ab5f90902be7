"""ReFrame configuration of site 'localslurm': the local Slurm cluster of cluster/cluster.sh (usage: env.sh). Data: site.yaml beside this file.

`reframe -C site_configs/localslurm/reframe_config.py ...` works without env.sh too: when SLURM_CONF is
not set, ReFrame (and the jobs it submits) get the cluster's SLURM_CONF and PATH (its sacct shim first)
from `cluster.sh env`, as env.sh would set them."""
import os
import shlex
import subprocess
import sys
from pathlib import Path

# reframe_site.py is in $COMMCAMP_DATA/site_configs (commcamp sets it; so does env.sh of a site kept outside
# commcamp's examples), else beside this site's directory. Appended, never inserted first: ReFrame loads this
# file inside its temp_sys_path, which removes sys.path[len before] afterwards (the last entry if one was
# inserted at 0: a wheel install then lost its dependencies' directory).
sys.path.append(os.path.join(os.environ["COMMCAMP_DATA"], "site_configs") if os.environ.get("COMMCAMP_DATA")
                else str(Path(__file__).resolve().parents[1]))
from reframe_site import site_configuration_for  # noqa: E402

if "SLURM_CONF" not in os.environ:
    _exports = subprocess.run([str(Path(__file__).resolve().with_name("cluster") / "cluster.sh"), "env"],
                              capture_output=True, text=True, check=True).stdout
    for _line in _exports.splitlines():
        _name, _value = shlex.split(_line)[1].split("=", 1)  # export NAME=VALUE
        if _name in ("SLURM_CONF", "PATH"):
            os.environ[_name] = _value

site_configuration = site_configuration_for(__file__)
