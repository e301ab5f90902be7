#!/usr/bin/env bash
# Rebuild results/reports/h200x4.html from the committed 4x H200 reference results
# (results/reference/h200x4/), stored as site h200 (site_configs/h200/): every commbench JSON Lines file of run 1 (GPU acceptance bundle, ccl sweeps)
# and run 2 (batched ccl, D2D peer targets) goes into a fresh SQLite store with `commcamp results ingest`,
# then `commcamp report` writes the HTML. The fault-injection records (fault-*) are test hooks, not
# measurements, and are left out.
#   tools/reports/build-h200x4.sh [DB_URL]      (default: a temporary SQLite file)
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
REF=$REPO/results/reference/h200x4
COMMCAMP=${COMMCAMP:-$REPO/.venv/bin/commcamp}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
DB=${1:-sqlite:///$WORK/h200x4.db}

tar -xzf "$REF/run1/acceptance/acceptance.tar.gz" -C "$WORK" records
mkdir -p "$WORK/run2" && tar -xzf "$REF/run2/compare.tar.gz" -C "$WORK/run2" ./records

ingest() { # CAMPAIGN FILE
    "$COMMCAMP" results ingest "$2" --site h200 --system h200 --partition gpu --campaign "$1" \
        --environ "$(basename "$2" .jsonl)" --run-key "$1:$(basename "$2" .jsonl)" --db "$DB" >/dev/null
}
for f in "$WORK"/records/*.jsonl; do
    case $(basename "$f") in fault-*) continue ;; esac
    ingest run1-acceptance "$f"
done
for f in "$REF"/run1/commbench-ccl/*.jsonl; do ingest run1-ccl "$f"; done
for f in "$WORK"/run2/records/*.jsonl; do ingest run2-batched "$f"; done

# The nominal link bandwidths (dashed) come from site_configs/h200/site.yaml (`links`).
"$COMMCAMP" report --db "$DB" --site h200 --system h200 --output "$REPO/results/reports/h200x4.html" \
    --title "4x NVIDIA H200 (NVLink): commbench reference runs 1 and 2"
