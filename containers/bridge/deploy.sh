#!/usr/bin/env bash
# `make bridge-deploy`: run the bridge on the sandbox as production runs it in a cluster: the Helm
# chart deploy/helm/slurm-k8s-bridge (2 replicas, leader election), from the image `make image`
# builds, on the real nodes. Values: containers/bridge/sandbox-values.yaml (fixed) plus a values
# file written here (image, config, JWT, munge key, slurm.conf, run-as uid); then
# `helm upgrade --install --wait`, wait for the leader, and set up Slurm's side as bridge-up does.
#   SBX_BRIDGE_BACKEND=pyslurm: the daemon uses the image's pyslurm (libslurm talks to slurmctld
#   with munge, so it runs as SlurmUser) instead of slurmrestd.
set -euo pipefail
. "$(dirname "$0")/common.sh"
. "$SBX_REPO/containers/helm/common.sh"   # HELM, hc
: "${SBX_BRIDGE_BACKEND:=rest}"
case $SBX_BRIDGE_BACKEND in rest | pyslurm) ;; *) die "SBX_BRIDGE_BACKEND must be rest or pyslurm" ;; esac

require_sandbox
if is_running bridge; then die "the bridge runs on the host (make bridge-up); make bridge-down first"; fi
"$SBX_REPO/containers/helm/build.sh" >/dev/null   # a no-op once built (sandbox-up builds it)
if kc_deployed && ! hc status slurm-k8s-bridge -n "$BRIDGE_NAMESPACE" >/dev/null 2>&1; then
  die "a Deployment not made by the chart (kubectl apply -k, before it) is running: make bridge-down first"
fi
image=$("$SBX_REPO/containers/images/bridge-image.sh")
install_waiter
ensure_scratch

deploy_dir="$BRIDGE_STATE/deploy"
mkdir -p "$deploy_dir" && chmod 700 "$deploy_dir"
mint_jwt "$deploy_dir/slurm.jwt"
# slurm.conf as pods see it, for libslurm in the pod: slurmctld at the host's control address,
# munged at the sidecar's socket, and no PluginDir (the Slurm hosts' directories are not in the
# image, and libslurm refuses one that does not exist; the image's Slurm finds its own plugins).
sed -e "s/^SlurmctldHost=\([^(]*\)(127.0.0.1)/SlurmctldHost=\1($SBX_CONTROL_IP)/" \
  -e "s|^AuthInfo=socket=.*|AuthInfo=socket=/run/munge/munge.socket.2|" -e '/^PluginDir=/d' \
  "$SLURM_CONF" >"$deploy_dir/slurm.conf"
grep -q "^SlurmctldHost=.*($SBX_CONTROL_IP)" "$deploy_dir/slurm.conf" || die "cannot point slurm.conf's SlurmctldHost at $SBX_CONTROL_IP"
# Who the daemon runs as: its own unprivileged uid with slurmrestd (the JWT carries SlurmUser's
# rights); SlurmUser itself with pyslurm (slurmctld trusts the munge uid). The chart picks.
slurm_uid=$(in_ns id -u slurm)
# The top-level keys the sandbox's host daemon has too; cluster and namespace are values of the
# chart (it writes them, and the RBAC's namespace, from one value).
settings=$(job_settings_config)
cluster=$(sed -n 's/^cluster = "\(.*\)"$/\1/p' <<<"$settings")
job_namespace=$(sed -n 's/^namespace = "\(.*\)"$/\1/p' <<<"$settings")
[ -n "$cluster" ] && [ -n "$job_namespace" ] || die "cannot read cluster and namespace from job_settings_config"
grep -v '^cluster = \|^namespace = ' <<<"$settings" >"$deploy_dir/top-level.toml"
# No [workloads] here: the Deployment has no step key file, which signs the gangs' job comments
# (the chart's admission policies still hold the managed namespaces' pods: they wait).
# The agent on the nodes comes from the chart's DaemonSet here (agentOnNodes), into a directory of
# its own: the daemon's pods mount what the chart installed, as a site's do.
AGENT_CHART_DIR="$SBX_STATE/agent-node-chart"
if [ "$SBX_AGENT_FROM" = node ]; then SBX_AGENT_HOST_DIR="$AGENT_CHART_DIR/current"; fi
partitions_config >"$deploy_dir/tables.toml"
# JSON is YAML: a values file with every string quoted right, whatever it holds.
(umask 077 && IMAGE=$image JOB_NAMESPACE=$job_namespace CLUSTER=$cluster BACKEND=$SBX_BRIDGE_BACKEND \
  SLURMRESTD_URL="http://$SBX_CONTROL_IP:$SBX_SLURMRESTD_PORT" SLURM_UID=$slurm_uid \
  MUNGE_KEY="$SBX_STATE/munge/munge.key" WAITER_COMMAND=$WAITER_COMMAND DEPLOYED_AT=$(date +%s) \
  AGENT_FROM=$SBX_AGENT_FROM AGENT_CHART_DIR=$AGENT_CHART_DIR \
  python3 -I - "$deploy_dir" >"$deploy_dir/values.json.new" <<'PY'
import base64, json, os, pathlib, sys
d, env = pathlib.Path(sys.argv[1]), os.environ
repository, _, tag = env["IMAGE"].rpartition(":")
print(json.dumps({
    "image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
    "jobNamespace": {"name": env["JOB_NAMESPACE"]},
    "slurm": {
        "clusterName": env["CLUSTER"],
        "backend": env["BACKEND"],
        # slurmrestd as pods see the host.
        "url": env["SLURMRESTD_URL"],
        "user": "slurm",
        "slurmUserId": int(env["SLURM_UID"]),
        "slurmConf": (d / "slurm.conf").read_text(),
    },
    "secrets": {
        "jwt": {"value": (d / "slurm.jwt").read_text()},
        "munge": {"keyBase64": base64.b64encode(pathlib.Path(env["MUNGE_KEY"]).read_bytes()).decode()},
    },
    "config": {
        "extraTopLevel": (d / "top-level.toml").read_text(),
        "extraSlurm": "poll_interval_s = 0.2\n",
        # unmunge talks to the munged sidecar (the default socket).
        "extraWaiter": f"attach_command = {json.dumps(env['WAITER_COMMAND'])}\n",
        "extraTables": (d / "tables.toml").read_text(),
    },
    # A re-deploy rolls the replicas, as a new image under the same tag needs.
    "podAnnotations": {"slurm-k8s-bridge.sandbox/deployed-at": env["DEPLOYED_AT"]},
    # The agent on the real nodes (kwok nodes run no containers), from the agent's image.
    "agentOnNodes": {
        "enabled": env["AGENT_FROM"] == "node",
        "image": "sandbox.local/slurm-k8s-bridge-agent:1",
        "hostDir": env["AGENT_CHART_DIR"],
        "nodeSelector": {"type": "real"},
    },
}, indent=1))
PY
) && mv "$deploy_dir/values.json.new" "$deploy_dir/values.json"

# The job namespace is shared with the host daemon's runs: made here when missing, never removed.
kc get namespace "$job_namespace" >/dev/null 2>&1 || kc create namespace "$job_namespace" >/dev/null
release_takes_admission
hc upgrade --install slurm-k8s-bridge "$SBX_REPO/deploy/helm/slurm-k8s-bridge" \
  --namespace "$BRIDGE_NAMESPACE" --create-namespace \
  -f "$SBX_REPO/containers/bridge/sandbox-values.yaml" -f "$deploy_dir/values.json" \
  --wait --timeout 180s >"$deploy_dir/helm.log" 2>&1 ||
  die "helm upgrade --install failed ($deploy_dir/helm.log): $(tail -3 "$deploy_dir/helm.log"); kubectl -n $BRIDGE_NAMESPACE describe pods; kubectl -n $BRIDGE_NAMESPACE logs -l app.kubernetes.io/name=slurm-k8s-bridge"
ensure_managed_namespaces   # after the release: its policies hold them from the start
# The config as the daemon reads it (the chart wrote it): job_submit.lua's settings come from it.
kc -n "$BRIDGE_NAMESPACE" get configmap slurm-k8s-bridge -o 'jsonpath={.data.config\.toml}' >"$deploy_dir/config.toml"
service_ip=$(kc -n "$BRIDGE_NAMESPACE" get service slurm-k8s-bridge -o 'jsonpath={.spec.clusterIP}')
# Waiters on the slurmds reach the leader through the Service (kube-proxy on the host).
ready() { curl -fsS --max-time 2 "http://$service_ip:8470/readyz" >/dev/null; }
wait_for "the leader behind http://$service_ip:8470" 60 ready
slurm_side_up "$deploy_dir/config.toml"
say "bridge is deployed (helm -n $BRIDGE_NAMESPACE status slurm-k8s-bridge): kubectl -n $BRIDGE_NAMESPACE get pods; sbatch -p k8s ..."
