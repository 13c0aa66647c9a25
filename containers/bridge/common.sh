# Shared by bridge up.sh (daemon on the host) and deploy.sh (daemon as the Deployment): what
# Slurm's side needs in both modes. Sourced, never run.
# shellcheck source=../slurm/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../slurm/common.sh"
# shellcheck source=../kube/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../kube/common.sh"   # kc, ADMIN_KUBECONFIG
BRIDGE_STATE="$SBX_STATE/bridge"
VENV="$SBX_REPO/.venv"
# The waiter, as the slurmds run it: the compiled, static agent/cmd/waiter, by absolute path, so
# nothing of the user's PATH, cwd or environment decides what runs.
WAITER_FILE="$BRIDGE_STATE/libexec/slurm-k8s-bridge-waiter"
WAITER_COMMAND=$WAITER_FILE

require_sandbox() {
  [ -f "$SLURM_CONF" ] && [ -f "$ADMIN_KUBECONFIG" ] || die "the sandbox is not up: run make sandbox-up first"
  [ -x "$VENV/bin/slurm-k8s-bridge" ] || make -C "$SBX_REPO" -s venv
  mkdir -p "$BRIDGE_STATE"
}

# install_waiter: the waiter as a site installs it (deploy/slurm/install-waiter.sh: static,
# root-owned, replaced by one rename), and the daemon's modules for the rootfs's Python (the pyslurm
# backend runs there, with PYTHONPATH=$BRIDGE_STATE/lib).
install_waiter() {
  rm -rf "$BRIDGE_STATE/lib.new" && mkdir -p "$BRIDGE_STATE/lib.new"
  cp -r "$SBX_REPO/bridge" "$BRIDGE_STATE/lib.new/"
  rm -rf "$BRIDGE_STATE/lib" && mv "$BRIDGE_STATE/lib.new" "$BRIDGE_STATE/lib"
  chmod -R a+rX "$BRIDGE_STATE/lib"
  install -d -m 755 "$(dirname "$WAITER_FILE")"
  "$SBX_REPO/deploy/slurm/install-waiter.sh" "$WAITER_FILE" >/dev/null || die "cannot install the compiled waiter"
}

# mint_jwt FILE: a slurmrestd token for the daemon (SlurmUser may see and modify every job).
mint_jwt() {
  (umask 077 && "$SLURM_DIR/cli.sh" scontrol token username=slurm lifespan=604800 >"$1.new")
  mv "$1.new" "$1"
}

STEP_KEY="$SLURM_ETC/bridge-step.key"
# ensure_step_key: the secret that signs srun steps of bridged jobs (daemon and SPANK guard).
ensure_step_key() {
  [ -s "$STEP_KEY" ] && return 0
  (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$STEP_KEY.new" && mv "$STEP_KEY.new" "$STEP_KEY")
}
SCRATCH_DIR="$SBX_STATE/scratch"
ensure_scratch() { mkdir -p "$SCRATCH_DIR" && chmod 1777 "$SCRATCH_DIR"; }

# How job pods get the in-pod agent: "node" (mounted from SBX_AGENT_HOST_DIR on the real nodes,
# where containers/images/agent.sh installs it: no init container) or "init" (an init container
# copies it from its image). e2e tests run the bridge both ways, and with a directory no node has.
: "${SBX_AGENT_FROM:=node}"
: "${SBX_AGENT_HOST_DIR:=$SBX_STATE/agent-node/current}"

# partitions_config: the [partitions.*] tables, the same in both modes.
partitions_config() {
  local agent_host_dir="agent_host_dir = \"$SBX_AGENT_HOST_DIR\""
  [ "$SBX_AGENT_FROM" = node ] || agent_host_dir="# agent_host_dir unset: an init container copies the agent"
  cat <<TOML
[pods]
# The in-pod agent, built from agent/ by containers/images/agent.sh at sandbox-up.
agent_image = "sandbox.local/slurm-k8s-bridge-agent:1"
# ... and installed on the real nodes by the same script.
$agent_host_dir
# As slurm.conf's JobAcctGatherFrequency=task=5: sstat sees a bridged job's use as often as a native one's.
usage_interval_s = 5

[nodes]
# Tests make nodes NotReady and wait for Slurm to follow; sites keep the 60 s default or more.
not_ready_grace_s = 5

[partitions.k8s]
# A script without a "#K8S image=" line runs here unchanged, as it would natively: bash,
# coreutils and python3 (a debootstrap minbase). The dra partition keeps none, to show the refusal.
default_image = "sandbox.local/debian-python:12"
image_pull_policy = "IfNotPresent"
# slurm.conf gives each real node 8 CPUs on a 2-core VM (see containers/slurm/etc).
cpu_request_fraction = 0.1
[[partitions.k8s.volumes]]
name = "home"
host_path = "$SBX_SHARED_HOME"
# A node-local scratch directory, as sites mount one; tests remove it to see a pod that cannot
# start (FailedMount) fail its job at the start deadline.
[[partitions.k8s.volumes]]
name = "scratch"
host_path = "$SCRATCH_DIR"
mount_path = "/scratch"

# The real nodes again, GPUs by DRA: containers/kube/up.sh runs kubernetes-sigs' example driver
# on each (mock GPUs gpu-0..gpu-N with an index attribute, injected through CDI).
[partitions.dra]
image_pull_policy = "IfNotPresent"
cpu_request_fraction = 0.1
gpu_mode = "dra"
dra_driver = "gpu.example.com"
dra_device_identity = "index"
[[partitions.dra.volumes]]
name = "home"
host_path = "$SBX_SHARED_HOME"

# The kwok nodes again, GPUs by DRA (their ResourceSlices are published by containers/kube/up.sh,
# no driver prepares anything there): what the claims cost the API server, for make bench-scale.
[partitions.simdra]
default_image = "sandbox.local/busybox:1"
simulated = true
gpu_mode = "dra"
dra_driver = "gpu.example.com"
[partitions.simdra.pod_annotations]
"pod-complete.stage.kwok.x-k8s.io/delay" = "\${SIM_RUN_TIME:-1s}"
"pod-complete.stage.kwok.x-k8s.io/exit-code" = "\${SIM_EXIT_CODE:-0}"
[[partitions.simdra.volumes]]
name = "home"
host_path = "$SBX_SHARED_HOME"

[partitions.sim]
default_image = "sandbox.local/busybox:1"
# kwok nodes run no containers and serve no logs: the daemon reads no output from them.
simulated = true
# kwok's pod stages (containers/kube/kwok.yaml) end a simulated pod after the delay, with the exit
# code; a job picks them with --export=...,SIM_RUN_TIME=30s,SIM_EXIT_CODE=3.
[partitions.sim.pod_annotations]
"pod-complete.stage.kwok.x-k8s.io/delay" = "\${SIM_RUN_TIME:-1s}"
"pod-complete.stage.kwok.x-k8s.io/exit-code" = "\${SIM_EXIT_CODE:-0}"
[[partitions.sim.volumes]]
name = "home"
host_path = "$SBX_SHARED_HOME"
TOML
}

# workloads_config: the managed namespaces (Kubernetes workloads scheduled by Slurm), for the daemon
# on the host (the Deployment has no step key, which signs their jobs' comments); only slurmrestd
# submits in another user's name, so none with the pyslurm backend.
# The namespaces and the admission policies that hand their pods to the bridge: up.sh/deploy.sh.
workloads_config() {
  [ "${SBX_BRIDGE_BACKEND:-rest}" = rest ] || return 0
  cat <<TOML

[workloads]
gang_wait_s = 60
[workloads.namespaces.team-alice]
user = "alice"
account = "lab_alice"
partition = "k8s"
partitions = ["sim", "dra", "simdra"]
qoses = ["gpu2"]
[workloads.namespaces.team-bob]
user = "bob"
account = "lab_bob"
partition = "k8s"
partitions = ["sim", "dra", "simdra"]
qoses = ["gpu2"]
TOML
}

# job_settings_config: top-level keys, the same in both modes.
job_settings_config() {
  cat <<TOML
cluster = "sandbox"
namespace = "slurm-jobs"
# A TERM trap gets as long as natively (KillWait=10 in slurm.conf.in), less the second that lets its
# last lines reach the waiter before slurmstepd kills it at KillWait.
termination_grace_s = 9
# The sandbox has no registry: a missing image never appears, fail fast.
start_failure_grace_s = 10
TOML
}

# write_job_submit_settings CONFIG: job_submit_bridge.conf (read by job_submit.lua and the SPANK
# step guard) from a bridge config; only the standard library is needed, so the Slurm half of the
# sandbox can write it before any venv exists. Replaced atomically: both readers fail closed.
write_job_submit_settings() {
  local out="$SLURM_ETC/job_submit_bridge.conf"
  ensure_step_key
  python3 -I -c 'import sys; sys.path.insert(0, sys.argv[1]); from bridge.manager.cli import main
sys.exit(main(["job-submit-conf", "-c", sys.argv[2]]))' "$SBX_REPO" "$1" >"$out.new"
  chmod 644 "$out.new" && mv "$out.new" "$out"
}

# sandbox_bridge_config FILE: a minimal bridge config with the sandbox's partitions (what the
# Slurm half needs to know before the daemon's own config exists).
sandbox_bridge_config() {
  {
    job_settings_config
    printf '\n[slurm]\nurl = "http://127.0.0.1:%s"\ntoken_file = "%s"\n' "$SBX_SLURMRESTD_PORT" "$BRIDGE_STATE/slurm.jwt"
    printf '\n[waiter]\nattach_command = "%s"\nstep_key_file = "%s"\n\n' "$WAITER_COMMAND" "$STEP_KEY"
    partitions_config
    workloads_config
  } >"$1"
}

# slurm_side_up CONFIG: job_submit.lua and its settings (derived from CONFIG), then one slurmd
# per bridged node (they only ever run waiters); waits until Slurm sees them.
slurm_side_up() {
  write_job_submit_settings "$1"
  cp "$SBX_REPO/deploy/slurm/job_submit.lua" "$SLURM_ETC/job_submit.lua"
  local node
  for node in $(bridged_nodes); do start_bridged_slurmd "$node"; done
  # Up means responding: a node drained (by an admin, or by Slurm after a refused launch) counts.
  for node in $(bridged_nodes); do
    wait_for "slurmd $node" 30 sh -c "'$SLURM_DIR/cli.sh' sinfo -h -n $node -o %T | grep -qE '^(idle|mixed|allocated|drain|drained|draining)'"
  done
}

# The Deployment mode's objects (the Helm release of deploy/helm/slurm-k8s-bridge).
BRIDGE_NAMESPACE=slurm-k8s-bridge
kc_deployed() { kc -n "$BRIDGE_NAMESPACE" get deployment slurm-k8s-bridge >/dev/null 2>&1; }

# ------------------------------------------------------------------ managed namespaces (issue 20)
# Pods in namespaces labelled slurm-k8s-bridge/managed=true wait for Slurm: the chart's admission
# policies (deploy/helm/slurm-k8s-bridge/templates/admission.yaml) give them the bridge's scheduler
# name and refuse nodeName, other schedulers, bindings and the bridge's own keys from anyone else.
# One source for both modes: the Deployment's release installs them (workloads.enabled in
# sandbox-values.yaml); for the daemon on the host, up.sh applies the same template, rendered with
# the same values.
MANAGED_NAMESPACES="team-alice:alice team-bob:bob"   # namespace:user, who may edit it

# job_namespace: the daemon's job namespace, from job_settings_config (the chart excludes it).
job_namespace() { job_settings_config | sed -n 's/^namespace = "\(.*\)"$/\1/p'; }

# admission_manifest: templates/admission.yaml as the sandbox's release renders it (needs HELM, hc:
# containers/helm/common.sh).
admission_manifest() {
  hc template slurm-k8s-bridge "$SBX_REPO/deploy/helm/slurm-k8s-bridge" --namespace "$BRIDGE_NAMESPACE" \
    -f "$SBX_REPO/containers/bridge/sandbox-values.yaml" --set-string "jobNamespace.name=$(job_namespace)" \
    --show-only templates/admission.yaml
}

# apply_workload_admission: the policies for the daemon on the host. Server-side apply: a policy's
# matchConstraints is atomic and the server adds defaults to it, so a client-side apply would
# rewrite it at every run. They stay when the daemon stops: pods in managed namespaces then wait.
apply_workload_admission() {
  local out
  "$SBX_REPO/containers/helm/build.sh" >/dev/null   # a no-op once built (sandbox-up builds it)
  out=$(admission_manifest | kc apply --server-side --force-conflicts --field-manager=sandbox-bridge -f - 2>&1) ||
    die "cannot apply the chart's admission policies: $out"
}

# release_takes_admission: before the first install of the release, the policies bridge-up applied
# go (helm adopts no object it did not make); the release installs the same ones at once.
release_takes_admission() {
  hc status slurm-k8s-bridge -n "$BRIDGE_NAMESPACE" >/dev/null 2>&1 && return 0
  admission_manifest | kc delete --ignore-not-found -f - >/dev/null 2>&1 || true
}

# ensure_managed_namespaces: team-alice and team-bob, labelled managed; each user may edit their
# own (a RoleBinding to the built-in edit role; the e2e tests act as them with --as).
ensure_managed_namespaces() {
  local pair ns user
  for pair in $MANAGED_NAMESPACES; do
    ns=${pair%%:*} user=${pair#*:}
    cat <<YAML
---
apiVersion: v1
kind: Namespace
metadata:
  name: $ns
  labels: {slurm-k8s-bridge/managed: "true"}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: $user-edit, namespace: $ns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: $user}]
---
# GPUs: a pod asks for them by a claim made from a ResourceClaimTemplate (edit has no DRA objects).
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: dra-user, namespace: $ns}
rules:
- apiGroups: [resource.k8s.io]
  resources: [resourceclaimtemplates, resourceclaims]
  verbs: [get, list, watch, create, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: $user-dra, namespace: $ns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: dra-user}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: $user}]
YAML
  done | kc apply -f - >/dev/null
}
