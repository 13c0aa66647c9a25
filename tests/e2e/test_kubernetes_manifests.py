"""deploy/kubernetes: the API server accepts every object, and the RBAC it grants is exactly
enough for the daemon (checked by `doctor` with the ServiceAccount's own token)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.sandbox import REPO, Sandbox

BASE = REPO / "deploy" / "kubernetes" / "base"
STATE = Path("/var/lib/slurm-k8s-sandbox")


@pytest.fixture(scope="module")
def bridge_namespace(sandbox: Sandbox) -> Iterator[None]:
    """The namespaces exist for real (a dry run cannot create the objects inside them otherwise)."""
    sandbox.kubectl("apply", "-f", str(BASE / "namespace.yaml"))
    yield
    sandbox.kubectl("delete", "namespace", "slurm-k8s-bridge", "--timeout=120s", check=False)


def test_the_api_server_accepts_every_object(sandbox: Sandbox, bridge_namespace: None) -> None:
    result = sandbox.kubectl("apply", "--dry-run=server", "-k", str(BASE), check=False)

    assert result.returncode == 0, result.stderr
    for kind in ("namespace/slurm-k8s-bridge", "serviceaccount/slurm-k8s-bridge", "role.rbac",
                 "clusterrole.rbac", "service/slurm-k8s-bridge", "deployment.apps/slurm-k8s-bridge"):
        assert kind in result.stdout, kind


@pytest.fixture
def applied_rbac(sandbox: Sandbox, bridge_namespace: None) -> Iterator[None]:
    manifests = sandbox.kubectl("kustomize", str(BASE)).stdout
    docs = [d for d in manifests.split("\n---\n")
            if any(f"kind: {k}\n" in d for k in ("ServiceAccount", "Role", "RoleBinding",
                                                  "ClusterRole", "ClusterRoleBinding"))]
    subprocess.run(["kubectl", "apply", "-f", "-"], input="\n---\n".join(docs), text=True,
                   check=True, capture_output=True, env=sandbox.environ())
    yield
    sandbox.kubectl("delete", "clusterrolebinding,clusterrole", "slurm-k8s-bridge-nodes", check=False)
    sandbox.kubectl("delete", "rolebinding,role", "slurm-k8s-bridge-jobs", "-n", "slurm-jobs", check=False)


def test_the_service_account_has_exactly_what_the_daemon_needs(
    bridge: Sandbox, applied_rbac: None, tmp_path: Path
) -> None:
    kubeconfig = bridge.service_account_kubeconfig(
        "slurm-k8s-bridge", "slurm-k8s-bridge", tmp_path / "kubeconfig"
    )
    config = tmp_path / "config.toml"
    config.write_text((STATE / "bridge" / "config.toml").read_text().replace(
        f'kubeconfig = "{bridge.kubeconfig}"', f'kubeconfig = "{kubeconfig}"'))

    result = subprocess.run(
        [str(REPO / ".venv" / "bin" / "slurm-k8s-bridge"), "doctor", "-c", str(config),
         "--slurm-conf", str(STATE / "slurm" / "etc" / "slurm.conf")],
        capture_output=True, text=True, timeout=60, env=bridge.environ(),
    )

    assert result.returncode == 0, result.stdout
    assert "RBAC sufficient" in result.stdout
    denied = bridge.kubectl("auth", "can-i", "create", "pods", "-n", "default",
                            "--as=system:serviceaccount:slurm-k8s-bridge:slurm-k8s-bridge", check=False)
    assert denied.stdout.strip() == "no", "no rights outside the job namespace"
