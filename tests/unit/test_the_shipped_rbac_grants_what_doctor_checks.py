"""The chart's RBAC (deploy/helm/slurm-k8s-bridge/templates/rbac.yaml, as `helm template` renders
it) says it grants exactly what `doctor` checks (NEEDED_ACCESS): every verb the daemon needs must
be in a rule of the Role in the jobs namespace (namespaced) or of its ClusterRole (cluster-wide).
A verb added to the daemon (secrets, issue 11) and not to the chart would make the Deployment fail
at its first job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bridge.manager.doctor_access import NEEDED_ACCESS, NEEDED_FOR_DRA, NEEDED_FOR_WORKLOADS
from tests.unit.helm_chart import render


def _granted(objects: list[dict[str, Any]], kind: str) -> set[tuple[str, str, str]]:
    granted = set()
    for doc in objects:
        if doc.get("kind") != kind:
            continue
        if kind == "Role" and doc["metadata"].get("namespace") != "slurm-jobs":
            continue
        for rule in doc.get("rules") or []:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted |= {(verb, group, resource) for verb in rule["verbs"]}
    return granted


def test_every_needed_verb_is_granted_where_the_daemon_uses_it(tmp_path: Path) -> None:
    objects = render(tmp_path)
    namespaced, cluster = _granted(objects, "Role"), _granted(objects, "ClusterRole")
    missing = [(verb, group, resource) for verb, group, resource, in_namespace in NEEDED_ACCESS
               if (verb, group, resource) not in (namespaced if in_namespace else cluster)]
    assert missing == []
    assert ("create", "", "secrets") in namespaced


def test_the_dra_mode_verbs_are_granted_only_when_asked_for(tmp_path: Path) -> None:
    """gpu_mode = "dra" needs claims, bindings and the cluster's slices and claims (rbac.dra)."""
    on = render(tmp_path, {"rbac": {"dra": True}})
    namespaced, cluster = _granted(on, "Role"), _granted(on, "ClusterRole")
    missing = [(verb, group, resource) for verb, group, resource, in_namespace in NEEDED_FOR_DRA
               if (verb, group, resource) not in (namespaced if in_namespace else cluster)]
    assert missing == []
    off = render(tmp_path)
    granted = _granted(off, "Role") | _granted(off, "ClusterRole")
    assert not {(verb, group, resource) for verb, group, resource, _ in NEEDED_FOR_DRA} & granted


def test_the_workload_verbs_are_granted_only_when_asked_for(tmp_path: Path) -> None:
    """Managed namespaces need the cluster's pods: watched, marked, bound, told, deleted
    (workloads.enabled)."""
    on = render(tmp_path, {"workloads": {"enabled": True}})
    cluster = _granted(on, "ClusterRole")
    missing = [(verb, group, resource) for verb, group, resource, _ in NEEDED_FOR_WORKLOADS
               if (verb, group, resource) not in cluster]
    assert missing == []
    off = render(tmp_path)
    assert ("create", "", "pods/binding") not in _granted(off, "ClusterRole")
