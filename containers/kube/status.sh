#!/usr/bin/env bash
# Show the kube sandbox: each daemon (pid, RSS), container shims and
# containers, the total RSS, a node summary and the DRA pools. Exit 0 only
# when every daemon runs, every node is Ready and every real node has its pool.
# Usage: containers/kube/status.sh
set -euo pipefail
. "$(dirname "$0")/common.sh"

rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
pids_in() { [ -d "$1" ] && find "$1" -name cgroup.procs -exec cat {} + 2>/dev/null || true; }

ok=0 total=0
daemons="etcd kube-apiserver kube-controller-manager kube-scheduler kube-proxy kwok"
for n in $SBX_REAL_NODES; do daemons="$daemons containerd-$n kubelet-$n dra-plugin-$n"; done
printf '%-26s %8s %9s\n' DAEMON PID RSS_MiB
for d in $daemons; do
  if is_running "$d"; then
    pid=$(cat "$SBX_RUN/$d.pid") r=$(rss_kb "$pid")
    total=$((total + r))
    printf '%-26s %8s %9d\n' "$d" "$pid" $((r / 1024))
  else
    printf '%-26s %8s %9s\n' "$d" - down
    ok=1
  fi
done
# Shims live in each node's daemon cgroup, containers under its cgroup root.
for n in $SBX_REAL_NODES; do
  s=0 c=0 ns=0 nc=0
  for p in $(pids_in "/sys/fs/cgroup/pids/sbx-$n-daemons"); do
    [ "$p" = "$(cat "$SBX_RUN/containerd-$n.pid" 2>/dev/null)" ] && continue
    [ "$p" = "$(cat "$SBX_RUN/kubelet-$n.pid" 2>/dev/null)" ] && continue
    [ "$p" = "$(cat "$SBX_RUN/dra-plugin-$n.pid" 2>/dev/null)" ] && continue
    s=$((s + $(rss_kb "$p"))) ns=$((ns + 1))
  done
  for p in $(pids_in "/sys/fs/cgroup/pids/sbx-$n"); do c=$((c + $(rss_kb "$p"))) nc=$((nc + 1)); done
  total=$((total + s + c))
  printf '%-26s %8s %9d\n' "shims-$n" "$ns" $((s / 1024)) "containers-$n" "$nc" $((c / 1024))
done
printf '%-26s %8s %9d\n' TOTAL "" $((total / 1024))

if is_running kube-apiserver && kc get --raw /readyz >/dev/null 2>&1; then
  want=$(( $(real_nodes | wc -l) + SBX_SIM_NODES ))
  kc get nodes --no-headers -L type 2>/dev/null |
    awk -v want="$want" '{n[$NF" "$2]++; if ($2 == "Ready") r++}
      END {for (k in n) printf "nodes %-16s %d\n", k, n[k]; printf "ready %d of %d wanted\n", r, want; exit (r < want)}' || ok=1
  # The DRA driver's pools: one per real node, named after it (and the kwok nodes' mock ones).
  pools=$(kc get resourceslices --field-selector "spec.driver=$KUBE_DRA_DRIVER" \
    -o jsonpath='{range .items[*]}{.spec.pool.name}{" "}{end}' 2>/dev/null || true)
  real=""
  for n in $SBX_REAL_NODES; do
    if [[ " $pools" == *" $n "* ]]; then real="$real $n"; else ok=1; fi
  done
  echo "DRA $KUBE_DRA_DRIVER pools:${real:- none}; simulated: $(( $(wc -w <<<"$pools") - $(wc -w <<<"$real") ))"
else
  echo "apiserver: not ready"
  ok=1
fi
echo "KUBECONFIG=$ADMIN_KUBECONFIG"
exit $ok
