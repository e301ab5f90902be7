# Source on a login node: `. site_configs/generic-slurm/env.sh`, then `reframe -c reframe_checks -t health -r`.
# EDIT: what a shell on your login node needs before ReFrame runs (module loads, SBATCH_ACCOUNT,
# OSU_DIR for the OSU reference benchmarks, ...).
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
unset _commcamp_site
