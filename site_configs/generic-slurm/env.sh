# Source on a login node: `. site_configs/generic-slurm/env.sh`, then `reframe -c reframe_checks -t health -r`.
# EDIT: what a shell on your login node needs before ReFrame runs (module loads, SBATCH_ACCOUNT,
# OSU_DIR for the OSU reference benchmarks, ...).
_commcamp_site=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export RFM_CONFIG_FILES="$_commcamp_site/reframe_config.py"
# ReFrame's results storage (`reframe --list-stored-sessions`, `--performance-compare`) in the
# workspace, not ~/.reframe: $COMMCAMP_HOME/reframe/results.db (a checkout: results/, git-ignored) unless set already.
export RFM_ENABLE_RESULTS_STORAGE=1
export RFM_SQLITE_DB_FILE="${RFM_SQLITE_DB_FILE:-${COMMCAMP_HOME:-$(cd "$_commcamp_site/../.." && pwd)/results}/reframe/results.db}"
unset _commcamp_site
