#!/usr/bin/env bash
# Smoke test of a running kube sandbox (after up.sh). Checks:
#   nodes: every real and kwok node Ready;
#   exit7: busybox pod on a real node prints "hi", ends Failed, exit code 7,
#          and `kubectl logs` returns "hi";
#   uid:   pod as uid/gid 2001 with hostPath /home mounted at /home runs python3;
#   kwok:  pod on a kwok node goes Running, and one with the kwok annotations
#          ends Failed with exit code 3 after 2 s;
#   nope:  a missing image ends in ErrImagePull/ImagePullBackOff, not a hang.
# Prints "N passed, M failed"; exit 1 on any failure. Removes its pods.
# Usage: containers/kube/smoke.sh
set -euo pipefail
. "$(dirname "$0")/common.sh"
ns=sbx-smoke
pass=0 fail=0
check() { # check NAME CMD...
  local name=$1; shift
  if ("$@"); then say "ok   $name"; pass=$((pass + 1)); else say "FAIL $name"; fail=$((fail + 1)); fi
}
real1=$(real_nodes | head -1) real2=$(real_nodes | tail -1)

kc delete namespace "$ns" --ignore-not-found --wait=true >/dev/null
kc create namespace "$ns" >/dev/null
wait_for "serviceaccount in $ns" 30 kc -n "$ns" get serviceaccount default
kc -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: exit7}
spec:
  nodeName: $real1
  restartPolicy: Never
  tolerations: [{key: slurm-k8s-bridge/bridged, operator: Exists}]
  containers:
  - {name: c, image: sandbox.local/busybox:1, imagePullPolicy: IfNotPresent,
     command: [sh, -c, 'echo hi; exit 7']}
---
apiVersion: v1
kind: Pod
metadata: {name: uid}
spec:
  nodeSelector: {type: real, kubernetes.io/hostname: $real2}
  restartPolicy: Never
  tolerations: [{key: slurm-k8s-bridge/bridged, operator: Exists, effect: NoSchedule}]
  securityContext: {runAsUser: 2001, runAsGroup: 2001}
  volumes: [{name: home, hostPath: {path: /home, type: Directory}}]
  containers:
  - name: c
    image: sandbox.local/debian-python:12
    imagePullPolicy: IfNotPresent
    command: [sh, -c, 'test -d /home && python3 -c "import os; print(os.getuid(), os.getgid())"']
    volumeMounts: [{name: home, mountPath: /home}]
---
apiVersion: v1
kind: Pod
metadata: {name: sim-run}
spec:
  nodeSelector: {type: kwok}
  tolerations: [{key: slurm-k8s-bridge/bridged, operator: Exists}]
  containers: [{name: c, image: sandbox.local/busybox:1}]
---
apiVersion: v1
kind: Pod
metadata:
  name: sim-exit3
  annotations:
    pod-complete.stage.kwok.x-k8s.io/delay: "2s"
    pod-complete.stage.kwok.x-k8s.io/exit-code: "3"
spec:
  nodeSelector: {type: kwok}
  tolerations: [{key: slurm-k8s-bridge/bridged, operator: Exists}]
  containers: [{name: c, image: sandbox.local/busybox:1}]
---
apiVersion: v1
kind: Pod
metadata: {name: nope}
spec:
  nodeName: $real1
  tolerations: [{key: slurm-k8s-bridge/bridged, operator: Exists}]
  containers: [{name: c, image: sandbox.local/nope:1, imagePullPolicy: IfNotPresent}]
EOF

jp() { kc -n "$ns" get pod "$1" -o jsonpath="$2" 2>/dev/null; }
phase_is() { [ "$(jp "$1" '{.status.phase}')" = "$2" ]; }
waiting_reason() { jp "$1" '{.status.containerStatuses[0].state.waiting.reason}' | grep -qE "$2"; }

want=$(( $(real_nodes | wc -l) + SBX_SIM_NODES ))
nodes_ready() { [ "$(kc get nodes --no-headers | awk '$2 == "Ready"' | wc -l)" -eq "$want" ]; }
check "nodes: $want Ready" nodes_ready

exit7() {
  wait_for "exit7 Failed" 60 phase_is exit7 Failed &&
    [ "$(jp exit7 '{.status.containerStatuses[0].state.terminated.exitCode}')" = 7 ] &&
    [ "$(kc -n "$ns" logs exit7)" = hi ]
}
check "exit7: Failed, exit code 7, logs 'hi'" exit7

uid() { wait_for "uid Succeeded" 60 phase_is uid Succeeded && [ "$(kc -n "$ns" logs uid)" = "2001 2001" ]; }
check "uid: 2001:2001 with /home hostPath, python3" uid

check "kwok: pod Running" wait_for "sim-run Running" 30 phase_is sim-run Running
sim_exit3() {
  wait_for "sim-exit3 Failed" 30 phase_is sim-exit3 Failed &&
    [ "$(jp sim-exit3 '{.status.containerStatuses[0].state.terminated.exitCode}')" = 3 ]
}
check "kwok: annotated pod Failed with exit code 3" sim_exit3
check "nope: ErrImagePull/ImagePullBackOff" wait_for "nope pull error" 30 waiting_reason nope 'ErrImagePull|ImagePullBackOff'

kc delete namespace "$ns" --wait=false >/dev/null
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
