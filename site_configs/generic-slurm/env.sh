# Source on a login node: `. site_configs/generic-slurm/env.sh`, then `reframe -c reframe_checks -t health -r`.
# EDIT: what a shell on your login node needs before ReFrame runs (module loads, SBATCH_ACCOUNT,
# OSU_DIR for the OSU reference benchmarks, ...).
_commcamp_site=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export RFM_CONFIG_FILES="$_commcamp_site/reframe_config.py"
. "${COMMCAMP_DATA:-$_commcamp_site/../..}/site_configs/reframe_results.sh"  # ReFrame's results database
unset _commcamp_site
