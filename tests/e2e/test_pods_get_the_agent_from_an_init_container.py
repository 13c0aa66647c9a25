"""The agent's other way into a pod, which stays supported: without `[pods] agent_host_dir` an init
container copies it from its image. The bridge restarted so (SBX_AGENT_FROM=init) runs jobs at once
as natively, and its pods have the init container and no mount of the node's agent."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from tests.e2e.sandbox import BRIDGE_UP, Sandbox
from tests.e2e.test_pods_get_the_agent_from_their_node import a_pods_spec, run_four_as_natively

pytestmark = pytest.mark.e2e


def _restart_bridge(**env: str) -> None:
    subprocess.run([str(BRIDGE_UP.with_name("down.sh"))], check=True, capture_output=True)
    subprocess.run([str(BRIDGE_UP)], check=True, capture_output=True, env={**os.environ, **env})


@pytest.fixture(scope="module")
def init_bridge(bridge: Sandbox) -> Iterator[Sandbox]:
    _restart_bridge(SBX_AGENT_FROM="init")
    try:
        yield bridge
    finally:
        _restart_bridge()


def test_jobs_at_once_run_as_natively_with_the_init_container(init_bridge: Sandbox) -> None:
    run_four_as_natively(init_bridge)


def test_the_pod_has_the_init_container_and_no_mount_of_the_nodes_agent(init_bridge: Sandbox) -> None:
    spec = a_pods_spec(init_bridge)
    assert [container["name"] for container in spec["initContainers"]] == ["slurm-k8s-bridge-agent"]
    assert "slurm-k8s-bridge-agent-node" not in {volume["name"] for volume in spec["volumes"]}
