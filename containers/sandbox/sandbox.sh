#!/usr/bin/env bash
# sandbox.sh up|down|status|env|wait: the whole local sandbox (Slurm + Kubernetes).
# `down` stops every daemon and removes the sandbox's state; the cache of
# built binaries, rootfs and images stays, so the next `up` takes seconds.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
C="$SBX_REPO/containers"

cmd_up() {
  local t0=$SECONDS
  ensure_dirs
  ensure_control_ip
  "$C/slurm/up.sh"
  "$C/kube/up.sh"
  say "sandbox is up in $((SECONDS - t0)) s. Try: eval \"\$(make -s sandbox-env)\"; sinfo; kubectl get nodes"
}

cmd_down() {
  if [ -f "$SBX_STATE/slurm/etc/slurm.conf" ]; then "$C/bridge/down.sh" || true; fi
  "$C/kube/down.sh" || true
  "$C/slurm/down.sh" || true
  remove_control_ip
  # Keep nothing but the cache: the next up starts from a clean state. That includes the
  # test users' homes: job ids start again at 1, and an old slurm-<id>.out would be mistaken
  # for a new job's.
  if [ -d "$SBX_STATE" ] && ! grep -q " $SBX_STATE" /proc/mounts; then rm -rf "$SBX_STATE"
  else say "something is still mounted under $SBX_STATE; left it in place"; fi
  local entry name id
  for entry in $SBX_USERS; do
    name=${entry%%:*} id=${entry##*:}
    if [ -d "$SBX_SHARED_HOME/$name" ] && [ "$(stat -c %u "$SBX_SHARED_HOME/$name")" = "$id" ]; then
      rm -rf "${SBX_SHARED_HOME:?}/$name"
    fi
  done
}

cmd_status() {
  local rc=0
  echo "Slurm:"; "$C/slurm/status.sh" || rc=1
  echo "Kubernetes:"; "$C/kube/status.sh" || rc=1
  return $rc
}

cmd_env() {
  cat <<ENV
export PATH="$SBX_STATE/bin:\$PATH"
export SLURM_CONF="$SBX_STATE/slurm/etc/host/slurm.conf"
export KUBECONFIG="$SBX_STATE/kube/admin.kubeconfig"
export SLURMRESTD_URL="http://127.0.0.1:$SBX_SLURMRESTD_PORT"
# The host as pods see it (slurmrestd and the API server listen there too).
export SBX_CONTROL_IP="$SBX_CONTROL_IP"
ENV
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  *) echo "usage: $0 up|down|status|env" >&2; exit 2 ;;
esac
