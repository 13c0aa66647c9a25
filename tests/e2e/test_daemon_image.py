"""The daemon's image, built without Docker, runs on a real node as an unprivileged user with a
read-only root filesystem, and `doctor` passes inside it against the sandbox."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.sandbox import REPO, Sandbox, wait_until

pytestmark = pytest.mark.shares_the_cluster

STATE = Path("/var/lib/slurm-k8s-sandbox")


@pytest.fixture(scope="module")
def image(sandbox: Sandbox) -> str:
    out = subprocess.run([str(REPO / "containers" / "images" / "bridge-image.sh")],
                         check=True, capture_output=True, text=True, timeout=900)
    return out.stdout.strip().splitlines()[-1]


def _run(sandbox: Sandbox, image: str, args: list[str], **spec: Any) -> tuple[str, str]:
    name = f"img-{uuid.uuid4().hex[:8]}"
    container = {
        "name": "bridge", "image": image, "imagePullPolicy": "IfNotPresent", "args": args,
        "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
        # kubernetes_asyncio writes the kubeconfig's certificates to temporary files.
        "volumeMounts": [*spec.pop("mounts", []), {"name": "tmp", "mountPath": "/tmp"}],
    }
    spec["volumes"] = [*spec.get("volumes", []), {"name": "tmp", "emptyDir": {"medium": "Memory"}}]
    sandbox.kubectl_create({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeSelector": {"type": "real"}, "restartPolicy": "Never",
            "tolerations": [{"key": "slurm-k8s-bridge/bridged", "operator": "Exists"}],
            "securityContext": {"runAsUser": 65532, "runAsGroup": 65532, "runAsNonRoot": True},
            "containers": [container], **spec,
        },
    })
    pod = wait_until(f"pod {name} to end", lambda: (
        p if (p := sandbox.kubectl_json("get", "pod", name))["status"].get("phase") in ("Succeeded", "Failed")
        else None), timeout=90)
    logs = sandbox.kubectl("logs", name).stdout
    sandbox.kubectl("delete", "pod", name, "--wait=false")
    return pod["status"]["phase"], logs


def test_the_image_runs_unprivileged_with_a_read_only_root(sandbox: Sandbox, image: str) -> None:
    phase, logs = _run(sandbox, image, ["version"])

    assert (phase, logs.strip()) == ("Succeeded", (REPO / "bridge" / "__init__.py").read_text()
                                     .split("__version__ = ")[1].strip().strip('"'))


def test_doctor_passes_inside_the_image(bridge: Sandbox, image: str) -> None:
    # Secrets as a Secret volume would hold them: copies readable by the daemon's user only.
    secrets = STATE / "bridge" / "image-test"
    subprocess.run(["rm", "-rf", str(secrets)], check=True)
    secrets.mkdir(mode=0o700)
    for source, name in ((STATE / "bridge" / "slurm.jwt", "slurm.jwt"),
                         (STATE / "kube" / "admin.kubeconfig", "kubeconfig")):
        target = secrets / name
        target.write_bytes(source.read_bytes())
        target.chmod(0o400)
        os.chown(target, 65532, 65532)
    os.chown(secrets, 65532, 65532)
    config = secrets / "config.toml"
    config.write_text((STATE / "bridge" / "config.toml").read_text()
                      .replace(f'unmunge_command = "{REPO}/containers/slurm/cli.sh unmunge"',
                               'unmunge_command = "unmunge"')
                      .replace(f'token_file = "{STATE}/bridge/slurm.jwt"',
                               f'token_file = "{secrets}/slurm.jwt"')
                      .replace(f'kubeconfig = "{bridge.kubeconfig}"', f'kubeconfig = "{secrets}/kubeconfig"'))
    os.chown(config, 65532, 65532)
    directory = {"type": "Directory"}
    volumes = [
        {"name": "secrets", "hostPath": {"path": str(secrets), **directory}},
        {"name": "slurm-etc", "hostPath": {"path": str(STATE / "slurm" / "etc"), **directory}},
        {"name": "munge", "hostPath": {"path": str(STATE / "munge"), **directory}},
    ]
    mounts = [
        {"name": "secrets", "mountPath": str(secrets), "readOnly": True},
        {"name": "slurm-etc", "mountPath": str(STATE / "slurm" / "etc"), "readOnly": True},
        {"name": "munge", "mountPath": "/run/munge", "readOnly": True},
    ]

    # hostNetwork: slurmrestd and the API server listen on the host's loopback in the sandbox.
    phase, logs = _run(bridge, image, ["doctor", "-c", str(config), "--slurm-conf",
                                       str(STATE / "slurm" / "etc" / "slurm.conf")],
                       hostNetwork=True, volumes=volumes, mounts=mounts)

    assert phase == "Succeeded", logs
    assert logs.splitlines()[-1] == "all checks passed"
    assert "munge credentials round-trip" in logs
