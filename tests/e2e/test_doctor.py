"""`slurm-k8s-bridge doctor` passes on the sandbox and names each problem a site can have."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.sandbox import REPO, Sandbox

pytestmark = pytest.mark.shares_the_cluster

STATE = Path("/var/lib/slurm-k8s-sandbox")
SLURM_CONF = STATE / "slurm" / "etc" / "slurm.conf"


def _doctor(sandbox: Sandbox, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / ".venv" / "bin" / "slurm-k8s-bridge"), "doctor", "-c", str(config),
         "--slurm-conf", str(SLURM_CONF)],
        capture_output=True, text=True, timeout=60, env={**sandbox.environ()},
    )


def _config_with(tmp_path: Path, *replacements: tuple[str, str]) -> Path:
    text = (STATE / "bridge" / "config.toml").read_text()
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def _line(result: subprocess.CompletedProcess[str], check: str) -> str:
    return next(line for line in result.stdout.splitlines() if line.split()[1:2] == [check.split()[0]])


def test_doctor_passes_on_the_sandbox(bridge: Sandbox) -> None:
    result = _doctor(bridge, STATE / "bridge" / "config.toml")

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "all checks passed"
    assert "munge credentials round-trip" in result.stdout


def test_a_wrong_jwt_is_named(bridge: Sandbox, tmp_path: Path) -> None:
    token = tmp_path / "bad.jwt"
    token.write_text("SLURM_JWT=eyJhbGciOiJIUzI1NiJ9.e30.forged\n")
    token.chmod(0o600)
    config = _config_with(tmp_path, (f'token_file = "{STATE}/bridge/slurm.jwt"', f'token_file = "{token}"'))

    result = _doctor(bridge, config)

    assert result.returncode == 1
    assert "FAIL" in _line(result, "slurm")
    assert f"refused the token in {token}" in _line(result, "slurm")


def test_slurmrestd_down_is_named(bridge: Sandbox, tmp_path: Path) -> None:
    config = _config_with(tmp_path, ('url = "http://127.0.0.1:6820"', 'url = "http://127.0.0.1:6899"'))

    result = _doctor(bridge, config)

    assert result.returncode == 1
    assert "slurmrestd at http://127.0.0.1:6899 is unreachable" in _line(result, "slurm")


@pytest.fixture
def kubeconfig_without_pod_create(bridge: Sandbox, tmp_path: Path) -> Iterator[Path]:
    """A service account allowed everything the bridge needs except creating pods."""
    name = f"doctor-{uuid.uuid4().hex[:6]}"
    ns = "slurm-jobs"
    bridge.kubectl("create", "serviceaccount", name, "-n", ns)
    bridge.kubectl("create", "role", name, "-n", ns, "--verb=delete,list,watch,get",
                   "--resource=pods,pods/log")
    bridge.kubectl("create", "rolebinding", name, "-n", ns, f"--role={name}", f"--serviceaccount={ns}:{name}")
    path = bridge.service_account_kubeconfig(ns, name, tmp_path / "kubeconfig")
    yield path
    bridge.kubectl("delete", "rolebinding,role,serviceaccount", name, "-n", ns, check=False)


def test_missing_rbac_for_pod_create_is_named(
    bridge: Sandbox, tmp_path: Path, kubeconfig_without_pod_create: Path
) -> None:
    config = _config_with(
        tmp_path, (f'kubeconfig = "{bridge.kubeconfig}"', f'kubeconfig = "{kubeconfig_without_pod_create}"')
    )

    result = _doctor(bridge, config)

    assert result.returncode == 1
    line = _line(result, "kubernetes")
    assert "RBAC: the bridge may not create pods in namespace slurm-jobs" in line
    # Only what it lacks is named (the namespaced verbs; the sandbox's managed namespaces also
    # want cluster-wide ones this account has not either).
    assert "delete pods in namespace slurm-jobs" not in line


def test_a_bridged_node_without_a_kubernetes_twin_is_named(bridge: Sandbox, tmp_path: Path) -> None:
    config = _config_with(tmp_path, ("[partitions.sim]", "[partitions.native]\n\n[partitions.sim]"))

    result = _doctor(bridge, config)

    assert result.returncode == 1
    assert "Slurm node native1 (partition native) has no Kubernetes node" in _line(result, "node")
