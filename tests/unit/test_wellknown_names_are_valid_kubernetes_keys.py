"""Label, annotation and taint keys are valid Kubernetes qualified names; node keys match the sandbox."""

from __future__ import annotations

import re

import pytest

from bridge.core import wellknown

_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

KEYS = [
    value
    for name, value in vars(wellknown).items()
    if name.startswith(("LABEL_", "ANNOTATION_", "TAINT_BRIDGED", "NODE_LABEL_BRIDGED"))
    and not name.endswith(("_VALUE", "_EFFECT"))
]


def test_keys_were_found() -> None:
    assert len(KEYS) >= 10


@pytest.mark.parametrize("key", KEYS)
def test_key_is_a_qualified_name(key: str) -> None:
    prefix, _, name = key.rpartition("/")
    assert _PREFIX.match(prefix) and len(prefix) <= 253
    assert _NAME.match(name)


def test_bridged_node_keys_are_the_sandbox_ones() -> None:
    # containers/kube labels and taints nodes with exactly these; changing them breaks placement.
    assert (wellknown.NODE_LABEL_BRIDGED, wellknown.NODE_LABEL_BRIDGED_VALUE) == (
        "slurm-k8s-bridge/bridged",
        "true",
    )
    assert (wellknown.TAINT_BRIDGED, wellknown.TAINT_BRIDGED_EFFECT) == (
        "slurm-k8s-bridge/bridged",
        "NoSchedule",
    )


@pytest.mark.parametrize("name", [wellknown.SCRIPT_VOLUME, wellknown.SHM_VOLUME, wellknown.CONTAINER_NAME])
def test_object_names_are_dns_labels(name: str) -> None:
    assert _DNS_LABEL.match(name)
