# Source from anywhere: `. site_configs/localslurm/env.sh`, then `reframe -c reframe_checks -r`.
# Site "localslurm": the cluster of site_configs/localslurm/cluster/cluster.sh (start it first with
# `cluster.sh start`; LOCALSLURM_ID / LOCALSLURM_NNODES select another cluster id or size). The cluster's
# `env` adds SLURM_CONF and puts its sacct shim first in PATH (ReFrame's slurm scheduler polls sacct).
_commcamp_site=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export RFM_CONFIG_FILES="$_commcamp_site/reframe_config.py"
. "${COMMCAMP_DATA:-$_commcamp_site/../..}/site_configs/reframe_results.sh"  # ReFrame's results database
eval "$("$_commcamp_site/cluster/cluster.sh" env)"
unset _commcamp_site
