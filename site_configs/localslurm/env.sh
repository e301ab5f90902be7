# Source from anywhere: `. site_configs/localslurm/env.sh`, then `reframe -c reframe_checks -r`.
# Site "localslurm": the cluster of site_configs/localslurm/cluster/cluster.sh (start it first with
# `cluster.sh start`; LOCALSLURM_ID / LOCALSLURM_NNODES select another cluster id or size). The cluster's
# `env` adds SLURM_CONF and puts its sacct shim first in PATH (ReFrame's slurm scheduler polls sacct).
_commcamp_site=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export RFM_CONFIG_FILES="$_commcamp_site/reframe_config.py"
# ReFrame's results storage (`reframe --list-stored-sessions`, `--performance-compare`) in commcamp's workspace
# (`commcamp paths`), not ~/.reframe and never the install tree: <workspace>/reframe/results.db unless set already.
# The workspace: $COMMCAMP_HOME; else a checkout's results/ (git-ignored); else, this file shipped in an installed
# commcamp (campaigns/_data/site_configs/), $XDG_DATA_HOME/commcamp.
export RFM_ENABLE_RESULTS_STORAGE=1
_commcamp_root=$(cd -P "$_commcamp_site/../.." && pwd)
if [ -n "${COMMCAMP_HOME:-}" ]; then _commcamp_ws=$COMMCAMP_HOME
elif [ -f "$_commcamp_root/campaigns/paths.py" ]; then _commcamp_ws=$_commcamp_root/results
else _commcamp_ws=${XDG_DATA_HOME:-$HOME/.local/share}/commcamp
fi
export RFM_SQLITE_DB_FILE="${RFM_SQLITE_DB_FILE:-$_commcamp_ws/reframe/results.db}"
unset _commcamp_root _commcamp_ws
eval "$("$_commcamp_site/cluster/cluster.sh" env)"
unset _commcamp_site
