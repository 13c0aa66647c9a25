"""Issue 22, a pod that starts once: with `[pods] agent_host_dir` a job pod has no init container.
It mounts the node's agent read-only, and its command copies the agent into the pod's own volume and
goes on from the copy, whose directory stays the agent's state (pid files, step sockets, the
script), as with the init container. `agent install-on-node` puts a version on the node and points
`current` at it in one rename, and never touches a version a running pod may have mounted."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from bridge.core import wellknown
from bridge.core.config import PodsConfig, VolumeConfig
from bridge.core.directives import Directives
from bridge.core.translate import desired_pods

from .builders import allocation, config, payload
from .test_agent_keeps_output_byte_exact_and_passes_signals_on import agent  # noqa: F401 (fixture)
from .test_agent_pods_and_frames_reach_the_waiter import AGENT, AGENT_IMAGE, PIDFILE, SCRIPT_PATH, THREE_NODES

NODE_DIR = "/var/lib/slurm-k8s-bridge/agent/current"
NODE_AGENT = "/slurm-k8s-bridge-node/slurm-k8s-bridge-agent"


def node_agent_pods(**payload_changes: Any) -> list[dict[str, Any]]:
    pods_config = PodsConfig(supplemental_groups_policy="", agent_image=AGENT_IMAGE, agent_host_dir=NODE_DIR)
    cfg = config(pods=pods_config)
    return desired_pods(allocation(nodes=THREE_NODES), payload(**payload_changes),
                        Directives(image="debian:12"), cfg.partitions["k8s"], cfg)


def test_no_pod_has_an_init_container() -> None:
    for pod in node_agent_pods():
        assert "initContainers" not in pod["spec"]


@pytest.mark.parametrize(("merged", "mode"), [(True, "merged"), (False, "split")])
def test_the_nodes_agent_installs_itself_in_the_pod_then_runs_the_script_or_waits(
    merged: bool, mode: str
) -> None:
    first, *others = node_agent_pods(output_merged=merged)
    (container,) = first["spec"]["containers"]
    assert container["command"] == [NODE_AGENT, "install", AGENT, "--", "run", PIDFILE, mode, "--",
                                    "/bin/bash", SCRIPT_PATH]
    for pod in others:
        assert pod["spec"]["containers"][0]["command"] == [NODE_AGENT, "install", AGENT, "--", "wait"]


def test_the_node_directory_is_mounted_read_only_and_must_exist_and_the_pods_volume_stays_writable() -> None:
    for pod in node_agent_pods():
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes[wellknown.AGENT_NODE_VOLUME] == {
            "name": wellknown.AGENT_NODE_VOLUME, "hostPath": {"path": NODE_DIR, "type": "Directory"}}
        assert "emptyDir" in volumes[wellknown.AGENT_VOLUME]
        mounts = pod["spec"]["containers"][0]["volumeMounts"]
        assert {"name": wellknown.AGENT_NODE_VOLUME, "mountPath": "/slurm-k8s-bridge-node",
                "readOnly": True} in mounts
        assert {"name": wellknown.AGENT_VOLUME, "mountPath": wellknown.AGENT_DIR} in mounts


@pytest.mark.parametrize(
    ("pods", "problem"),
    [
        ({"agent_image": AGENT_IMAGE, "agent_host_dir": "agent/current"}, "not an absolute path"),
        ({"agent_host_dir": NODE_DIR}, "needs agent_image"),
    ],
)
def test_agent_host_dir_must_be_absolute_and_come_with_its_image(pods: dict[str, str], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        PodsConfig(**pods)  # type: ignore[arg-type]


@pytest.mark.parametrize("mount_path",
                         ["/slurm-k8s-bridge-node", "/slurm-k8s-bridge-bin/", "/slurm-k8s-bridge",
                          "/slurm-k8s-bridge-node/data", "/dev/shm/x"])
def test_a_partitions_volume_cannot_cover_the_bridges_mounts(mount_path: str) -> None:
    with pytest.raises(ValidationError, match="used by the bridge itself"):
        VolumeConfig(name="data", host_path="/data", mount_path=mount_path)


def test_a_partitions_volume_cannot_take_the_node_agents_name() -> None:
    with pytest.raises(ValidationError, match="reserved"):
        VolumeConfig(name=wellknown.AGENT_NODE_VOLUME, host_path="/data")


# -- the agent binary --------------------------------------------------------------------------


def _read_only_copy(binary: Path, tmp_path: Path) -> Path:
    """The agent in a directory nobody may write to, as the node's mount is."""
    node = tmp_path / "node"
    node.mkdir()
    (node / binary.name).write_bytes(binary.read_bytes())
    (node / binary.name).chmod(0o555)
    node.chmod(0o555)
    return node / binary.name


def test_the_installed_copy_runs_the_script_and_keeps_its_state_beside_it(
    agent: Path, tmp_path: Path  # noqa: F811 (the fixture)
) -> None:
    node_agent = _read_only_copy(agent, tmp_path)
    pod_dir = tmp_path / "pod"
    pod_dir.mkdir()
    dest = pod_dir / "slurm-k8s-bridge-agent"
    # The script's parent is the running agent: it must be the copy, not the node's file.
    result = subprocess.run(
        [str(node_agent), "install", str(dest), "--", "run", str(pod_dir / "script.pid"), "merged", "--",
         "sh", "-c", 'readlink /proc/$PPID/exe; ls "$(dirname "$(readlink /proc/$PPID/exe)")"'],
        capture_output=True, timeout=60, check=False)
    assert result.returncode == 0, result
    lines = result.stdout.decode().splitlines()
    output = b"".join(base64.b64decode(line[2:]) for line in lines if line.startswith("o "))
    assert output.decode().splitlines()[0] == str(dest)
    assert "agent.sock" in output.decode().split()  # the run's state, in the pod's own volume
    assert lines[-1].startswith("x ")
    for command in ("srun", "scontrol", "sbatch"):
        assert os.readlink(pod_dir / "bin" / command) == str(dest)
    assert dest.read_bytes() == agent.read_bytes()


def test_install_with_a_verb_needs_the_separator(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    result = subprocess.run([str(agent), "install", str(tmp_path / "a"), "wait"], capture_output=True,
                            timeout=30, check=False)
    assert result.returncode != 0
    assert b"usage: slurm-k8s-bridge-agent install DEST [-- VERB ARGS...]" in result.stderr
    assert not (tmp_path / "a").exists()


def _install_on_node(binary: Path, root: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["sh", "-c", 'umask 077; exec "$0" install-on-node "$1"', str(binary), str(root)],
                          capture_output=True, timeout=30, check=False)


def test_install_on_node_puts_a_version_behind_current_readable_by_every_user(
    agent: Path, tmp_path: Path  # noqa: F811
) -> None:
    root = tmp_path / "agent-node"
    assert _install_on_node(agent, root).returncode == 0
    version = os.readlink(root / "current")
    installed = root / version / "slurm-k8s-bridge-agent"
    assert installed.read_bytes() == agent.read_bytes()
    for path in (root, root / version, installed):
        assert stat.S_IMODE(path.stat().st_mode) == 0o755, path  # despite umask 077
    again = _install_on_node(agent, root)
    assert again.returncode == 0 and os.readlink(root / "current") == version
    assert f"is version {version}".encode() in again.stderr


def test_a_new_agent_moves_current_and_keeps_the_version_pods_may_still_use(
    agent: Path, tmp_path: Path  # noqa: F811
) -> None:
    root = tmp_path / "agent-node"
    assert _install_on_node(agent, root).returncode == 0
    old = os.readlink(root / "current")
    newer = tmp_path / "newer" / "slurm-k8s-bridge-agent"
    newer.parent.mkdir()
    newer.write_bytes(agent.read_bytes() + b"\0another build")
    newer.chmod(0o755)
    assert _install_on_node(newer, root).returncode == 0
    new = os.readlink(root / "current")
    assert new != old
    assert (root / old / "slurm-k8s-bridge-agent").read_bytes() == agent.read_bytes()
    assert (root / new / "slurm-k8s-bridge-agent").read_bytes() == newer.read_bytes()
    assert sorted(p.name for p in root.iterdir()) == sorted([old, new, "current"])  # no temporary left


def test_install_on_node_refuses_a_relative_root(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    result = subprocess.run([str(agent), "install-on-node", "agent-node"], cwd=tmp_path, capture_output=True,
                            timeout=30, check=False)
    assert result.returncode != 0 and b"not an absolute path" in result.stderr
    assert not (tmp_path / "agent-node").exists()


def test_a_root_others_may_write_is_refused(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    root = tmp_path / "agent-node"
    root.mkdir()
    root.chmod(0o777)
    result = _install_on_node(agent, root)
    assert result.returncode != 0 and b"that only it may write" in result.stderr
    assert list(root.iterdir()) == []


def test_a_planted_or_cut_file_under_a_versions_name_is_replaced(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    root = tmp_path / "agent-node"
    assert _install_on_node(agent, root).returncode == 0
    installed = root / os.readlink(root / "current") / "slurm-k8s-bridge-agent"
    installed.write_bytes(b"#!/bin/sh\necho planted\n")
    assert _install_on_node(agent, root).returncode == 0
    assert installed.read_bytes() == agent.read_bytes()
    assert sorted(p.name for p in installed.parent.iterdir()) == ["slurm-k8s-bridge-agent"]


def test_the_links_are_made_before_the_pods_copy_appears(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    """The daemon's execs and a step's tasks may come as soon as the container runs: the copy's
    name appears last, after the srun and Slurm command links that point at it. A copy that cannot
    take its name (a directory is in the way) shows what was done before that step."""
    pod_dir = tmp_path / "pod"
    (pod_dir / "slurm-k8s-bridge-agent" / "in-the-way").mkdir(parents=True)
    result = subprocess.run([str(agent), "install", str(pod_dir / "slurm-k8s-bridge-agent")],
                            capture_output=True, timeout=60, check=False)
    assert result.returncode != 0
    assert sorted(p.name for p in (pod_dir / "bin").iterdir()) == sorted(
        ["srun", "scontrol", "squeue", "sbatch", "scancel", "sacct", "sinfo", "sstat"])
