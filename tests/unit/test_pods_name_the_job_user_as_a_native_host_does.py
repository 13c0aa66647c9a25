"""The job's /etc/passwd and /etc/group in its pods (bridge/core/pod_user.py): from the NSS answer
the daemon resolved for Slurm's user name and ids, in the payload Secret, mounted read-only over the
image's; never from what the waiter's payload (the user) says."""

from __future__ import annotations

import base64
from dataclasses import replace
from typing import Any

import pytest

from bridge.core.config import ConfigError, PartitionConfig, PodsConfig, parse_config
from bridge.core.directives import parse_directives
from bridge.core.payload_secret import SECRET_DATA_BYTES
from bridge.core.pod_user import UserAccount, group_text, passwd_text
from bridge.core.translate import desired_objects

from .builders import SCRIPT, allocation, config, payload

ALICE = UserAccount("alice", 1000, 100, home="/home/alice", shell="/bin/bash", gecos="Alice A.",
                    group_names={100: "users", 3000: "proj", 27: "sudo"})


def objects(account: UserAccount | None = ALICE, groups: tuple[int, ...] = (3000, 27, 4000),
            **pods: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    cfg = config(pods=PodsConfig(supplemental_groups_policy="", **pods))
    return desired_objects(allocation(), payload(), parse_directives(SCRIPT), PartitionConfig(), cfg,
                           supplemental_groups=groups, account=account)


def secret_text(secret: dict[str, Any], key: str) -> str:
    return base64.b64decode(secret["data"][key]).decode()


def test_passwd_names_the_user_as_nss_does_with_root_and_nobody() -> None:
    assert passwd_text(ALICE) == (
        "root:x:0:0:root:/root:/bin/sh\n"
        "alice:x:1000:100:Alice A.:/home/alice:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")


def test_group_names_the_primary_group_and_each_named_supplementary_one_with_the_user_in_it() -> None:
    assert group_text(ALICE, 100, (3000, 27, 4000)) == (
        "root:x:0:\nusers:x:100:\nsudo:x:27:alice\nproj:x:3000:alice\nnogroup:x:65534:\n")


def test_a_job_of_another_group_keeps_the_users_primary_gid_in_passwd_and_names_both_groups() -> None:
    """`sg proj -c sbatch ...`: the job's gid is proj's; getent passwd still says the user's own."""
    secret, _ = desired_objects(allocation(gid=3000), payload(gid=3000), parse_directives(SCRIPT),
                                PartitionConfig(), config(pods=PodsConfig(supplemental_groups_policy="")),
                                supplemental_groups=(100, 27), account=ALICE)

    assert "alice:x:1000:100:" in secret_text(secret, "SLURM_K8S_BRIDGE_PASSWD")
    assert secret_text(secret, "SLURM_K8S_BRIDGE_GROUP").splitlines()[1:4] == [
        "proj:x:3000:", "users:x:100:", "sudo:x:27:alice"]


def test_what_nss_hands_over_cannot_add_lines_or_fields() -> None:
    """A lookup source that returned a separator or a line break (an LDAP gecos, say) must not give
    the job a second account or a root group of its own."""
    hostile = replace(ALICE, gecos="x:0:0::/:/bin/sh\nroot2", shell="/bin/sh\nevil:x:0:0::/:/bin/sh",
                      group_names={100: "users\nwheel:x:0:alice", 3000: "proj:x:0"})

    passwd = passwd_text(hostile).splitlines()
    group = group_text(hostile, 100, (3000,)).splitlines()

    assert len(passwd) == 3 and all(line.count(":") == 6 for line in passwd)
    assert passwd[1].split(":")[:4] == ["alice", "x", "1000", "100"]
    assert len(group) == 4 and all(line.count(":") == 3 for line in group)
    assert [line.split(":")[2] for line in group] == ["0", "100", "3000", "65534"]


def test_the_secret_holds_the_files_and_each_pod_mounts_them_read_only_over_the_images() -> None:
    secret, pods = objects()

    assert secret_text(secret, "SLURM_K8S_BRIDGE_PASSWD") == passwd_text(ALICE)
    assert secret_text(secret, "SLURM_K8S_BRIDGE_GROUP") == group_text(ALICE, 100, (27, 3000, 4000))
    for pod in pods:
        container = pod["spec"]["containers"][0]
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts["/etc/passwd"] == {"name": "slurm-k8s-bridge-script", "mountPath": "/etc/passwd",
                                         "subPath": "etc-passwd", "readOnly": True}
        assert mounts["/etc/group"]["subPath"] == "etc-group" and mounts["/etc/group"]["readOnly"]
        items = pod["spec"]["volumes"][0]["secret"]["items"]
        assert {"key": "SLURM_K8S_BRIDGE_PASSWD", "path": "etc-passwd"} in items
        # The pod's own env (which wins over the Secret's envFrom) has each key as its path.
        env = {e["name"]: e["value"] for e in container["env"]}
        paths = (env["SLURM_K8S_BRIDGE_PASSWD"], env["SLURM_K8S_BRIDGE_GROUP"])
        assert paths == ("/etc/passwd", "/etc/group")


@pytest.mark.parametrize("account", [
    None,  # NSS does not know the user here
    replace(ALICE, uid=1001),  # a name NSS has as another uid: another person
    replace(ALICE, name="bob"),
])
def test_without_an_account_of_the_jobs_user_the_images_files_stay(account: UserAccount | None) -> None:
    secret, pods = objects(account)

    assert "SLURM_K8S_BRIDGE_PASSWD" not in secret["data"]
    mounts = [m["mountPath"] for m in pods[0]["spec"]["containers"][0]["volumeMounts"]]
    assert "/etc/passwd" not in mounts and "/etc/group" not in mounts


def test_a_site_may_keep_the_images_files() -> None:
    secret, pods = objects(user_files="image")

    assert "SLURM_K8S_BRIDGE_GROUP" not in secret["data"]
    assert all(m["mountPath"] != "/etc/group" for m in pods[0]["spec"]["containers"][0]["volumeMounts"])


def test_an_arrays_tasks_still_share_one_secret() -> None:
    first, _ = objects()
    other, _ = desired_objects(allocation(job_id=43, array_job_id=40, array_task_id=3), payload(),
                               parse_directives(SCRIPT), PartitionConfig(),
                               config(pods=PodsConfig(supplemental_groups_policy="")),
                               supplemental_groups=(3000, 27, 4000), account=ALICE)

    assert other["metadata"]["name"] == first["metadata"]["name"]


@pytest.mark.parametrize("path", ["/etc/passwd", "/etc/group"])
def test_a_site_volume_cannot_take_the_files_mount_point(path: str) -> None:
    with pytest.raises(ConfigError, match="used by the bridge itself"):
        parse_config('cluster = "c"\n[slurm]\nurl = "http://x"\n[partitions.k8s]\n'
                     f'[[partitions.k8s.volumes]]\nname = "v"\nhost_path = "/srv"\nmount_path = "{path}"\n')


def test_an_environment_that_leaves_no_room_for_the_files_keeps_the_images_and_the_job_runs() -> None:
    """The files count against the Secret's 1 MiB like the variables: a job whose environment
    alone fits is not refused for them (nor failed by the API server); its pods keep the image's."""
    group_names = {gid: f"group-with-a-long-name-{gid:05d}" for gid in range(10_000, 10_300)}
    many = replace(ALICE, group_names={**ALICE.group_names, **group_names})
    cfg = config(pods=PodsConfig(supplemental_groups_policy=""))
    filler = SECRET_DATA_BYTES - 4_000 - len(SCRIPT)
    big = payload(environment={"HOME": "/home/alice", "BIG": "x" * filler})

    secret, pods = desired_objects(allocation(), big, parse_directives(SCRIPT), PartitionConfig(), cfg,
                                   supplemental_groups=tuple(group_names), account=many)

    assert "SLURM_K8S_BRIDGE_PASSWD" not in secret["data"]
    assert sum(len(base64.b64decode(value)) for value in secret["data"].values()) <= SECRET_DATA_BYTES
    assert all(m["mountPath"] != "/etc/passwd" for m in pods[0]["spec"]["containers"][0]["volumeMounts"])
    small, _ = desired_objects(allocation(), payload(), parse_directives(SCRIPT), PartitionConfig(), cfg,
                               supplemental_groups=tuple(group_names), account=many)
    lines = secret_text(small, "SLURM_K8S_BRIDGE_GROUP").splitlines()
    assert len(lines) == 303, "root, users, the 300 and nogroup"


@pytest.mark.parametrize("agent_image", [None, "agent:1"])
def test_the_waiters_limits_and_umask_reach_the_pods_only_for_an_agent_to_set(
    agent_image: str | None,
) -> None:
    """The waiter appends its soft limits and umask to the job's environment; the agent sets and
    removes them. Without an agent nothing would, and the script would see them (natively never)."""
    env = {"HOME": "/home/alice", "SLURM_RLIMIT_NOFILE": "1024", "SLURM_UMASK": "0027", "KEPT": "1"}
    cfg = config(pods=PodsConfig(supplemental_groups_policy="", agent_image=agent_image))
    secret, pods = desired_objects(allocation(), payload(environment=env), parse_directives(SCRIPT),
                                   PartitionConfig(), cfg)

    names = set(secret["data"]) | {e["name"] for e in pods[0]["spec"]["containers"][0]["env"]}
    assert "KEPT" in names
    assert ({"SLURM_RLIMIT_NOFILE", "SLURM_UMASK"} <= names) == (agent_image is not None)
