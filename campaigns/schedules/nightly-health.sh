#!/usr/bin/env bash
# Nightly health check: run one health campaign for tonight and keep its verdict. What the schedules in
# this directory (scrontab, cron, systemd timer) call.
#   campaigns/schedules/nightly-health.sh SPEC [commcamp run options...]
# Environment: COMMCAMP (the command; default: .venv/bin/commcamp of this script's checkout, else the commcamp of
# the installation this script belongs to (<prefix>/bin/commcamp for <prefix>/lib/pythonX.Y/site-packages/campaigns/
# schedules/), else commcamp on PATH), COMMCAMP_HOME (the workspace: verdicts, database, lock, log; default:
# commcamp's, as `commcamp paths` shows it: a checkout's results/, an installed commcamp's
# $XDG_DATA_HOME/commcamp, never the install tree), COMMCAMP_DB_URL (results database; default
# <workspace>/commcamp.db), COMMCAMP_ENV (a file to source first, e.g. the output of
# `site_configs/localslurm/cluster/cluster.sh env` or a site's env.sh), COMMCAMP_HEALTH_LOG (a file to append
# everything to instead of stdout/stderr, its directory made if missing; a relative name is in
# <workspace>/health/; a night that is not healthy then also says one line on stderr, which cron mails).
# A relative SPEC is relative to the directory above campaigns/ (the checkout, or an installed package's
# site-packages).
# Exit status: commcamp's: 0 healthy, 3 not judged (no reference, too little history), 4 degraded,
# 5 failed; 1 a case could not be stored (or the lock or log could not be had), 2 unusable spec/site/database
# (or no commcamp).
# The night is the date in the clock the schedule fires in (cron and scrontab: local time; the systemd unit sets
# TZ=UTC for its UTC timer): each start of a daily schedule gets a night of its own (by the UTC date, 02:30 local
# in UTC+2/+3 gave two starts one night across a DST change: the second re-judged the first), and a re-run the
# same night resumes. One run of a spec at a time (flock on <workspace>/health/.nightly-<spec digest>.lock):
# an overlapping start exits 1. The verdict is
# <workspace>/health/<campaign>-<night>.json and stdout has the one-screen summary.
set -uo pipefail
HOME_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$HOME_DIR" || exit 2
if [[ -z ${COMMCAMP:-} ]]; then
    if [[ -x $HOME_DIR/.venv/bin/commcamp ]]; then
        COMMCAMP=$HOME_DIR/.venv/bin/commcamp  # a checkout
    elif [[ $HOME_DIR == */site-packages && -x $HOME_DIR/../../../bin/commcamp ]]; then
        COMMCAMP=$(cd "$HOME_DIR/../../../bin" && pwd)/commcamp  # an installation: <prefix>/lib/pythonX.Y/site-packages
    else
        COMMCAMP=commcamp
    fi
fi
[[ $# -ge 1 ]] || { echo "usage: $0 SPEC [commcamp run options...]" >&2; exit 2; }
if [[ -n ${COMMCAMP_ENV:-} ]]; then
    # shellcheck disable=SC1090
    source "$COMMCAMP_ENV" || { echo "cannot source COMMCAMP_ENV=$COMMCAMP_ENV" >&2; exit 2; }
fi
night=$(date +%F)
# The workspace as commcamp itself sees it (COMMCAMP_HOME, COMMCAMP_DATA), exported for the run below too.
exports=$("$COMMCAMP" paths --env) || { echo "cannot run '$COMMCAMP paths --env': set COMMCAMP to the commcamp command" >&2; exit 2; }
eval "$exports"
workspace=${COMMCAMP_HOME:?"'$COMMCAMP paths --env' exported no COMMCAMP_HOME"}
log=${COMMCAMP_HEALTH_LOG:-}
if [[ -n $log ]]; then
    [[ $log == /* ]] || log="$workspace/health/$log"
    { mkdir -p "$(dirname "$log")" && touch "$log"; } || { echo "cannot write the log $log" >&2; exit 1; }
    exec 3>&2 >>"$log" 2>&1  # fd 3: the schedule's stderr, for the one line of a night that is not healthy
fi
# in the workspace (not a name any user can take in /tmp), one per spec file (two sites' health.yaml: two locks)
mkdir -p "$workspace/health" || { echo "cannot create $workspace/health" >&2; exit 1; }
lock="$workspace/health/.nightly-$(realpath -m "$1" | sha256sum | cut -c1-16).lock"
exec 9> "$lock" || { echo "cannot open the lock file $lock" >&2; exit 1; }
if ! flock -n 9; then
    echo "commcamp nightly health: $1 is still running (lock $lock): not started again" >&2
    [[ -z $log ]] || echo "commcamp nightly health: $1 is still running: not started again (log $log)" >&3
    exit 1
fi
echo "commcamp nightly health: $1, night $night, $(date -u +%FT%TZ) on $(hostname)"
COLUMNS=${COLUMNS:-120} "$COMMCAMP" run "$1" --tag "$night" "${@:2}"
status=$?
said="exit $status ($( case $status in 0) echo healthy;; 3) echo "not judged";; 4) echo degraded;; 5) echo failed;; 1) echo "a case could not be stored";; 2) echo "spec/site/database unusable";; *) echo error;; esac))"
echo "commcamp nightly health: $said"
if [[ -n $log && $status -ne 0 ]]; then
    echo "commcamp nightly health: $1, night $night: $said; log $log, verdicts in $workspace/health/" >&3
fi
exit $status
