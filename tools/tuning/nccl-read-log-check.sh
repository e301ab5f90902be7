#!/usr/bin/env bash
# Where NCCL's read log goes when an nccl.conf names NCCL_DEBUG_FILE (the tuner reads that log from a run's output to
# tell which knobs NCCL took: campaigns/tuning/executors.py READ_LOG_ENV), and whether an empty NCCL_DEBUG_FILE in the
# environment brings it back (NCCL's conf files never override the environment; an empty file name opens no file).
# One commbench process on one GPU, allreduce over NCCL at 1 MiB, NCCL_MAX_NCHANNELS=4 as the knob to be reported:
#   none      no conf file
#   conf      NCCL_CONF_FILE names a file with NCCL_DEBUG_FILE=DIR/diverted.%h.%p (as ~/.nccl.conf or /etc/nccl.conf would)
#   conf+''   the same file, NCCL_DEBUG_FILE= (empty) in the environment
# From the repository root on a GPU machine: tools/tuning/nccl-read-log-check.sh OUTDIR
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[[ $# -eq 1 ]] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
mkdir -p "$1" && out=$(cd "$1" && pwd) || exit 2
source bench_src/scripts/common.sh
cb_build_cuda "$out" "$out/build.log" > /dev/null || exit 1
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ) host: $(uname -n) commit: $(git rev-parse HEAD 2> /dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$CB_BIN" --version | head -3
  dpkg -l 2> /dev/null | awk '$2 ~ /^libnccl/ {print $2, $3}'
  echo "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ENV NCCL_MAX_NCHANNELS=4 mpirun -np 1 commbench --op allreduce --transport ccl --sizes 1048576"
  printf 'case\tread_log_lines_in_output\tin_diverted_files\tcommbench_exit\n'
} > "$out/summary.txt"
conf=$out/nccl.conf
echo "NCCL_DEBUG_FILE=$out/diverted.%h.%p" > "$conf"
run_case() {  # NAME ENV...: one commbench run with the read log on
  local name=$1 rc=0
  shift
  rm -f "$out"/diverted.*
  env "$@" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ENV NCCL_MAX_NCHANNELS=4 \
    mpirun -np 1 "$CB_BIN" --op allreduce --transport ccl --sizes 1048576 --warmup 1 --iters 3 \
    --output "$out/$name.jsonl" > "$out/$name.out" 2>&1 || rc=$?
  local in_output in_files
  in_output=$(grep -c 'NCCL_MAX_NCHANNELS set by environment' "$out/$name.out")
  in_files=$(cat "$out"/diverted.* 2> /dev/null | grep -c 'NCCL_MAX_NCHANNELS set by environment')
  printf '%s\t%s\t%s\t%s\n' "$name" "$in_output" "$in_files" "$rc" >> "$out/summary.txt"
}
run_case none -u NCCL_CONF_FILE -u NCCL_DEBUG_FILE
run_case conf -u NCCL_DEBUG_FILE NCCL_CONF_FILE="$conf"
run_case conf-empty NCCL_CONF_FILE="$conf" NCCL_DEBUG_FILE=
cat "$out/summary.txt"
