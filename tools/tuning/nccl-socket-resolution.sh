#!/usr/bin/env bash
# What NCCL's socket transport runs for each spelling of its threading knobs on this machine: the evidence for
# the catalog's `unset_equals` / `inert_unless_set` of NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD
# (site_configs/knobs/catalog.yaml). From the repository root, on a machine with >= 2 GPUs:
#
#   tools/tuning/nccl-socket-resolution.sh OUT.txt
#
# Prints the PCI vendor of every network interface (NCCL's auto-detection: 0x1d0f AWS, 0x1ae0 GCP, anything
# else: no helper threads), then, for each setting, one 2-process allreduce over the socket transport (P2P and
# SHM off, as tools/tuning/gpu-socket-x2.yaml) with NCCL_DEBUG=INFO and NCCL's own lines about the socket
# transport: "NET/Socket: Using T threads and S sockets per thread" appears only when NCCL starts helper threads.
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 OUT.txt" >&2; exit 2; }
source bench_src/scripts/common.sh  # NVLink multicast off for everything started here
output=$(realpath -m "$1")
build=$(realpath -m "${LANDSCAPE_BUILD:-build/landscape}")
mkdir -p "$build" "$(dirname "$output")"
JOBS=${JOBS:-16} cb_build_cuda "$build" "$build/build.log" >/dev/null
settings=(
    ""
    "NCCL_NSOCKS_PERTHREAD=4"
    "NCCL_NSOCKS_PERTHREAD=8"
    "NCCL_SOCKET_NTHREADS=2"
    "NCCL_SOCKET_NTHREADS=2 NCCL_NSOCKS_PERTHREAD=1"
    "NCCL_SOCKET_NTHREADS=3 NCCL_NSOCKS_PERTHREAD=2"
    "NCCL_SOCKET_NTHREADS=8 NCCL_NSOCKS_PERTHREAD=8"
)
{
    echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) $(hostname); commbench $CB_BIN; $(dpkg -l 2>/dev/null | awk '$2 ~ /^libnccl2/ {print $2, $3}')"
    for nic in /sys/class/net/*; do
        echo "nic $(basename "$nic"): PCI vendor $(cat "$nic/device/vendor" 2>/dev/null || echo 'none (no PCI device)')"
    done
    for setting in "${settings[@]}"; do
        echo "== setting: ${setting:-(none: the library defaults)}"
        # shellcheck disable=SC2086  # the setting is NAME=VALUE words for env
        env $setting NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
            "${MPIRUN:-mpirun}" -np 2 --bind-to none "$CB_BIN" --transport ccl --op allreduce --sizes 16M \
            --iters 3 --warmup 1 --timeout 60 2>&1 |
            grep -E "NET/Socket|set by environment|NCCL version" | sed -E 's/^[^ ]+ [^ ]+ [^ ]+ //' | sort | uniq -c ||
            echo "   (no NET/Socket line)"
    done
} | tee "$output"
