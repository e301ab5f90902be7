# Source from anywhere: `. site_configs/local/env.sh`, then `reframe -c reframe_checks -r` (or `-t health`).
# Site "local": this machine, no batch scheduler; Open MPI and MPICH need nothing else here.
_commcamp_site=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export RFM_CONFIG_FILES="$_commcamp_site/reframe_config.py"
. "${COMMCAMP_DATA:-$_commcamp_site/../..}/site_configs/reframe_results.sh"  # ReFrame's results database
unset _commcamp_site
