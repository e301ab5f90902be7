# Source from anywhere: `. site_configs/local/env.sh`, then `reframe -c reframe_checks -r` (or `-t health`).
# Site "local": this machine, no batch scheduler; Open MPI and MPICH need nothing else here.
_commcamp_site=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export RFM_CONFIG_FILES="$_commcamp_site/reframe_config.py"
# ReFrame's results storage (`reframe --list-stored-sessions`, `--performance-compare`) in the
# workspace, not ~/.reframe: $COMMCAMP_HOME/reframe/results.db (a checkout: results/, git-ignored) unless set already.
export RFM_ENABLE_RESULTS_STORAGE=1
export RFM_SQLITE_DB_FILE="${RFM_SQLITE_DB_FILE:-${COMMCAMP_HOME:-$(cd "$_commcamp_site/../.." && pwd)/results}/reframe/results.db}"
unset _commcamp_site
