# Source on a login node: `. site_configs/leonardo/env.sh`, then `reframe -c reframe_checks -t health -r`.
# Say which project pays: export SBATCH_ACCOUNT=<project> (Slurm reads it in sbatch). The modules
# of the environment are loaded by ReFrame (site.yaml); nccl-tests / OSU: spack_env/leonardo or NCCL_TESTS_DIR.
if [ -z "${SBATCH_ACCOUNT:-}" ]; then echo "env.sh: set SBATCH_ACCOUNT to the project that pays for the jobs" >&2; fi
_commcamp_site=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export RFM_CONFIG_FILES="$_commcamp_site/reframe_config.py"
. "${COMMCAMP_DATA:-$_commcamp_site/../..}/site_configs/reframe_results.sh"  # ReFrame's results database
unset _commcamp_site
