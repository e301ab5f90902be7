#!/usr/bin/env bash
# Rebuild results/reports/h200x4.html from the committed 4x H200 reference results
# (results/reference/h200x4/): every commbench JSON Lines file of run 1 (GPU acceptance bundle, ccl sweeps)
# and run 2 (batched ccl, D2D peer targets) goes into a fresh SQLite store with `commcamp results ingest`,
# then `commcamp report` writes the HTML. The fault-injection records (fault-*) are test hooks, not
# measurements, and are left out.
#   results/reports/build-h200x4.sh [DB_URL]      (default: a temporary SQLite file)
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
    "$COMMCAMP" results ingest "$2" --site reference --system h200x4 --partition gpu4 --campaign "$1" \
        --environ "$(basename "$2" .jsonl)" --run-key "$1:$(basename "$2" .jsonl)" --db "$DB" >/dev/null
}
for f in "$WORK"/records/*.jsonl; do
    case $(basename "$f") in fault-*) continue ;; esac
    ingest run1-acceptance "$f"
done
for f in "$REF"/run1/commbench-ccl/*.jsonl; do ingest run1-ccl "$f"; done
for f in "$WORK"/run2/records/*.jsonl; do ingest run2-batched "$f"; done

# Nominal: NVLink 4 on H200 SXM, 18 links x 25 GB/s per direction = 450 GB/s per direction per GPU
# (NVIDIA H200 datasheet: 900 GB/s NVLink bandwidth, both directions together).
"$COMMCAMP" report --db "$DB" --site reference --system h200x4 --output "$REPO/results/reports/h200x4.html" \
    --title "4x NVIDIA H200 (NVLink): commbench reference runs 1 and 2" --nominal "NVLink 4 (18 links)=450"
