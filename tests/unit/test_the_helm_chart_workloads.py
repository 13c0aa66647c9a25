"""deploy/helm/slurm-k8s-bridge with workloads.enabled (issue 20): the admission policies that hold
managed namespaces' pods for Slurm, and the daemon's RBAC for them, rendered only when asked for.
What the policies' CEL does is checked against a real API server by
tests/e2e/test_managed_namespace_admission.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.helm_chart import CHART, RELEASE, RELEASE_NAMESPACE, find, helm, render

NAME = f"{RELEASE_NAMESPACE}-{RELEASE}-workloads"
ADMISSION_KINDS = {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
                   "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
ON = {"workloads": {"enabled": True}}


def _kinds(objects: list[dict[str, Any]]) -> set[str]:
    return {o["kind"] for o in objects}


def _variable(policy: dict[str, Any], name: str) -> str:
    found: list[str] = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == name]
    assert len(found) == 1, name
    return found[0]


def test_nothing_of_it_by_default(tmp_path: Path) -> None:
    objects = render(tmp_path)

    assert _kinds(objects) & ADMISSION_KINDS == set()
    assert [o for o in objects if o["metadata"]["name"] == NAME] == []


def test_both_policies_fail_closed_in_managed_namespaces_but_the_bridges_own(tmp_path: Path) -> None:
    objects = render(tmp_path, {**ON, "jobNamespace": {"name": "hpc-jobs"}})

    assert _kinds(objects) >= ADMISSION_KINDS
    mutating = find(objects, "MutatingAdmissionPolicy", NAME)
    validating = find(objects, "ValidatingAdmissionPolicy", NAME)
    assert mutating["apiVersion"] == "admissionregistration.k8s.io/v1beta1", "Kubernetes 1.34's"
    for policy in (mutating, validating):
        assert policy["spec"]["failurePolicy"] == "Fail"
        selector = policy["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"]
        assert {"key": "slurm-k8s-bridge/managed", "operator": "In", "values": ["true"]} in selector
        assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                "values": ["hpc-jobs", RELEASE_NAMESPACE]} in selector
    assert "schedulerName: \"slurm-k8s-bridge\"" in \
        mutating["spec"]["mutations"][0]["applyConfiguration"]["expression"]
    assert find(objects, "MutatingAdmissionPolicyBinding", NAME)["spec"]["policyName"] == NAME
    binding = find(objects, "ValidatingAdmissionPolicyBinding", NAME)
    assert (binding["spec"]["policyName"], binding["spec"]["validationActions"]) == (NAME, ["Deny"])
    assert all(v.get("reason") == "Forbidden" and v.get("message") for v in validating["spec"]["validations"])


def test_the_bridge_is_its_service_account_and_the_users_named(tmp_path: Path) -> None:
    objects = render(tmp_path, {"workloads": {"enabled": True, "bridgeUsers": ["kubernetes-admin"]}})

    bridge = _variable(find(objects, "ValidatingAdmissionPolicy", NAME), "bridge")
    assert bridge == ('request.userInfo.username in '
                      f'["system:serviceaccount:{RELEASE_NAMESPACE}:{RELEASE}","kubernetes-admin"]')


@pytest.mark.parametrize(("version", "kinds"), [
    ("v1", ADMISSION_KINDS),
    ("", {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}),
])
def test_the_mutating_policys_version_follows_the_cluster(
    tmp_path: Path, version: str, kinds: set[str]
) -> None:
    """v1 from Kubernetes 1.36; none where it is off (the validating policy then refuses pods that do
    not name the bridge's scheduler themselves)."""
    objects = render(tmp_path, {"workloads": {"enabled": True, "mutatingPolicyVersion": version}})

    assert _kinds(objects) & ADMISSION_KINDS == kinds
    for policy in (o for o in objects if o["kind"].startswith("Mutating")):
        assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"


def test_an_unknown_mutating_policy_version_is_refused(tmp_path: Path) -> None:
    result = helm("template", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE,
                  values={"workloads": {"enabled": True, "mutatingPolicyVersion": "v1alpha1"}},
                  tmp_path=tmp_path)

    assert result.returncode != 0
    assert "workloads.mutatingPolicyVersion must be v1beta1, v1 or empty" in result.stderr


def test_lint_passes_with_workloads_on_kubernetes_1_34(tmp_path: Path) -> None:
    result = helm("lint", "--strict", str(CHART), "--kube-version", "1.34.4", values=ON, tmp_path=tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr


def test_the_daemon_may_watch_bind_mark_and_delete_pods_cluster_wide(tmp_path: Path) -> None:
    objects = render(tmp_path, ON)

    role = find(objects, "ClusterRole", NAME)
    granted = {(verb, group, resource) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    assert granted >= {
        *{(verb, "", "pods") for verb in ("get", "list", "watch", "patch", "delete")},
        ("create", "", "pods/binding"), ("patch", "", "pods/status"),
        *{(verb, group, "events") for verb in ("create", "patch") for group in ("", "events.k8s.io")},
        *{(verb, "", "namespaces") for verb in ("get", "list", "watch")},
        ("get", "batch", "jobs"),
    }
    assert ("create", "", "pods") not in granted, "the daemon binds pods; it never makes them there"
    binding = find(objects, "ClusterRoleBinding", NAME)
    account = {"kind": "ServiceAccount", "name": RELEASE, "namespace": RELEASE_NAMESPACE}
    assert binding["subjects"] == [account]
