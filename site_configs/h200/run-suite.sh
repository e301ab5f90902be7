#!/usr/bin/env bash
# The ReFrame suite of site "h200" on the GPU machine, in one go (about 2-3 minutes), from the
# repository root:
#
#   site_configs/h200/run-suite.sh [--list | --dry-run] [--tags REGEX] OUTDIR
#
# Runs `reframe -c reframe_checks -t health -r` with the site's configuration: commbench op sweeps of
# every transport (ccl, d2d, d2d-kernel, staging; GPU-aware mpi must answer "unsupported"), the pair
# matrix of each transport, host<->device copies, and nccl-tests all_reduce_perf as the reference
# ($NCCL_TESTS_DIR, default third_party/nccl-tests/build; skipped with the reason if it is not there).
# --tags REGEX selects other tests (`characterize`: the full sweeps, much longer; `gpu_aware_mpi`: the mpi
# transport's point-to-point ops through a CUDA-built UCX, env.sh's COMMCAMP_UCX_CUDA; `.` everything).
# --list only lists the selected test cases, --dry-run also writes their job scripts (nothing runs).
#
# ReFrame comes from the Python environment: `reframe` must be importable by python3 (the lead's wheel
# install: python3 -m pip install ... --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site).
# Results storage stays off (it needs polars). Everything ReFrame writes goes under OUTDIR: rfm/
# (stage, output with every commbench.jsonl and job script, perflogs), report.json, reframe.out,
# machine.txt, and OUTDIR/suite.tar.gz bundles all of it but the build trees. Exit status: ReFrame's
# (0 = every selected test passed), 2 for bad usage or a missing prerequisite.
set -uo pipefail

mode=run
tags=health
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
while (($#)); do
    case $1 in
        --list) mode=list; shift ;;
        --dry-run) mode=dry-run; shift ;;
        --tags) tags=${2:?--tags needs a regular expression}; shift 2 ;;
        -h | --help) usage ;;
        -*) echo "run-suite.sh: unknown option $1" >&2; usage ;;
        *) break ;;
    esac
done
(($# == 1)) || usage
[ -f reframe_checks/commbench.py ] || { echo "run-suite.sh: run this from the repository root" >&2; exit 2; }

# COMMCAMP_SUITE_SITE lets the tests of this script use another site (e.g. local, which needs no GPU).
site=${COMMCAMP_SUITE_SITE:-h200}
# shellcheck source=/dev/null
. "site_configs/$site/env.sh" || { echo "run-suite.sh: cannot source site_configs/$site/env.sh" >&2; exit 2; }
export RFM_ENABLE_RESULTS_STORAGE=0

out=$(mkdir -p "$1" && cd "$1" && pwd) || { echo "run-suite.sh: cannot create $1" >&2; exit 2; }
rfm() { python3 -c 'import sys; from reframe.frontend.cli import main; sys.argv[0] = "reframe"; main()' "$@"; }
if ! python3 -c 'import reframe, jsonschema, yaml, pydantic, packaging' 2>"$out/import-error.txt"; then
    echo "run-suite.sh: python3 cannot import reframe, jsonschema, yaml, pydantic and packaging (the checks" \
         "validate knobs with tuners/catalog.py; install the wheels, set PYTHONPATH):" >&2
    cat "$out/import-error.txt" >&2
    exit 2
fi
rm -f "$out/import-error.txt"
if [ "$mode" = run ] && [ "$site" = h200 ]; then
    for tool in cmake nvcc mpicc mpirun; do
        command -v "$tool" >/dev/null || { echo "run-suite.sh: $tool is not on PATH" >&2; exit 2; }
    done
fi

{
    echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) $(hostname) site $site mode $mode tags $tags"
    echo "== git: $(git rev-parse HEAD 2>/dev/null || echo unknown) $(git status --porcelain 2>/dev/null | wc -l) changed files"
    echo "== ReFrame $(rfm --version 2>&1), python $(python3 --version 2>&1)"
    env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS|NCCL_TESTS_DIR|RFM_CONFIG_FILES)=' | sort
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,driver_version --format=csv
        nvidia-smi topo -m
    fi
    for tool in cmake nvcc mpirun; do command -v "$tool" >/dev/null && "$tool" --version 2>&1 | head -2; done
} >"$out/machine.txt" 2>&1

case $mode in
    list) action=(-l) ;;
    dry-run) action=(--dry-run) ;;
    run) action=(-r) ;;
esac
start=$SECONDS
# TMPDIR: ReFrame's debug log (rfm-*.log) goes there.
# 10 samples after 2 warm-up ones per size: the settings of the GPU acceptance run the references come from
# (results/reference/h200x4/run1); it keeps the suite within its few minutes.
TMPDIR=$out rfm -c reframe_checks -t "$tags" -S iters=10 -S warmup=2 --prefix "$out/rfm" \
    --perflogdir "$out/rfm/perflogs" --report-file "$out/report.json" --nocolor "${action[@]}" 2>&1 | tee "$out/reframe.out"
rc=${PIPESTATUS[0]}
echo "== reframe exit status $rc after $((SECONDS - start)) s" | tee -a "$out/reframe.out"

(cd "$out" && tar -czf suite.tar.gz --exclude='*/build' --exclude=suite.tar.gz -- *) ||
    echo "run-suite.sh: could not write $out/suite.tar.gz" >&2
echo "run-suite.sh: results in $out (bundle: $out/suite.tar.gz)"
exit "$rc"
