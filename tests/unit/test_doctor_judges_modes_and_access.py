"""A secret file may be read by the daemon's own groups, never by anyone else."""

from __future__ import annotations

import pytest

from bridge.manager.doctor import needed_access, secret_file_exposure

OWN = {65532, 27}


@pytest.mark.parametrize(
    ("mode", "gid", "expected"),
    [
        (0o600, 0, None),
        (0o400, 0, None),
        (0o440, 65532, None),  # Secret volume with fsGroup: the pod's own group
        (0o440, 27, None),
        (0o640, 0, "group 0"),  # root's group is not the daemon's
        (0o644, 65532, "every user"),
        (0o604, 65532, "every user"),
    ],
)
def test_exposure(mode: int, gid: int, expected: str | None) -> None:
    assert secret_file_exposure(mode, gid, OWN) == expected


def test_in_a_pod_the_daemon_also_needs_to_label_pods_in_its_own_namespace() -> None:
    on_host = needed_access("slurm-jobs", None)
    in_pod = needed_access("slurm-jobs", "slurm-k8s-bridge")

    assert ("create", "", "pods", "slurm-jobs") in on_host
    assert ("list", "", "nodes", None) in on_host
    assert not [a for a in on_host if a[3] == "slurm-k8s-bridge"]
    assert set(in_pod) - set(on_host) == {
        ("get", "", "pods", "slurm-k8s-bridge"),
        ("list", "", "pods", "slurm-k8s-bridge"),
        ("patch", "", "pods", "slurm-k8s-bridge"),
    }
