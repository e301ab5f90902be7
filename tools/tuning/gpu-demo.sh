#!/usr/bin/env bash
# The tuner's GPU demonstrations in one go (about 8.5 minutes on 4x H200), from the repository root:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
#   NCCL_TESTS_DIR=third_party/nccl-tests tools/tuning/gpu-demo.sh OUTDIR
#
# Phases (each prints its elapsed time; each stops cleanly at its own deadline and at the global one):
#   build         commbench cuda (bench_src/scripts/common.sh) and the tuner plugin
#   probe-*       which NCCL_* knobs NCCL 2.28 reports reading (NCCL_DEBUG_SUBSYS=ENV), NVLink and socket path
#   demo2         planted NCCL_MAX_CTAS=2 NCCL_PROTO=LL: the tuner (<= 15 trials) vs random search on the
#                 same space, interleaved; finalization; recommendation with tuner-plugin rows
#   plugin        bench_src/nccl_tuner/scripts/gpu-plugin-check.sh: cases 1-4 and case 5 (demo2's per-size
#                 config vs its best global env), interleaved repeats with per-size noise bands and verdicts
#   demo3         network path (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, 2 processes): socket knobs tuned
#   aa            nothing planted: 4 tunes on GPU pairs, false "change" recommendations counted
# Everything lands under OUTDIR; the bundle (DEMO_BUNDLE, default OUTDIR/gpu-demo.tar.gz; everything but
# the build trees) is rewritten after every phase, so a call killed at its limit still returns what
# finished. The end prints every phase's summary.txt (the numbers, also when no file comes back).
#
#   tools/tuning/gpu-demo.sh --cpu OUTDIR   the same plumbing on a CPU machine (gpu-demo-cpu.yaml:
#                                             Open MPI knobs, cpu commbench); the plugin phase runs only
#                                             when NCCL_TESTS_DIR is set (tests use a stand-in)
# Knobs: DEMO_TOTAL_S (default 500: seconds from the start until the last phase must end),
# DEMO_PHASES (default: all, in the order above), PLUGIN_ROUNDS (3), PLUGIN_SWEEP (nccl-tests flags).
set -uo pipefail

# NVLink multicast can put the shared host's GPUs out of service: off for everything started here.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

mode=gpu
if [[ ${1:-} == --cpu ]]; then mode=cpu; shift; fi
[[ $# -eq 1 ]] || { echo "usage: $0 [--cpu] OUTDIR" >&2; exit 2; }
[[ -f bench_src/Makefile && -f campaigns/tools/tuning_demo.py ]] || { echo "$0: run from the repository root" >&2; exit 2; }
if [[ -e $1 && -n $(ls -A "$1" 2> /dev/null) ]]; then
  echo "error: $1 exists and is not empty; give a new output directory" >&2
  exit 2
fi
mkdir -p "$1"
out=$(cd "$1" && pwd)
bundle_path=${DEMO_BUNDLE:-$out/gpu-demo.tar.gz}
mkdir -p "$(dirname "$bundle_path")"
start=$(date +%s)
deadline=$((start + ${DEMO_TOTAL_S:-500}))
python=${PYTHON:-python3}
config=tools/tuning/gpu-demo.yaml
[[ $mode == cpu ]] && config=tools/tuning/gpu-demo-cpu.yaml
default_phases="build probe-nvlink probe-socket demo2 plugin demo3 aa"
[[ $mode == cpu ]] && default_phases="build probe-nvlink demo2 plugin demo3 aa"  # one probe: one path
phases=${DEMO_PHASES:-$default_phases}
# Seconds each phase may take at most (the global deadline cuts further).
declare -A budget=([probe-nvlink]=20 [probe-socket]=25 [demo2]=180 [plugin]=80 [demo3]=95 [aa]=600)
exec > >(tee -a "$out/demo.log") 2>&1

bundle() {
  # GNU tar exits 1 when a file changed while it was read (demo.log grows as tee writes it): still complete.
  local rc=0 tmp
  tmp=$(dirname "$bundle_path")/.$(basename "$bundle_path").tmp
  tar -czf "$tmp" -C "$out" --warning=no-file-changed --exclude=./build --exclude=./build-nowerror \
    --exclude=./plugin/build --exclude=./plugin/check/build --exclude="./$(basename "$bundle_path")" \
    --exclude="./.$(basename "$bundle_path").tmp" . || rc=$?
  if ((rc <= 1)); then mv "$tmp" "$bundle_path"; else echo "bundle: tar exit $rc"; fi
}
elapsed() { echo $(($(date +%s) - start)); }
timeline() { printf '%s\t%s\t%s\t%s\n' "$@" >> "$out/phases.tsv"; }

{
  echo "mode: $mode, config: $config, total budget: ${DEMO_TOTAL_S:-500} s, phases: $phases"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ), host: $(uname -n), commit: $(git rev-parse HEAD 2> /dev/null || echo unknown)"
  echo "git status: $(git status --porcelain 2> /dev/null | wc -l) changed files"
  echo "python: $($python --version 2>&1); optuna: $($python -c 'import optuna; print(optuna.__version__)' 2>&1)"
  env | grep -E '^(NCCL|CUDA|TORCH|NVSHMEM|OMPI)_' | sort
  if [[ $mode == gpu ]]; then
    nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,driver_version --format=csv || true
    nvidia-smi topo -m || true
    dpkg -l 2> /dev/null | awk '$2 ~ /nccl|openmpi|cuda-runtime/ {print $1, $2, $3}'
  else
    mpirun.openmpi --version 2>&1 | head -1
  fi
} > "$out/environment.txt" 2>&1
printf 'phase\tstatus\telapsed_s\tbudget_s\n' > "$out/phases.tsv"

commbench=""
plugin=""
status=0
for phase in $phases; do
  now=$(date +%s)
  if ((now >= deadline - 10)); then
    echo "== $phase: SKIPPED, global deadline reached at $(elapsed) s"
    timeline "$phase" skipped 0 "${budget[$phase]:-0}"
    continue
  fi
  echo "== $phase: start at $(elapsed) s"
  t0=$(date +%s)
  rc=0
  case $phase in
    build)
      if [[ $mode == gpu ]]; then
        source bench_src/scripts/common.sh
        cb_build_cuda "$out" "$out/build.log" || rc=$?
        commbench=${CB_BIN:-}
        echo "commbench -Werror build: ${CB_WERROR_BUILD:-?}"
      else
        make -s -C bench_src BUILD_DIR="$PWD/build/bench" cpu-openmpi > "$out/build.log" 2>&1 || rc=$?
        commbench=$PWD/build/bench/cpu-openmpi/commbench
      fi
      mkdir -p "$out/plugin"
      { cmake -S bench_src/nccl_tuner -B "$out/plugin/build" -DCMAKE_BUILD_TYPE=Release -DCOMMCAMP_TUNER_TESTS=OFF &&
        cmake --build "$out/plugin/build" -j 8; } >> "$out/build.log" 2>&1 || rc=$?
      plugin=$out/plugin/build/libnccl-tuner-commcamp.so
      [[ -x $commbench && -f $plugin ]] || { echo "BUILD FAILED (see $out/build.log)"; tail -20 "$out/build.log"; rc=1; }
      ;;
    plugin)
      if [[ -z ${NCCL_TESTS_DIR:-} ]]; then
        echo "plugin check needs NCCL_TESTS_DIR (nccl-tests build); skipped"
        rc=0
      else
        case5=()
        [[ -s $out/demo2/case5/tuner.conf ]] && case5+=(CASE5_TUNER_CONFIG="$out/demo2/case5/tuner.conf")
        if [[ -f $out/demo2/case5/global.env ]] && grep -q '^NCCL_' "$out/demo2/case5/global.env"; then
          case5+=(CASE5_GLOBAL_ENV="$out/demo2/case5/global.env")
        elif [[ -f $out/demo2/case5/global.env ]]; then
          echo "demo2's best global env sets no NCCL_* variable: case 5b would be NCCL's defaults = case 1"
        fi
        until_plugin=$((t0 + ${budget[plugin]}))
        ((until_plugin > deadline)) && until_plugin=$deadline
        env "${case5[@]}" PLUGIN_DEADLINE=$until_plugin ROUNDS="${PLUGIN_ROUNDS:-3}" \
          bench_src/nccl_tuner/scripts/gpu-plugin-check.sh "$out/plugin/check" || rc=$?
      fi
      ;;
    *)
      until=$((t0 + ${budget[$phase]:-60}))
      ((until > deadline)) && until=$deadline
      extra=()
      [[ -n $commbench ]] && extra+=(--commbench "$commbench")
      [[ -n $plugin ]] && extra+=(--plugin "$plugin")
      "$python" -m campaigns.tools.tuning_demo "$config" --phase "$phase" --out "$out" --until "$until" "${extra[@]}" || rc=$?
      ;;
  esac
  took=$(($(date +%s) - t0))
  echo "== $phase: exit status $rc after $took s (budget ${budget[$phase]:-none} s), total $(elapsed) s"
  timeline "$phase" "$rc" "$took" "${budget[$phase]:-0}"
  ((rc != 0)) && status=1
  if [[ $phase == build && $rc -ne 0 ]]; then
    echo "build failed: nothing else can run"
    bundle
    exit 1
  fi
  bundle
done
echo "== done after $(elapsed) s; bundle: $bundle_path"
cat "$out/phases.tsv"
# Most important last: a reader of only the output's tail sees demo2 and the plugin cases.
for summary in "$out"/probe-*/summary.txt "$out"/aa/summary.txt "$out"/demo3/summary.txt \
  "$out/plugin/check/comparison.txt" "$out"/demo2/summary.txt; do
  [[ -f $summary ]] && { echo "---- $summary"; cat "$summary"; }
done
exit $status
