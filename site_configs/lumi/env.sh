# Source on a login node: `. site_configs/lumi/env.sh`, then `reframe -c reframe_checks -t health -r`.
# Say which project pays: export SBATCH_ACCOUNT=project_<id> (Slurm reads it in sbatch). The LUMI
# stack modules are loaded by ReFrame (site.yaml); rccl-tests / OSU: spack_env/lumi or RCCL_TESTS_DIR.
if [ -z "${SBATCH_ACCOUNT:-}" ]; then echo "env.sh: set SBATCH_ACCOUNT to the project that pays for the jobs" >&2; fi
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
