# Source on a login node: `. site_configs/alps/env.sh`, then `reframe -c reframe_checks -t health -r`.
# Run inside the programming environment (the build happens here, on the login node):
#   uenv start prgenv-gnu/24.11:v1 --view=default
# and say which project pays: export SBATCH_ACCOUNT=<project> (Slurm reads it in sbatch).
# nccl-tests / OSU come from the Spack environment spack_env/alps (spack load), or NCCL_TESTS_DIR.
if [ -z "${SBATCH_ACCOUNT:-}" ]; then echo "env.sh: set SBATCH_ACCOUNT to the project that pays for the jobs" >&2; fi
_commcamp_site=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export RFM_CONFIG_FILES="$_commcamp_site/reframe_config.py"
. "${COMMCAMP_DATA:-$_commcamp_site/../..}/site_configs/reframe_results.sh"  # ReFrame's results database
unset _commcamp_site
