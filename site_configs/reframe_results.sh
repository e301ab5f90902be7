# Sourced by each site's env.sh (site_configs/<site>/env.sh; a site made by `commcamp site new` finds it through
# COMMCAMP_DATA): ReFrame's results storage (`reframe --list-stored-sessions`, `--performance-compare`) in
# commcamp's workspace (`commcamp paths`), not ~/.reframe and never the install tree: <workspace>/reframe/results.db
# unless RFM_SQLITE_DB_FILE is set already. The workspace: $COMMCAMP_HOME; else a checkout's results/
# (git-ignored); else, this file shipped in an installed commcamp (campaigns/_data/site_configs/),
# $XDG_DATA_HOME/commcamp.
export RFM_ENABLE_RESULTS_STORAGE=1
_commcamp_root=$(cd -P "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -n "${COMMCAMP_HOME:-}" ]; then _commcamp_ws=$COMMCAMP_HOME
elif [ -f "$_commcamp_root/campaigns/paths.py" ]; then _commcamp_ws=$_commcamp_root/results
else _commcamp_ws=${XDG_DATA_HOME:-$HOME/.local/share}/commcamp
fi
export RFM_SQLITE_DB_FILE="${RFM_SQLITE_DB_FILE:-$_commcamp_ws/reframe/results.db}"
unset _commcamp_root _commcamp_ws
