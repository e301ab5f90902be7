#!/usr/bin/env bash
# Nightly health check: run one health campaign for tonight and keep its verdict. What the schedules in
# this directory (scrontab, cron, systemd timer) call.
#   campaigns/schedules/nightly-health.sh SPEC [commcamp run options...]
# Environment: COMMCAMP (the command; default: .venv/bin/commcamp of this script's checkout, else commcamp on
# PATH), COMMCAMP_HOME (the workspace: verdicts, database; default: the checkout's results/), COMMCAMP_DB_URL
# (results database; default <workspace>/commcamp.db), COMMCAMP_ENV (a file to source first, e.g. the output
# of `site_configs/localslurm/cluster/cluster.sh env` or a site's env.sh). A relative SPEC is relative to
# the directory above campaigns/ (the checkout, or an installed package's site-packages).
# Exit status: commcamp's: 0 healthy, 3 not judged (no reference, too little history), 4 degraded,
# 5 failed; 1 a case could not be stored, 2 unusable spec/site/database.
# The night is the date in the clock the schedule fires in (cron and scrontab: local time; the systemd unit sets
# TZ=UTC for its UTC timer): each start of a daily schedule gets a night of its own (by the UTC date, 02:30 local
# in UTC+2/+3 gave two starts one night across a DST change: the second re-judged the first), and a re-run the
# same night resumes. One run of a spec at a time (flock on <workspace>/health/.nightly-<spec digest>.lock):
# an overlapping start exits 1. The verdict is
# <workspace>/health/<campaign>-<night>.json and stdout has the one-screen summary.
set -uo pipefail
HOME_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$HOME_DIR" || exit 2
COMMCAMP=${COMMCAMP:-$HOME_DIR/.venv/bin/commcamp}
[[ -x $COMMCAMP ]] || COMMCAMP=commcamp
[[ $# -ge 1 ]] || { echo "usage: $0 SPEC [commcamp run options...]" >&2; exit 2; }
if [[ -n ${COMMCAMP_ENV:-} ]]; then
    # shellcheck disable=SC1090
    source "$COMMCAMP_ENV" || { echo "cannot source COMMCAMP_ENV=$COMMCAMP_ENV" >&2; exit 2; }
fi
night=$(date +%F)
# in the workspace (not a name any user can take in /tmp), one per spec file (two sites' health.yaml: two locks)
workspace=${COMMCAMP_HOME:-$HOME_DIR/results}
mkdir -p "$workspace/health" || { echo "cannot create $workspace/health" >&2; exit 1; }
lock="$workspace/health/.nightly-$(realpath -m "$1" | sha256sum | cut -c1-16).lock"
exec 9> "$lock" || { echo "cannot open the lock file $lock" >&2; exit 1; }
if ! flock -n 9; then
    echo "commcamp nightly health: $1 is still running (lock $lock): not started again" >&2
    exit 1
fi
echo "commcamp nightly health: $1, night $night, $(date -u +%FT%TZ) on $(hostname)"
COLUMNS=${COLUMNS:-120} "$COMMCAMP" run "$1" --tag "$night" "${@:2}"
status=$?
echo "commcamp nightly health: exit $status ($( case $status in 0) echo healthy;; 3) echo "not judged";; 4) echo degraded;; 5) echo failed;; 1) echo "a case could not be stored";; 2) echo "spec/site/database unusable";; *) echo error;; esac))"
exit $status
