#!/usr/bin/env bash
# Runs nccl-tests all_reduce_perf (one process, 4 GPUs) side by side without and with commcamp's tuner
# plugin, repeated in interleaved rounds, then compares per size against a noise band. For the GPU
# machine; run from the repo root:
#
#   NCCL_TESTS_DIR=third_party/nccl-tests bench_src/nccl_tuner/scripts/gpu-plugin-check.sh OUTDIR
#
# Cases: 1 no plugin; 2 plugin + empty config; 3 plugin + 4 channels for allreduce >= 128 MiB (with
# NCCL_DEBUG_SUBSYS=TUNING showing "rule N applied"); 4 plugin + matching lines with explicit and -1
# channels and a disabled (NVLS) first rule -- the kind that crashed NCCL's example plugin.
# Case 5 (the tuner's per-size config vs the best global env it found), each part only if its file is given:
#   CASE5_TUNER_CONFIG=FILE  per-size config written by commcamp's tuner: case 5a = global env + plugin
#   CASE5_GLOBAL_ENV=FILE    KEY=VALUE lines (NCCL_* only) of the best global settings: case 5b = global
#                            env, no plugin (5a is judged against 5b, or against case 1 without this file)
# Rounds: every round runs every case once, in an order rotated by one case per round (so drift hits all
# cases alike: baseline, case, baseline, case ...); compare_busbw.py judges each case against its reference
# per size: the speed ratio of the median times over rounds, outside the noise band (the larger relative
# range (max-min)/median of either case's times at that size) = faster/slower, inside = equal.
# Expected: case 2 equal at every size; case 3 slower at >= 128 MiB and equal below; case 4 runs to the
# end; case 5a never slower than its reference.
# Other knobs: ROUNDS (default 3), SWEEP (nccl-tests flags, default "-b 8 -e 1G -f 4 -w 3 -n 10 -c 1"),
# GPUS (default 4), CASE_TIMEOUT seconds per run (default 45), PLUGIN_DEADLINE (unix time: no new round
# starts when it cannot end before it).
# Output: OUTDIR/<case>.r<round>.out/.err/.nccl-debug.*.log (raw), cases.tsv, environment.txt,
# build.log, comparison.txt and comparison.csv (from compare_busbw.py). Exit status 1 if a check failed.
set -euo pipefail

# NVLink multicast can put the shared host's GPUs out of service: off for every case, always.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

usage="usage: NCCL_TESTS_DIR=DIR $0 OUTDIR"
[[ $# -eq 1 ]] || { echo "$usage" >&2; exit 2; }
[[ -n ${NCCL_TESTS_DIR:-} ]] || { echo "error: NCCL_TESTS_DIR is not set. $usage" >&2; exit 2; }
perf="$NCCL_TESTS_DIR/build/all_reduce_perf"
[[ -x $perf ]] || { echo "error: $perf is missing or not executable (build nccl-tests first)" >&2; exit 2; }
for hook in CASE5_TUNER_CONFIG CASE5_GLOBAL_ENV; do
  file=${!hook:-}
  [[ -z $file || -f $file ]] || { echo "error: $hook=$file is not a file" >&2; exit 2; }
done
# Case 5b settings, checked before any GPU time is spent.
global=()
if [[ -n ${CASE5_GLOBAL_ENV:-} ]]; then
  while IFS= read -r line || [[ -n $line ]]; do
    line=${line%%#*}
    line=${line#"${line%%[![:space:]]*}"}
    line=${line%"${line##*[![:space:]]}"}
    [[ -z $line ]] && continue
    [[ $line =~ ^NCCL_[A-Z0-9_]+=.+$ ]] ||
      { echo "error: $CASE5_GLOBAL_ENV: '$line' is not NCCL_NAME=VALUE" >&2; exit 2; }
    [[ $line =~ ^NCCL_(NVLS_ENABLE|TUNER_|DEBUG) ]] &&
      { echo "error: $CASE5_GLOBAL_ENV: $line may not be set (this script owns it)" >&2; exit 2; }
    global+=("$line")
  done < "$CASE5_GLOBAL_ENV"
  [[ ${#global[@]} -gt 0 ]] || { echo "error: $CASE5_GLOBAL_ENV has no settings" >&2; exit 2; }
fi
if [[ -e $1 && -n $(ls -A "$1") ]]; then
  echo "error: $1 exists and is not empty; give a new output directory" >&2
  exit 2
fi
gpus=${GPUS:-4}
case_timeout=${CASE_TIMEOUT:-45}
rounds=${ROUNDS:-3}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "error: ROUNDS=$rounds is not a positive integer" >&2; exit 2; }
read -r -a sweep <<< "${SWEEP:--b 8 -e 1G -f 4 -w 3 -n 10 -c 1}"
scripts=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source_dir=$(dirname "$scripts")
perf=$(cd "$(dirname "$perf")" && pwd)/all_reduce_perf
mkdir -p "$1"
out=$(cd "$1" && pwd)

# ---- build the plugin (Release, no tests) ----
build="$out/build"
if command -v cmake > /dev/null; then
  { cmake -S "$source_dir" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCOMMCAMP_TUNER_TESTS=OFF &&
    cmake --build "$build" -j 8; } > "$out/build.log" 2>&1 ||
    { echo "error: plugin build failed, see $out/build.log" >&2; exit 1; }
else
  # No cmake on the host: the plugin target's compile line from CMakeLists.txt.
  mkdir -p "$build"
  cc -std=c11 -O2 -fPIC -shared -fvisibility=hidden -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Werror \
    -Wl,-z,defs -I"$source_dir" "$source_dir/tuner_plugin.c" "$source_dir/tuner_config.c" \
    -o "$build/libnccl-tuner-commcamp.so" > "$out/build.log" 2>&1 ||
    { echo "error: plugin build failed, see $out/build.log" >&2; exit 1; }
fi
plugin="$build/libnccl-tuner-commcamp.so"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -n) $(uname -r)"
  echo "commit: $(git -C "$source_dir" rev-parse HEAD 2> /dev/null || echo unknown)"
  echo "all_reduce_perf: $perf"
  echo "plugin exports:"
  nm -D --defined-only "$plugin" | sed 's/^/  /' || true
  echo "environment:"
  env | grep -E '^(NCCL|CUDA|TORCH|NVSHMEM)_' | sort | sed 's/^/  /' || true
  nvidia-smi -L || true
  nvidia-smi topo -m || true
} > "$out/environment.txt" 2>&1

# ---- configs ----
cat > "$out/empty.csv.conf" << 'EOF'
# commcamp gpu-plugin-check case 2: no rules. NCCL's own choices must stay in force.
EOF
cat > "$out/channels4.csv.conf" << 'EOF'
# commcamp gpu-plugin-check case 3: allreduce of 128 MiB and more on ring/simple with 4 channels.
allreduce,134217728,-1,ring,simple,4,-1,-1
EOF
cat > "$out/matching.csv.conf" << 'EOF'
# commcamp gpu-plugin-check case 4: every allreduce matches a line.
# NVLS is disabled (NCCL_NVLS_ENABLE=0): this rule must be logged as not applicable and passed over.
allreduce,-1,-1,nvls,simple,-1,-1,-1
allreduce,0,65535,tree,ll,-1,-1,-1
allreduce,65536,16777215,ring,ll128,-1,1,4
allreduce,16777216,-1,ring,simple,32,-1,-1
EOF

# ---- cases ----
sweep+=(-g "$gpus")
# run_case NAME ROUND CONFIG|"" [KEY=VALUE ...]: no config = no plugin.
run_case() {
  local name=$1 round=$2 config=$3 rc=0
  shift 3
  local settings=(NCCL_TUNER_PLUGIN=none)
  [[ -z $config ]] || settings=(NCCL_TUNER_PLUGIN="$plugin" NCCL_TUNER_CONFIG_FILE="$config")
  settings+=(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING NCCL_DEBUG_FILE="$out/$name.r$round.nccl-debug.%h.%p.log")
  env "${settings[@]}" "$@" timeout --kill-after=10 "$case_timeout" "$perf" "${sweep[@]}" \
    > "$out/$name.r$round.out" 2> "$out/$name.r$round.err" || rc=$?
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$round" "$rc" "${config:--}" "${descriptions[$name]}" >> "$out/cases.tsv"
  echo "case $name round $round: exit status $rc"
}

declare -A descriptions=(
  [1-baseline]="no tuner plugin (NCCL_TUNER_PLUGIN=none)"
  [2-empty-config]="commcamp plugin, config without rules"
  [3-channels4]="commcamp plugin, ring/simple with 4 channels for allreduce >= 128 MiB"
  [4-matching]="commcamp plugin, every size matches (explicit and -1 channels, NVLS rule disabled)"
  [5a-tuner-config]="commcamp plugin with the tuner's per-size config, on top of the best global settings"
  [5b-global-env]="no plugin, the tuner's best global settings: ${global[*]}"
)
cases=(1-baseline 2-empty-config 3-channels4 4-matching)
declare -A configs=([1-baseline]="" [2-empty-config]="$out/empty.csv.conf" [3-channels4]="$out/channels4.csv.conf"
                    [4-matching]="$out/matching.csv.conf")
if [[ -n ${CASE5_TUNER_CONFIG:-} ]]; then
  cp "$CASE5_TUNER_CONFIG" "$out/case5-tuner.csv.conf"
  cases+=(5a-tuner-config)
  configs[5a-tuner-config]="$out/case5-tuner.csv.conf"
fi
if [[ ${#global[@]} -gt 0 ]]; then
  cases+=(5b-global-env)
  configs[5b-global-env]=""
fi
started=$(date +%s)
for ((round = 1; round <= rounds; round++)); do
  if [[ -n ${PLUGIN_DEADLINE:-} && $round -gt 1 ]]; then
    per_round=$(( ($(date +%s) - started) / (round - 1) ))
    if (($(date +%s) + per_round > PLUGIN_DEADLINE)); then
      echo "deadline: stopping after $((round - 1)) of $rounds rounds"
      break
    fi
  fi
  for ((i = 0; i < ${#cases[@]}; i++)); do
    name=${cases[$(((i + round - 1) % ${#cases[@]}))]}
    case $name in
      5a-*|5b-*) run_case "$name" "$round" "${configs[$name]}" "${global[@]}" ;;
      *) run_case "$name" "$round" "${configs[$name]}" ;;
    esac
  done
done

python3 "$scripts/compare_busbw.py" "$out"
