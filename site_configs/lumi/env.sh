# Source on a login node: `. site_configs/lumi/env.sh`, then `reframe -c reframe_checks -t health -r`.
# Say which project pays: export SBATCH_ACCOUNT=project_<id> (Slurm reads it in sbatch). The LUMI
# stack modules are loaded by ReFrame (site.yaml); rccl-tests / OSU: spack_env/lumi or RCCL_TESTS_DIR.
if [ -z "${SBATCH_ACCOUNT:-}" ]; then echo "env.sh: set SBATCH_ACCOUNT to the project that pays for the jobs" >&2; fi
_commcamp_site=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export RFM_CONFIG_FILES="$_commcamp_site/reframe_config.py"
. "${COMMCAMP_DATA:-$_commcamp_site/../..}/site_configs/reframe_results.sh"  # ReFrame's results database
unset _commcamp_site
