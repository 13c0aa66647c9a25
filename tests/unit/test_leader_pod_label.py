"""The leader's pod label: which pod, and the merge patch that sets or removes it."""

from __future__ import annotations

from pathlib import Path

from bridge.clients.kube.leader_pod import OwnPod, role_patch
from bridge.core import wellknown


def test_own_pod_comes_from_the_downward_api_environment() -> None:
    assert OwnPod.from_environment({"POD_NAME": "b-1", "POD_NAMESPACE": "ns"}) == OwnPod("ns", "b-1")
    assert OwnPod.from_environment({"POD_NAME": "b-1"}) is None
    assert OwnPod.from_environment({}) is None


def test_patch_sets_the_label_and_null_removes_it() -> None:
    assert role_patch(True) == {"metadata": {"labels": {wellknown.LABEL_ROLE: "leader"}}}
    assert role_patch(False) == {"metadata": {"labels": {wellknown.LABEL_ROLE: None}}}


def test_the_service_selects_the_label_the_leader_sets() -> None:
    chart = Path(__file__).resolve().parents[2] / "deploy/helm/slurm-k8s-bridge"
    service = (chart / "templates" / "service.yaml").read_text()
    assert f"{wellknown.LABEL_ROLE}: {wellknown.ROLE_LEADER}" in service
