#!/usr/bin/env bash
# The measured socket-path landscape of the sampler benchmark on a GPU machine with >= 2 GPUs, from the
# repository root (Python packages as in gpu-demo.sh's header):
#
#   [GRID=nccl-socket] tools/tuning/gpu-landscape.sh OUT.json [tests/bench/sweep_landscape.py options: --repeats,
#                                                                 --budget-s, --extend ...]
#
# Builds commbench's cuda backend (bench_src/scripts/common.sh; into $LANDSCAPE_BUILD, default build/landscape),
# writes the machine's environment next to OUT.json (OUT.environment.txt), then runs
# tests/bench/sweep_landscape.py --grid $GRID --output OUT.json with the options given.
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 OUT.json [sweep_landscape.py options]" >&2; exit 2; }
source bench_src/scripts/common.sh  # NVLink multicast off for everything started here
output=$1
shift
build=$(realpath -m "${LANDSCAPE_BUILD:-build/landscape}")  # absolute: the build runs in make -C bench_src
mkdir -p "$build" "$(dirname "$output")"
cb_environment > "${output%.json}.environment.txt" 2>&1
JOBS=${JOBS:-16} cb_build_cuda "$build" "$build/build.log"
"${PYTHON:-python3}" tests/bench/sweep_landscape.py --grid "${GRID:-nccl-socket}" --commbench "$CB_BIN" --output "$output" "$@"
