"""deploy/helm/slurm-k8s-bridge: the API server accepts every object `helm template` renders, and
the RBAC it grants is exactly enough for the daemon (checked by `doctor` with the ServiceAccount's
own token)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.sandbox import JOB_NAMESPACE, REPO, Sandbox
from tests.unit.helm_chart import CHART, RELEASE, RELEASE_NAMESPACE, helm

STATE = Path("/var/lib/slurm-k8s-sandbox")
RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")


def _template(tmp_path: Path) -> list[dict]:
    # rbac.dra: the sandbox's config has partitions in gpu_mode "dra" (dra, simdra); workloads: its
    # managed namespaces (their cluster-wide RBAC, and the admission policies).
    values = {"secrets": {"jwt": {"value": "SLURM_JWT=x"}, "munge": {"keyBase64": "a2V5"}},
              "rbac": {"dra": True}, "workloads": {"enabled": True}}
    result = helm("template", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, values=values,
                  tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _apply(sandbox: Sandbox, objects: list[dict], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", "apply", *args, "-f", "-"], input=yaml.safe_dump_all(objects),
                          text=True, capture_output=True, env=sandbox.environ())


@pytest.fixture(scope="module")
def bridge_namespace(sandbox: Sandbox) -> Iterator[None]:
    """The namespaces exist for real (a dry run cannot create the objects inside them otherwise)."""
    for namespace in (RELEASE_NAMESPACE, JOB_NAMESPACE):
        if sandbox.kubectl("get", "namespace", namespace, check=False).returncode != 0:
            sandbox.kubectl("create", "namespace", namespace)
    yield
    sandbox.kubectl("delete", "namespace", RELEASE_NAMESPACE, "--timeout=120s", check=False)


def test_the_api_server_accepts_every_object(
    sandbox: Sandbox, bridge_namespace: None, tmp_path: Path
) -> None:
    result = _apply(sandbox, _template(tmp_path), "--dry-run=server")

    assert result.returncode == 0, result.stderr
    for kind in (f"namespace/{JOB_NAMESPACE}", "serviceaccount/slurm-k8s-bridge", "role.rbac",
                 "clusterrole.rbac", "service/slurm-k8s-bridge", "deployment.apps/slurm-k8s-bridge",
                 "configmap/slurm-k8s-bridge", "secret/slurm-k8s-bridge-jwt",
                 "secret/slurm-k8s-bridge-munge"):
        assert kind in result.stdout, kind


@pytest.fixture
def applied_rbac(sandbox: Sandbox, bridge_namespace: None, tmp_path: Path) -> Iterator[None]:
    rbac = [o for o in _template(tmp_path) if o["kind"] in RBAC_KINDS]
    applied = _apply(sandbox, rbac)
    assert applied.returncode == 0, applied.stderr
    yield
    for kind, name in ((o["kind"], o["metadata"]["name"]) for o in rbac):
        if kind in ("ClusterRole", "ClusterRoleBinding"):
            sandbox.kubectl("delete", kind.lower(), name, check=False)
    sandbox.kubectl("delete", "rolebinding,role", "slurm-k8s-bridge-jobs", "-n", JOB_NAMESPACE, check=False)


def test_the_service_account_has_exactly_what_the_daemon_needs(
    bridge: Sandbox, applied_rbac: None, tmp_path: Path
) -> None:
    kubeconfig = bridge.service_account_kubeconfig(
        RELEASE_NAMESPACE, "slurm-k8s-bridge", tmp_path / "kubeconfig"
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
