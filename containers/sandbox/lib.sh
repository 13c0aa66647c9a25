# Helpers for the sandbox scripts: logging, background daemons, waiting.
# Sourced, never run.
# shellcheck source=settings.sh
. "$(dirname "${BASH_SOURCE[0]}")/settings.sh"

SBX_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

say() { printf '[sandbox %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

ensure_dirs() { mkdir -p "$SBX_CACHE" "$SBX_RUN" "$SBX_LOG"; }

# ensure_control_ip: SBX_CONTROL_IP on the loopback device (idempotent). Loopback, not a
# dummy device: some VM kernels have no dummy driver, every kernel has lo.
ensure_control_ip() { ip addr replace "$SBX_CONTROL_IP/32" dev lo; }
remove_control_ip() { ip addr del "$SBX_CONTROL_IP/32" dev lo 2>/dev/null || true; }

# start_bg NAME CMD...: start CMD detached in its own session, stdout/stderr to
# $SBX_LOG/NAME.log, pid to $SBX_RUN/NAME.pid. No-op if already running.
start_bg() {
  local name=$1; shift
  ensure_dirs
  if is_running "$name"; then return 0; fi
  # No descriptor of the caller's beyond stdio: a daemon must not hold its lock or pipe open.
  # Every signal at its default, as systemd starts a daemon: a background command of a script
  # ignores INT and QUIT (and HUP under nohup), and slurmd's jobs would inherit that. A native
  # batch script then could not trap `scancel -s INT -b`, where a production one can.
  setsid env --default-signal "$@" </dev/null >>"$SBX_LOG/$name.log" 2>&1 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- &
  echo $! >"$SBX_RUN/$name.pid"
}

# write_if_changed FILE < CONTENT: replace FILE only when CONTENT differs (daemons that watch
# their config, or compare mtimes, must not see a rewrite of the same bytes).
write_if_changed() {
  local file=$1 new
  new=$(cat; echo x)   # the x keeps trailing newlines through $(...)
  if [ -f "$file" ] && [ "$(cat "$file"; echo x)" = "$new" ]; then return 0; fi
  printf '%s' "${new%x}" >"$file.new" && mv "$file.new" "$file"
}

is_running() {
  local pid
  pid=$(cat "$SBX_RUN/$1.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && pid_alive "$pid"
}

# pid_alive PID: running and not a zombie (pid 1 here reaps orphans slowly).
pid_alive() {
  local state
  state=$(sed 's/.*) //; s/ .*//' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# stop_bg NAME [SECONDS]: TERM the daemon's whole session, KILL after SECONDS.
stop_bg() {
  local name=$1 grace=${2:-10} pid i
  pid=$(cat "$SBX_RUN/$name.pid" 2>/dev/null) || return 0
  if pid_alive "$pid"; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    for ((i = 0; i < grace * 10; i++)); do
      pid_alive "$pid" || break
      sleep 0.1
    done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$SBX_RUN/$name.pid"
}

# wait_for DESC SECONDS CMD...: poll CMD every 0.1 s until it succeeds.
wait_for() {
  local desc=$1 limit=$2 i; shift 2
  for ((i = 0; i < limit * 10; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  die "timed out after ${limit}s waiting for $desc"
}

