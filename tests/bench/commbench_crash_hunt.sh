#!/usr/bin/env bash
# Hunt for a commbench crash on the local Slurm cluster: short 2-node runs through srun, Open MPI (pmix)
# and MPICH (pmi2), with and without --batch, ops pingpong/allreduce/alltoall/sendrecv, core dumps on.
# Every run gets its own directory (its core file lands there); a run that outlives its limit is killed
# by `timeout` and counted as a hang. CRASH_HUNT_KNOBS=1 adds what a tuning trial of the pretune scope
# sets: Open MPI's read log (OMPI_MCA_mpi_show_mca_params=enviro) and TCP socket buffers from 4 KiB to
# 16 MiB (or unset), one pair per run, with the scope's sizes 64K,1M.
#
# Usage: eval "$(site_configs/localslurm/cluster/cluster.sh env)"; tests/bench/commbench_crash_hunt.sh ROUNDS OUTDIR
# Prints one line per run that did not exit 0, then the counts; OUTDIR/summary.txt keeps them.
set -uo pipefail
ROUNDS=${1:?rounds}
OUT=${2:?output directory}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LIMIT_S=${CRASH_HUNT_LIMIT_S:-60}
KNOBS=${CRASH_HUNT_KNOBS:-0}
BUFFERS=(unset 4096 16384 65536 262144 1048576 4194304 16777216)
SIZES=8,1024,65536
((KNOBS)) && SIZES=65536,1048576
mkdir -p "$OUT"
ulimit -c unlimited
declare -A count
runs=0
for ((round = 1; round <= ROUNDS; round++)); do
    for mpi in openmpi mpich; do
        for batch in 1 16; do
            for op in pingpong allreduce alltoall sendrecv; do
                if [[ $mpi == openmpi ]]; then launch=(--mpi=pmix); extra_env=(); else launch=(--mpi=pmi2); extra_env=(UCX_TLS=tcp,self); fi
                if ((KNOBS)) && [[ $mpi == openmpi ]]; then
                    extra_env+=(OMPI_MCA_mpi_show_mca_params=enviro)
                    snd=${BUFFERS[RANDOM % ${#BUFFERS[@]}]} rcv=${BUFFERS[RANDOM % ${#BUFFERS[@]}]}
                    [[ $snd != unset ]] && extra_env+=(OMPI_MCA_btl_tcp_sndbuf=$snd)
                    [[ $rcv != unset ]] && extra_env+=(OMPI_MCA_btl_tcp_rcvbuf=$rcv)
                fi
                dir=$OUT/r$round-$mpi-b$batch-$op
                mkdir -p "$dir"
                started=$(date +%s.%N)
                (cd "$dir" && env "${extra_env[@]}" timeout -k 5 "$LIMIT_S" srun -N2 -n2 "${launch[@]}" -t 2 \
                    "$REPO/build/bench/cpu-$mpi/commbench" --op "$op" --sizes "$SIZES" --warmup 2 --iters 20 \
                    --batch "$batch" --timeout 20 --output commbench.jsonl >out.txt 2>&1)
                rc=$?
                ended=$(date +%s.%N)
                runs=$((runs + 1))
                verdict=ok
                if ((rc == 124 || rc == 137)); then verdict=hang
                elif ((rc != 0)); then verdict=exit$rc; fi
                if compgen -G "$dir/core*" >/dev/null; then verdict="$verdict+core"; fi
                count[$verdict]=$(( ${count[$verdict]:-0} + 1 ))
                if [[ $verdict != ok ]]; then
                    printf '%s rc=%d %.1fs %s [%s]: %s\n' "$verdict" "$rc" "$(echo "$ended - $started" | bc)" "$dir" \
                        "${extra_env[*]}" \
                        "$(tail -3 "$dir/out.txt" | tr '\n' ' ')" | tee -a "$OUT/failures.txt"
                else
                    rm -rf "$dir"
                fi
            done
        done
    done
done
{
    echo "runs: $runs ($(date -u +%FT%TZ), $(hostname), limit ${LIMIT_S}s, knobs $KNOBS, sizes $SIZES)"
    for verdict in "${!count[@]}"; do echo "$verdict: ${count[$verdict]}"; done
} | tee "$OUT/summary.txt"
