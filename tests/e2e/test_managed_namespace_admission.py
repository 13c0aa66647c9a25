"""Managed namespaces (issue 20), the admission half: the chart's CEL policies
(deploy/helm/slurm-k8s-bridge/templates/admission.yaml, applied by the sandbox) hold every pod of a
namespace labelled slurm-k8s-bridge/managed=true for Slurm, with no server of ours in the way.

The user is hostile: alice, with `edit` in the namespace, and even the right to create bindings
(so that what refuses her is the policy, not RBAC). The tests run in a managed namespace of their
own that the daemon's config maps to no account, so no bridge binds its pods, whatever the daemon
does with team-alice's; the sandbox's team-alice and team-bob see only server-side dry runs."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.e2e.sandbox import JOB_NAMESPACE, Sandbox, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.shares_the_cluster]

NAMESPACE = "slurm-admission-e2e"
SCHEDULER = "slurm-k8s-bridge"
MANAGED = "slurm-k8s-bridge/managed"
POLICY = "slurm-k8s-bridge-slurm-k8s-bridge-workloads"
ALICE = ("--as=alice", "--as-group=system:authenticated")
# Not the bridge, yet past RBAC everywhere: admission policies exempt no group.
MASTER = ("--as=mallory", "--as-group=system:masters")
NODE_NAME_REFUSED = "pods in a Slurm-managed namespace are placed by Slurm: spec.nodeName may not be set"
BINDING_REFUSED = "pods in a Slurm-managed namespace are bound to nodes by the Slurm bridge only, not by "
KEY_REFUSED = "only the Slurm bridge may set or change "


def kubectl(sandbox: Sandbox, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """kubectl ARGS; the caller looks at the return code (refusals are what these tests expect)."""
    return subprocess.run(["kubectl", *args], input=stdin, env=sandbox.environ(), capture_output=True,
                          text=True, timeout=60)


def pod(name: str, spec: dict[str, Any] | None = None, **metadata: Any) -> dict[str, Any]:
    """A pod that would run anywhere (busybox is on every real node; kwok runs anything)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **metadata},
            "spec": {"terminationGracePeriodSeconds": 0, **(spec or {}),
                     "containers": [{"name": "c", "image": "sandbox.local/busybox:1",
                                     "command": ["sleep", "600"]}]}}


def create(sandbox: Sandbox, manifest: dict[str, Any], *who: str,
           namespace: str = NAMESPACE) -> subprocess.CompletedProcess[str]:
    return kubectl(sandbox, "create", "-n", namespace, "-f", "-", *who, stdin=json.dumps(manifest))


def get_pod(sandbox: Sandbox, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    found: dict[str, Any] = sandbox.kubectl_json("get", "pod", "-n", namespace, name)
    return found


def bind(sandbox: Sandbox, name: str, node: str, *who: str) -> subprocess.CompletedProcess[str]:
    """POST the pod's binding subresource, as kube-scheduler (or the bridge) does."""
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    return kubectl(sandbox, "create", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/binding",
                   "-f", "-", *who, stdin=json.dumps(body))


def scheduler_events(sandbox: Sandbox, name: str, namespace: str = NAMESPACE) -> list[str]:
    """What kube-scheduler said about the pod (FailedScheduling on the tainted nodes, Scheduled)."""
    events = sandbox.kubectl_json("get", "events", "-n", namespace,
                                  "--field-selector", f"involvedObject.name={name}")["items"]
    return [f"{e['reason']}: {e.get('message', '')}" for e in events
            if "default-scheduler" in (e.get("reportingComponent"), (e.get("source") or {}).get("component"))]


def assert_held(sandbox: Sandbox, names: list[str], namespace: str = NAMESPACE) -> None:
    """Each pod names the bridge's scheduler, and stays Pending, unbound, unseen by kube-scheduler
    (which would have tried, and reported FailedScheduling on the tainted nodes, within a second)."""
    for name in names:
        assert get_pod(sandbox, name, namespace)["spec"]["schedulerName"] == SCHEDULER, name
    time.sleep(5)
    for name in names:
        held = get_pod(sandbox, name, namespace)
        assert (held["status"]["phase"], held["spec"].get("nodeName")) == ("Pending", None), name
        assert scheduler_events(sandbox, name, namespace) == [], name


@pytest.fixture(scope="module")
def managed(bridge: Sandbox) -> Iterator[Sandbox]:
    """The sandbox's policies, and a managed namespace of the tests' own where alice may edit and
    even bind (RBAC allows it; the policy must not)."""
    missing = [kind for kind in ("mutatingadmissionpolicy", "mutatingadmissionpolicybinding",
                                 "validatingadmissionpolicy", "validatingadmissionpolicybinding")
               if kubectl(bridge, "get", kind, POLICY).returncode != 0]
    assert missing == [], "the sandbox applies the chart's policies (make bridge-up, containers/bridge/up.sh)"
    kubectl(bridge, "delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=120s")
    bridge.kubectl("create", "namespace", NAMESPACE)
    bridge.kubectl("label", "namespace", NAMESPACE, f"{MANAGED}=true")
    bridge.kubectl("create", "rolebinding", "alice-edit", "-n", NAMESPACE, "--clusterrole=edit",
                   "--user=alice")
    bridge.kubectl("create", "role", "binder", "-n", NAMESPACE, "--verb=create",
                   "--resource=pods/binding,bindings")
    bridge.kubectl("create", "rolebinding", "alice-binder", "-n", NAMESPACE, "--role=binder", "--user=alice")
    yield bridge
    bridge.kubectl("delete", "namespace", NAMESPACE, "--timeout=120s")


def test_the_sandbox_manages_team_alice_and_team_bob(managed: Sandbox) -> None:
    for team, user, other in (("team-alice", "alice", "bob"), ("team-bob", "bob", "alice")):
        namespace = managed.kubectl_json("get", "namespace", team)
        assert namespace["metadata"]["labels"].get(MANAGED) == "true", team
        for who, allowed in ((user, "yes"), (other, "no")):
            can = kubectl(managed, "auth", "can-i", "create", "pods", "-n", team, f"--as={who}")
            assert can.stdout.strip() == allowed, (team, who)
        # A server-side dry run passes admission (mutation included) and stores nothing: no daemon
        # sees the pod.
        dry = kubectl(managed, "create", "-n", team, "-f", "-", "--dry-run=server", "-o", "json",
                      f"--as={user}", "--as-group=system:authenticated", stdin=json.dumps(pod("dry")))
        assert dry.returncode == 0, dry.stderr
        assert json.loads(dry.stdout)["spec"]["schedulerName"] == SCHEDULER, team
    # Elsewhere nothing changes: neither in a namespace without the label, nor in the job namespace.
    for namespace in ("default", JOB_NAMESPACE):
        dry = kubectl(managed, "create", "-n", namespace, "-f", "-", "--dry-run=server", "-o", "json",
                      stdin=json.dumps(pod("dry", {"nodeName": "kreal1"})))
        assert dry.returncode == 0, dry.stderr
        assert json.loads(dry.stdout)["spec"]["schedulerName"] == "default-scheduler", namespace


def test_a_plain_pod_gets_the_bridges_scheduler_and_waits_unbound(managed: Sandbox) -> None:
    created = create(managed, pod("plain"), *ALICE)

    assert created.returncode == 0, created.stderr
    assert_held(managed, ["plain"])


def test_a_pod_with_a_node_name_is_refused(managed: Sandbox) -> None:
    for who in (ALICE, MASTER):
        refused = create(managed, pod("by-hand", {"nodeName": "kreal1"}), *who)

        assert refused.returncode != 0
        assert NODE_NAME_REFUSED in refused.stderr, refused.stderr
        assert "Forbidden" in refused.stderr
    assert kubectl(managed, "get", "pod", "-n", NAMESPACE, "by-hand").returncode != 0


def test_another_scheduler_name_is_replaced_by_the_bridges(managed: Sandbox) -> None:
    """The mutating policy overrides what the pod asked for (the validating one would refuse a pod
    that still named another scheduler: see docs/operations.md)."""
    for name, scheduler in (("default-sched", "default-scheduler"), ("own-sched", "my-scheduler")):
        created = create(managed, pod(name, {"schedulerName": scheduler}), *ALICE)
        assert created.returncode == 0, created.stderr
    assert_held(managed, ["default-sched", "own-sched"])


def test_nobody_but_the_bridge_binds_a_pending_pod(managed: Sandbox) -> None:
    assert create(managed, pod("unbound"), *ALICE).returncode == 0
    for who, user in ((ALICE, "alice"), (MASTER, "mallory")):
        refused = bind(managed, "unbound", "kreal1", *who)

        assert refused.returncode != 0
        assert BINDING_REFUSED + user in refused.stderr, refused.stderr
    # The older way to bind, POST .../bindings, is the same request to the policy.
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "unbound"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "kreal1"}}
    legacy = kubectl(managed, "create", "--raw", f"/api/v1/namespaces/{NAMESPACE}/bindings", "-f", "-",
                     *ALICE, stdin=json.dumps(body))
    assert legacy.returncode != 0
    assert BINDING_REFUSED + "alice" in legacy.stderr, legacy.stderr
    assert get_pod(managed, "unbound")["spec"].get("nodeName") is None


def test_the_bridge_binds_and_kwok_runs_the_pod(managed: Sandbox) -> None:
    """The admin kubeconfig is the host daemon's identity (workloads.bridgeUsers): it may bind."""
    node = managed.kubectl_json("get", "nodes", "-l", "type=kwok")["items"][0]["metadata"]["name"]
    assert create(managed, pod("bound")).returncode == 0

    bound = bind(managed, "bound", node)

    assert bound.returncode == 0, bound.stderr
    running = wait_until("the bound pod to run on its kwok node",
                         lambda: (p := get_pod(managed, "bound"))["status"]["phase"] == "Running" and p, 30)
    assert running["spec"]["nodeName"] == node
    assert scheduler_events(managed, "bound") == []
    managed.kubectl("delete", "pod", "-n", NAMESPACE, "bound", "--timeout=60s")


def test_the_bridges_own_keys_are_refused_to_alice(managed: Sandbox) -> None:
    job_id = {"slurm-k8s-bridge/slurm-job-id": "1"}
    refused = create(managed, pod("claims-a-job", annotations=job_id), *ALICE)
    assert refused.returncode != 0
    assert KEY_REFUSED + "annotation slurm-k8s-bridge/slurm-job-id" in refused.stderr, refused.stderr
    refused = create(managed, pod("claims-a-label", labels={"slurm-k8s-bridge/job-id": "1"}), *ALICE)
    assert refused.returncode != 0
    assert KEY_REFUSED + "label slurm-k8s-bridge/job-id" in refused.stderr, refused.stderr
    # The keys users set for their workload are theirs.
    user_facing = {"slurm-k8s-bridge/account": "lab_alice", "slurm-k8s-bridge/time-limit": "10"}
    created = create(managed, pod("annotated", annotations=user_facing,
                                  labels={"slurm-k8s-bridge/gang": "g", "slurm-k8s-bridge/gang-size": "1"}),
                     *ALICE)
    assert created.returncode == 0, created.stderr
    assert kubectl(managed, "annotate", "pod", "-n", NAMESPACE, "annotated", "slurm-k8s-bridge/partition=sim",
                   *ALICE).returncode == 0

    # On update: adding, changing or removing the bridge's key; keys of her own stay hers.
    added = kubectl(managed, "annotate", "pod", "-n", NAMESPACE, "annotated",
                    "slurm-k8s-bridge/slurm-job-id=1", *ALICE)
    assert added.returncode != 0
    assert KEY_REFUSED + "annotation slurm-k8s-bridge/slurm-job-id" in added.stderr, added.stderr
    labelled = kubectl(managed, "label", "pod", "-n", NAMESPACE, "annotated", "slurm-k8s-bridge/x=1", *ALICE)
    assert labelled.returncode != 0 and KEY_REFUSED + "label slurm-k8s-bridge/x" in labelled.stderr
    assert kubectl(managed, "annotate", "pod", "-n", NAMESPACE, "annotated",
                   "slurm-k8s-bridge/slurm-job-id=7").returncode == 0, "the bridge marks the pod"
    assert kubectl(managed, "annotate", "pod", "-n", NAMESPACE, "annotated", "note=mine",
                   *ALICE).returncode == 0, "the bridge's key, unchanged, does not stop her own edits"
    for change in ("slurm-k8s-bridge/slurm-job-id=8", "slurm-k8s-bridge/slurm-job-id-"):
        changed = kubectl(managed, "annotate", "--overwrite", "pod", "-n", NAMESPACE, "annotated", change,
                          *ALICE)
        assert changed.returncode != 0, change
        assert KEY_REFUSED + "annotation slurm-k8s-bridge/slurm-job-id" in changed.stderr, changed.stderr
    annotations = get_pod(managed, "annotated")["metadata"]["annotations"]
    assert annotations["slurm-k8s-bridge/slurm-job-id"] == "7"
    assert annotations["slurm-k8s-bridge/partition"] == "sim"


def test_no_container_is_added_and_no_resource_resized_after_the_fact(managed: Sandbox) -> None:
    """What Slurm allocated for is what runs: an ephemeral container (kubectl debug) or an in-place
    resize is refused to all but the bridge, system:masters included (RBAC would let them)."""
    guaranteed = pod("debugged")
    guaranteed["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m", "memory": "32Mi"},
                                                        "limits": {"cpu": "100m", "memory": "32Mi"}}
    assert create(managed, guaranteed, *ALICE).returncode == 0
    debug = kubectl(managed, "debug", "-n", NAMESPACE, "debugged", "--image=sandbox.local/busybox:1",
                    "--container=peek", *MASTER)
    assert debug.returncode != 0 and "no ephemeral containers" in debug.stderr, debug.stderr
    # A resize Kubernetes itself accepts (the QOS class stays): only the policy refuses it.
    bigger = json.dumps({"spec": {"containers": [
        {"name": "c", "resources": {"requests": {"cpu": "8"}, "limits": {"cpu": "8"}}}]}})
    resize = kubectl(managed, "patch", "pod", "-n", NAMESPACE, "debugged", "--subresource=resize",
                     "-p", bigger, *MASTER)
    assert resize.returncode != 0 and "no resize" in resize.stderr, resize.stderr


def test_a_jobs_pods_get_the_bridges_scheduler(managed: Sandbox) -> None:
    """The Job controller creates the pods (as its own ServiceAccount): the policy holds them too.
    (Not in team-alice: the daemon would submit and run it there, which is its own tests' subject.)"""
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "admission-e2e"},
           "spec": {"parallelism": 2, "completions": 2, "backoffLimit": 0, "activeDeadlineSeconds": 300,
                    "template": {"spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                                          "containers": [{"name": "c", "image": "sandbox.local/busybox:1",
                                                          "command": ["true"]}]}}}}
    assert create(managed, job, *ALICE).returncode == 0
    try:
        def both_pods() -> list[dict[str, Any]] | None:
            found: list[dict[str, Any]] = managed.kubectl_json(
                "get", "pods", "-n", NAMESPACE, "-l", "batch.kubernetes.io/job-name=admission-e2e"
            )["items"]
            return found if len(found) == 2 else None

        pods = wait_until("the Job's 2 pods", both_pods, 30)
        assert [p["spec"]["schedulerName"] for p in pods] == [SCHEDULER, SCHEDULER]
        assert_held(managed, [p["metadata"]["name"] for p in pods])
    finally:
        managed.kubectl("delete", "job", "-n", NAMESPACE, "admission-e2e", "--cascade=foreground",
                        "--timeout=120s")


def test_twenty_pods_at_once_are_all_held(managed: Sandbox) -> None:
    names = [f"burst-{i:02d}" for i in range(20)]
    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(lambda name: create(managed, pod(name), *ALICE), names))

    assert [r.stderr for r in results if r.returncode != 0] == []
    assert_held(managed, names)
