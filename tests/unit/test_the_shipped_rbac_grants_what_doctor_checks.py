"""deploy/kubernetes/base/rbac.yaml says it grants exactly what `doctor` checks (NEEDED_ACCESS):
every verb the daemon needs must be in a rule of the Role in the jobs namespace (namespaced) or of
its ClusterRole (cluster-wide). A verb added to the daemon (secrets, issue 11) and not to the
manifests would make the Deployment fail at its first job."""

from __future__ import annotations

from pathlib import Path

import yaml

from bridge.manager.doctor import NEEDED_ACCESS

RBAC = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "base" / "rbac.yaml"


def _granted(kind: str) -> set[tuple[str, str, str]]:
    granted = set()
    for doc in yaml.safe_load_all(RBAC.read_text()):
        if not doc or doc.get("kind") != kind:
            continue
        if kind == "Role" and doc["metadata"].get("namespace") != "slurm-jobs":
            continue
        for rule in doc.get("rules") or []:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted |= {(verb, group, resource) for verb in rule["verbs"]}
    return granted


def test_every_needed_verb_is_granted_where_the_daemon_uses_it() -> None:
    namespaced, cluster = _granted("Role"), _granted("ClusterRole")
    missing = [(verb, group, resource) for verb, group, resource, in_namespace in NEEDED_ACCESS
               if (verb, group, resource) not in (namespaced if in_namespace else cluster)]
    assert missing == []
    assert ("create", "", "secrets") in namespaced
