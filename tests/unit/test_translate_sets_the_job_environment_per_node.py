"""Pods get the job's environment minus the slurmd host's, plus per-node Slurm and GPU variables.
What all nodes share is in the run's payload Secret (the pods' envFrom, never expanded by the
kubelet); each pod's own env has only its per-node values (escaped: the kubelet expands them)."""

from __future__ import annotations

import base64
import json
import posixpath
from typing import Any

import pytest

from bridge.core import wellknown
from bridge.core.config import PartitionConfig, PodsConfig
from bridge.core.config_sections import VolumeConfig
from bridge.core.directives import Directives
from bridge.core.job_environment import (
    MAX_JOB_PATH_BYTES,
    gpu_environment,
    job_environment,
    node_environment,
    shared_path_entries,
)
from bridge.core.model import NodeAllocation
from bridge.core.payload_secret import SECRET_DATA_BYTES
from bridge.core.pod_identity import payload_secret_name
from bridge.core.translate import TranslateError, desired_objects, escape_for_kubelet

from .builders import allocation, config, payload

SCRIPT_PATH = f"{wellknown.SCRIPT_DIR}/{wellknown.SCRIPT_FILE}"


def objects(
    part: PartitionConfig | None = None, **kwargs: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return desired_objects(
        kwargs.get("alloc", allocation()),
        kwargs.get("payload", payload()),
        Directives(image="x"),
        part or PartitionConfig(),
        kwargs.get("cfg") or config(),
    )


def seen(secret: dict[str, Any], pod: dict[str, Any]) -> dict[str, str]:
    """The environment the kubelet gives the pod's container: envFrom's Secret as it is, then the
    container's env, each value expanded, winning over the Secret's."""
    (container,) = pod["spec"]["containers"]
    assert container["envFrom"] == [{"secretRef": {"name": secret["metadata"]["name"]}}]
    env = {name: base64.b64decode(value).decode() for name, value in secret["data"].items()}
    names = [e["name"] for e in container["env"]]
    assert names == sorted(names)  # deterministic order
    for entry in container["env"]:
        env[entry["name"]] = kubelet_expand(entry["value"], env)
    return env


def envs(part: PartitionConfig | None = None, **kwargs: Any) -> list[dict[str, str]]:
    secret, pods = objects(part, **kwargs)
    return [seen(secret, pod) for pod in pods]


def test_per_node_slurm_variables() -> None:
    first, second = envs()
    common = {
        "SLURM_JOB_ID": "42",
        "SLURM_JOBID": "42",
        "SLURM_JOB_NAME": "train",
        "SLURM_JOB_PARTITION": "k8s",
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_UID": "1000",
        "SLURM_JOB_GID": "100",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "kube[1-2]",
        "SLURM_NODELIST": "kube[1-2]",
        "SLURM_SUBMIT_DIR": "/home/alice/run",
        "SLURM_LOCALID": "0",
        "TMPDIR": "/tmp",  # no agent in this config to check the job's own
        "HOME": "/home/alice",
        # Not exported by this job: filled in from Slurm's user name, as a login environment would.
        "USER": "alice",
        "LOGNAME": "alice",
        # The script's key in the Secret; the container's own env says where the file is.
        wellknown.SECRET_SCRIPT_KEY: SCRIPT_PATH,
    }
    assert first == {
        **common,
        "SLURMD_NODENAME": "kube1",
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "SLURM_CPUS_ON_NODE": "2",
        "SLURM_JOB_GPUS": "1,3",
        "SLURM_GPUS_ON_NODE": "2",
        "NVIDIA_VISIBLE_DEVICES": "1,3",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "GPU_DEVICE_ORDINAL": "0,1",
        "ROCR_VISIBLE_DEVICES": "0,1",
        "ZE_AFFINITY_MASK": "0,1",
    }
    assert second == {
        **common,
        "SLURMD_NODENAME": "kube2",
        "SLURM_NODEID": "1",
        "SLURM_PROCID": "1",
        "SLURM_CPUS_ON_NODE": "1",
        "NVIDIA_VISIBLE_DEVICES": "void",
    }


def test_array_variables_only_for_array_tasks() -> None:
    (env,) = envs(alloc=allocation(nodes=(NodeAllocation("kube1", 1, 1),), array_job_id=40, array_task_id=2))
    assert (env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"]) == ("40", "2")
    assert "SLURM_ARRAY_JOB_ID" not in envs()[0]


def test_payload_submit_dir_wins_over_work_dir() -> None:
    env = envs(payload=payload(environment={"SLURM_SUBMIT_DIR": "/home/alice"}))[0]
    assert env["SLURM_SUBMIT_DIR"] == "/home/alice"


@pytest.mark.parametrize(
    ("name", "kept"),
    [
        ("HOME", True),
        ("USER", True),
        ("LANG", True),
        ("SLURM_NTASKS", True),
        ("SLURM_JOB_CPUS_PER_NODE", True),
        ("SLURM_ARRAY_TASK_COUNT", True),
        ("OMP_NUM_THREADS", True),
        ("my.var-1", True),
        ("PATH", False),
        ("HOSTNAME", False),
        ("TMPDIR", True),
        ("PWD", False),
        ("LD_LIBRARY_PATH", False),
        ("LD_PRELOAD", False),
        ("SSH_AUTH_SOCK", False),
        ("KUBERNETES_SERVICE_HOST", False),
        ("SLURM_K8S_API", False),
        ("SLURM_STEP_ID", False),
        ("SLURM_TASK_PID", False),
        ("SLURM_CONF", False),
        ("SLURMD_NODENAME", False),
        ("CUDA_VISIBLE_DEVICES", False),
        ("BASH_FUNC_module%%", False),
        ("1ABC", False),
        ("A=B", False),
    ],
)
def test_job_environment_filter(name: str, kept: bool) -> None:
    assert (name in job_environment({name: "v"})) is kept


def test_the_script_gets_the_batch_hosts_values_and_tmpdir_as_natively() -> None:
    """Natively the batch script has SLURM_GTIDS, SLURM_TOPOLOGY_ADDR(_PATTERN) of node 0, its
    step's id (the batch step's, -5) and the TMPDIR slurmstepd checked (the agent checks it again
    in the pod): the first node's pod, which runs the script, has them; another node's has none of
    node 0's. Each is in the pod's own env, not the Secret an array's tasks share (a site's prolog
    may give each job a TMPDIR of its own)."""
    host = {"SLURM_GTIDS": "0", "SLURM_TOPOLOGY_ADDR": "kube1", "SLURM_TOPOLOGY_ADDR_PATTERN": "node",
            "SLURM_STEP_ID": "-5", "SLURM_STEPID": "-5", "TMPDIR": "/tmp/job-42"}
    with_agent = config(pods=PodsConfig(supplemental_groups_policy="", agent_image="agent:1"))
    secret, pods = objects(payload=payload(environment=host), cfg=with_agent)
    first, second = (seen(secret, pod) for pod in pods)
    assert {name: first.get(name) for name in host} == host
    assert {name: second.get(name) for name in host} == {
        "SLURM_GTIDS": None, "SLURM_TOPOLOGY_ADDR": None, "SLURM_TOPOLOGY_ADDR_PATTERN": None,
        "SLURM_STEP_ID": None, "SLURM_STEPID": None, "TMPDIR": "/tmp/job-42"}
    assert not set(host) & set(secret["data"])


@pytest.mark.parametrize("agent_image", [None, "agent:1"])
def test_no_pod_sets_a_path_or_training_variables_slurm_does_not_set(agent_image: str | None) -> None:
    """The image's PATH stays (a conda or CUDA image finds its programs; the agent puts its own
    directory first in the pod), and no RANK, WORLD_SIZE or MASTER_ADDR: natively there are none,
    and a step's tasks would all inherit their pod's, each one taking itself for rank 0 where code
    prefers RANK to SLURM_PROCID. What the user exported goes through as natively."""
    cfg = config(pods=PodsConfig(supplemental_groups_policy="", agent_image=agent_image))
    exported = {"PATH": "/home/alice/bin:/usr/bin", "WORLD_SIZE": "8"}
    secret, pods = objects(payload=payload(environment=exported), cfg=cfg)
    for env in (seen(secret, pod) for pod in pods):
        assert "PATH" not in env
        assert not {"RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"} & set(env)
        assert env["WORLD_SIZE"] == "8"


def test_without_the_agent_to_check_it_tmpdir_is_tmp() -> None:
    """A TMPDIR of the slurmd host's may not exist in the pod, and only the agent checks it there."""
    secret, pods = objects(payload=payload(environment={"TMPDIR": "/scratch/alice"}))
    assert [seen(secret, pod)["TMPDIR"] for pod in pods] == ["/tmp", "/tmp"]


def test_host_gpu_variables_are_replaced_not_merged() -> None:
    host = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_JOB_GPUS": "0-3", "NVIDIA_VISIBLE_DEVICES": "all"}
    first, second = envs(payload=payload(environment=host))
    assert (first["CUDA_VISIBLE_DEVICES"], first["NVIDIA_VISIBLE_DEVICES"]) == ("0,1", "1,3")
    assert "CUDA_VISIBLE_DEVICES" not in second
    assert second["NVIDIA_VISIBLE_DEVICES"] == "void"


@pytest.mark.parametrize(
    ("indices", "mode", "expected"),
    [
        ((), "env", {"NVIDIA_VISIBLE_DEVICES": "void"}),
        ((), "device-plugin", {"NVIDIA_VISIBLE_DEVICES": "void"}),
        (
            (2,),
            "env",
            {
                "SLURM_JOB_GPUS": "2",
                "SLURM_GPUS_ON_NODE": "1",
                "NVIDIA_VISIBLE_DEVICES": "2",
                "CUDA_VISIBLE_DEVICES": "0",
                "GPU_DEVICE_ORDINAL": "0",
                "ROCR_VISIBLE_DEVICES": "0",
                "ZE_AFFINITY_MASK": "0",
            },
        ),
        (
            (0, 5, 7),
            "device-plugin",
            {
                "SLURM_JOB_GPUS": "0,5,7",
                "SLURM_GPUS_ON_NODE": "3",
                "CUDA_VISIBLE_DEVICES": "0,1,2",
                "GPU_DEVICE_ORDINAL": "0,1,2",
                "ROCR_VISIBLE_DEVICES": "0,1,2",
                "ZE_AFFINITY_MASK": "0,1,2",
            },
        ),
    ],
)
def test_gpu_environment(indices: tuple[int, ...], mode: str, expected: dict[str, str]) -> None:
    assert gpu_environment(indices, mode) == expected


def test_the_secret_holds_the_script_and_shared_values_and_the_pods_only_their_own() -> None:
    """Issue 11: the script (up to 240 KB) and the environment were in every pod object: in etcd,
    every watch event and relist. Now once per run, in a Secret the pods mount and import."""
    job = payload(environment={"TOKEN": "s3cret-value", "HOME": "/home/alice"})
    secret, pods = objects(payload=job)
    assert secret["kind"] == "Secret" and secret["immutable"] is True
    name = secret["metadata"]["name"]
    assert name == payload_secret_name(name.removeprefix("slurm-payload-"))
    assert all(pod["metadata"]["annotations"][wellknown.ANNOTATION_PAYLOAD_SECRET] == name for pod in pods)
    assert secret["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "slurm-k8s-bridge",
                                            "slurm-k8s-bridge/cluster": "sandbox"}
    data = {name: base64.b64decode(value).decode() for name, value in secret["data"].items()}
    assert data[wellknown.SECRET_SCRIPT_KEY] == job.script and data["TOKEN"] == "s3cret-value"
    for pod in pods:
        text = json.dumps(pod)
        assert "s3cret-value" not in text and job.script not in text
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == wellknown.SCRIPT_VOLUME]
        script_item = {"key": wellknown.SECRET_SCRIPT_KEY, "path": wellknown.SCRIPT_FILE}
        assert volume["secret"] == {"secretName": name, "defaultMode": 0o444, "items": [script_item]}
    own = [{e["name"] for e in pod["spec"]["containers"][0]["env"]} for pod in pods]
    assert "TOKEN" not in own[0] and "HOME" not in own[0], "the user's values are not repeated"
    # Slurm's and the bridge's per-job values are the pods' own: the Secret is the same for every
    # task of an array.
    assert {"SLURM_NODEID", "SLURM_JOB_ID", "SLURM_JOB_NODELIST"} <= own[0]
    assert not any(key.startswith("SLURM_") and key != wellknown.SECRET_SCRIPT_KEY for key in data)
    assert all(wellknown.SECRET_SCRIPT_KEY in names for names in own), "the script never becomes a variable"


def test_the_tasks_of_an_array_share_one_secret_and_other_content_or_users_get_their_own() -> None:
    """One write for a 10,000-task array, not 10,000; a restarted daemon finds the Secret it made.
    A job with another script, another environment or another user never gets it."""
    def task(index: int, uid: int = 1000) -> dict[str, Any]:
        alloc = allocation(job_id=100 + index, array_job_id=100, array_task_id=index, uid=uid)
        env = {"HOME": "/home/alice", "SLURM_JOB_ID": str(100 + index), "SLURM_ARRAY_TASK_ID": str(index)}
        secret, pods = objects(alloc=alloc, payload=payload(environment=env, uid=uid))
        secret_ref = {"secretRef": {"name": secret["metadata"]["name"]}}
        assert pods[0]["spec"]["containers"][0]["envFrom"] == [secret_ref]
        return secret

    first, second = task(0), task(1)
    assert first == second
    other_script, _ = objects(payload=payload(script="#!/bin/sh\n#K8S image=x\necho someone else\n"))
    other_env, _ = objects(payload=payload(environment={"HOME": "/home/alice", "X": "1"}))
    other_user = task(0, uid=1001)
    names = {s["metadata"]["name"] for s in (first, other_script, other_env, other_user)}
    assert len(names) == 4


def test_slurm_variables_the_user_exported_are_in_the_secret_not_in_the_pod() -> None:
    """A user's SLURM_JWT (a token) must not be readable by whoever may `get pods`."""
    secret, pods = objects(payload=payload(environment={"SLURM_JWT": "eyJ.token", "SLURM_JOB_ID": "42"}))
    assert base64.b64decode(secret["data"]["SLURM_JWT"]) == b"eyJ.token"
    assert all("eyJ.token" not in json.dumps(pod) for pod in pods)


def test_per_job_variables_too_big_for_a_pod_fail_the_job_naming_them() -> None:
    with pytest.raises(TranslateError, match=r"the largest: \.\.big"):
        objects(payload=payload(environment={"..big": "x" * (200 * 1024)}))


def test_names_a_secret_cannot_hold_stay_in_the_pods_own_env() -> None:
    secret, pods = objects(payload=payload(environment={"..x": "1", "V" * 300: "2", "ok": "3"}))
    assert "ok" in secret["data"] and "..x" not in secret["data"] and "V" * 300 not in secret["data"]
    own = {e["name"]: e["value"] for e in pods[0]["spec"]["containers"][0]["env"]}
    assert own["..x"] == "1" and own["V" * 300] == "2"


def test_bytes_that_are_not_utf8_reach_the_pod_as_the_replacement_character() -> None:
    """The waiter reads the environment with surrogateescape; the kubelet refuses invalid UTF-8
    in a container's environment (the API server used to replace it in the pod's JSON)."""
    secret, _ = objects(payload=payload(environment={"X": "caf\udce9!"}))
    assert base64.b64decode(secret["data"]["X"]).decode("utf-8") == "caf\ufffd!"


def test_an_environment_too_big_for_a_secret_fails_the_job_naming_its_largest_variables() -> None:
    huge = {"BIG": "x" * (SECRET_DATA_BYTES + 1), "SMALL": "y"}
    with pytest.raises(TranslateError, match="largest variables: BIG"):
        objects(payload=payload(environment=huge))


def test_a_script_and_environment_too_big_together_go_by_the_agent_or_fail_without_it() -> None:
    big_env = {"BIG": "x" * (SECRET_DATA_BYTES - 100 * 1024)}
    script = "#!/bin/sh\n#K8S image=x\n" + "# filler\n" * 20_000  # about 180 KB
    with pytest.raises(TranslateError, match="without the bridge's in-pod agent"):
        objects(payload=payload(environment=big_env, script=script))
    with_agent = config(pods=PodsConfig(supplemental_groups_policy="", agent_image="agent:1"))
    secret, pods = desired_objects(allocation(), payload(environment=big_env, script=script),
                                   Directives(image="x"), PartitionConfig(), with_agent)
    assert base64.b64decode(secret["data"][wellknown.SECRET_SCRIPT_KEY]) == b""
    first = pods[0]["metadata"]["annotations"]
    assert first[wellknown.ANNOTATION_SCRIPT_DELIVERY] == "exec"


@pytest.mark.parametrize("value", ["plain", "$(HOME)/x", "a$$b", "cost: 5$", "$HOME"])
def test_values_survive_kubelet_expansion(value: str) -> None:
    secret, _ = objects(payload=payload(environment={"X": value}))
    assert base64.b64decode(secret["data"]["X"]).decode() == value, "envFrom values are not expanded"
    assert envs(payload=payload(environment={"X": value}))[0]["X"] == value


def kubelet_expand(value: str, defined: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion (k8s.io/kubernetes third_party/forked/golang/expansion)."""
    out = []
    i = 0
    while i < len(value):
        if value[i] == "$" and i + 1 < len(value):
            nxt = value[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = value.find(")", i + 2)
                if end != -1:
                    name = value[i + 2 : end]
                    out.append(defined.get(name, f"$({name})"))
                    i = end + 1
                    continue
            out.append("$" + nxt)
            i += 2
            continue
        out.append(value[i])
        i += 1
    return "".join(out)


@pytest.mark.parametrize("value", ["$(HOME)", "$$(HOME)", "a$$b$", "$(", "$(X", "${HOME} $1 $$$ $()", "$"])
def test_kubelet_gives_back_the_original_value(value: str) -> None:
    # Through the Secret (a job's variable) and through a pod's own env (escaped: a per-node value).
    assert envs(payload=payload(environment={"X": value}))[0]["X"] == value
    assert kubelet_expand(escape_for_kubelet(value), {"HOME": "/root", "X": "?"}) == value


def test_a_job_exported_without_home_user_and_logname_gets_them_from_slurm_and_nss() -> None:
    bare = payload(environment={"SLURM_JOB_ID": "42"})
    env = node_environment(allocation(), bare, PartitionConfig(), 0, home="/nss/alice")
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == ("/nss/alice", "alice", "alice")
    exported = payload(environment={"HOME": "/elsewhere", "USER": "alias"})
    env = node_environment(allocation(), exported, PartitionConfig(), 0, home="/nss/alice")
    assert (env["HOME"], env["USER"]) == ("/elsewhere", "alias"), "what the job exported wins"


def stdin_part() -> PartitionConfig:
    return PartitionConfig(resolve_first_node=False, volumes=[
        VolumeConfig(name="home", host_path="/home", mount_path="/home"),
        VolumeConfig(name="data", host_path="/home/alice/data/", mount_path="/data"),
    ])


AGENT = config(pods=PodsConfig(supplemental_groups_policy="", agent_image="agent:1"))


@pytest.mark.parametrize(("host_path", "in_pod"), [
    ("/home/alice/in.txt", "/home/alice/in.txt"),
    ("/home/alice/data/in.txt", "/data/in.txt"),  # the volume that holds it most closely
    ("/home/alice/data", "/data"),
    ("/home/alice/data/../in.txt", "/home/alice/in.txt"),  # resolved before the match
])
def test_sbatch_input_is_the_first_pods_script_stdin_through_the_volume_that_holds_it(
        host_path: str, in_pod: str) -> None:
    """Natively slurmstepd opens the --input file as the batch script's stdin on the batch host;
    the waiter names it, and the first pod, which runs the script, opens it through the volume."""
    job = payload(environment={wellknown.ENV_BATCH_STDIN: host_path})
    secret, pods = objects(stdin_part(), payload=job, cfg=AGENT)
    first, second = (seen(secret, pod) for pod in pods)
    assert first[wellknown.ENV_SCRIPT_STDIN] == in_pod
    assert wellknown.ENV_SCRIPT_STDIN not in second
    assert wellknown.ENV_BATCH_STDIN not in first and wellknown.ENV_BATCH_STDIN not in second


def test_without_sbatch_input_no_pod_names_a_stdin_and_a_planted_one_never_reaches_a_pod() -> None:
    planted = {wellknown.ENV_SCRIPT_STDIN: "/etc/shadow"}
    secret, pods = objects(stdin_part(), payload=payload(environment=planted), cfg=AGENT)
    assert all(wellknown.ENV_SCRIPT_STDIN not in seen(secret, pod) for pod in pods)


@pytest.mark.parametrize("host_path", ["/tmp/in.txt", "/home2/in.txt", "/homealice", "/home/../etc/shadow"])
def test_sbatch_input_no_pod_can_open_fails_the_job_naming_the_file_and_the_shared_volumes(
        host_path: str) -> None:
    job = payload(environment={wellknown.ENV_BATCH_STDIN: host_path})
    with pytest.raises(TranslateError) as failure:
        objects(stdin_part(), payload=job, cfg=AGENT)
    assert f"sbatch --input={posixpath.normpath(host_path)}" in str(failure.value)
    assert "/home, /home/alice/data/" in str(failure.value)


def test_sbatch_input_without_the_agent_fails_the_job_saying_why() -> None:
    job = payload(environment={wellknown.ENV_BATCH_STDIN: "/home/alice/in.txt"})
    with pytest.raises(TranslateError, match=r"only with the bridge's in-pod agent"):
        objects(stdin_part(), payload=job, cfg=config())


def test_the_submitted_paths_entries_on_shared_volumes_reach_every_pod_in_the_users_order() -> None:
    """`conda activate env; sbatch job.sh` natively runs the env's python: the submitted PATH is the
    script's. The host's own directories are not the pod's; entries on shared volumes are."""
    submitted = ("/home/alice/conda/envs/x/bin:/usr/local/bin:/usr/bin:relative::"
                 "/home/alice/data/tools/bin:/home/alice/bin/:/home/alice/bin:/opt/modules/gcc/bin")
    secret, pods = objects(stdin_part(), payload=payload(environment={"PATH": submitted}), cfg=AGENT)
    for pod in pods:
        env = seen(secret, pod)
        # The image's PATH takes the place of the host's first own directory (the empty entry).
        assert env[wellknown.ENV_JOB_PATH] == "/home/alice/conda/envs/x/bin::/data/tools/bin:/home/alice/bin"
        assert "PATH" not in env, "the image's PATH stays; the agent puts these around it"


@pytest.mark.parametrize(("submitted", "passed"), [
    ("/home/alice/a:/home/alice/b", "/home/alice/a:/home/alice/b"),
    ("/usr/bin:/home/alice/a", ":/home/alice/a"),
    ("//home/alice/a:/home//alice/b/:/home/alice/a", "/home/alice/a:/home/alice/b"),
    (":.:bin:/home/alice/a", "/home/alice/a"),
])
def test_shared_path_entries_keep_their_place_around_the_images(submitted: str, passed: str) -> None:
    assert shared_path_entries(submitted, stdin_part()) == passed


def test_a_huge_submitted_path_is_cut_and_costs_the_daemon_little() -> None:
    """13,500 distinct entries (128 KiB, Linux's most for one variable) once made the daemon's
    loop spend seconds per job (its duplicates were looked for in a list)."""
    huge = ":".join(f"/home/{n:x}" for n in range(13_500))
    passed = shared_path_entries(huge, stdin_part())
    assert len(passed) <= MAX_JOB_PATH_BYTES and passed.startswith("/home/0:/home/1:")
    assert len(set(passed.split(":"))) == len(passed.split(":"))


@pytest.mark.parametrize("submitted", ["/usr/bin:/bin", ""])
def test_a_path_of_host_directories_only_names_none(submitted: str) -> None:
    secret, pods = objects(stdin_part(), payload=payload(environment={"PATH": submitted}), cfg=AGENT)
    assert all(wellknown.ENV_JOB_PATH not in seen(secret, pod) for pod in pods)


def test_a_planted_job_path_never_reaches_a_pod() -> None:
    planted = {wellknown.ENV_JOB_PATH: "/evil", "PATH": "/usr/bin"}
    secret, pods = objects(stdin_part(), payload=payload(environment=planted), cfg=AGENT)
    assert all(wellknown.ENV_JOB_PATH not in seen(secret, pod) for pod in pods)


def test_the_submitted_library_paths_shared_entries_reach_the_pods_as_paths_do() -> None:
    """`module load` of a tree the pods mount, or ~/lib, sets LD_LIBRARY_PATH natively; the bridge
    dropped it whole as the slurmd host's, and such binaries failed to load their libraries."""
    submitted = {"LD_LIBRARY_PATH": "/home/alice/lib:/usr/lib/host:/home/alice/data/lib64",
                 "PATH": "/usr/bin"}
    secret, pods = objects(stdin_part(), payload=payload(environment=submitted), cfg=AGENT)
    for pod in pods:
        env = seen(secret, pod)
        assert env[wellknown.ENV_JOB_LIBRARY_PATH] == "/home/alice/lib::/data/lib64"
        assert "LD_LIBRARY_PATH" not in env and wellknown.ENV_JOB_PATH not in env
