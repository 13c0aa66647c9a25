"""The TOML configuration is validated; every error names the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.core.config import (
    ApiConfig,
    BridgeConfig,
    ConfigError,
    KubeConfig,
    PartitionConfig,
    SlurmConfig,
    VolumeConfig,
    parse_config,
)
from bridge.manager.config_file import load_config

EXAMPLE = Path(__file__).parents[2] / "docs" / "bridge.example.toml"

MINIMAL = """
cluster = "c1"
[slurm]
url = "http://127.0.0.1:6820"
[partitions.k8s]
"""


def test_minimal_config_gets_defaults() -> None:
    assert parse_config(MINIMAL) == BridgeConfig(
        cluster="c1",
        partitions={"k8s": PartitionConfig()},
        namespace="slurm-jobs",
        slurm=SlurmConfig(backend="rest", rest_url="http://127.0.0.1:6820", poll_interval_s=0.2),
        kube=KubeConfig(kubeconfig=None),
        api=ApiConfig(listen="127.0.0.1:8470"),
        termination_grace_s=10,
        log_level="info",
    )


def test_documented_example_loads() -> None:
    cfg = load_config(EXAMPLE)
    assert cfg.cluster == "sandbox"
    assert cfg.slurm.token_file == Path("/etc/slurm-k8s-bridge/slurm.jwt")
    assert cfg.kube.kubeconfig == Path("/etc/slurm-k8s-bridge/kubeconfig")
    assert cfg.partition("k8s") == PartitionConfig(
        default_image="debian:stable-slim",
        volumes=(
            VolumeConfig("home", "/home", "/home", read_only=False),
            VolumeConfig("datasets", "/srv/datasets", "/data", read_only=True),
        ),
    )
    assert cfg.partition("native") is None


def test_full_partition_and_sections() -> None:
    cfg = parse_config(
        MINIMAL
        + """
gpu_mode = "device-plugin"
host_network = true
node_label = "example.org/slurm-node"
runtime_class = "nvidia"
image_pull_policy = "Always"
tolerations = [{key = "gpu", operator = "Exists", effect = "NoSchedule"}, {key = "x", tolerationSeconds = 5}]
[api]
listen = "[::1]:9000"
"""
    )
    part = cfg.partitions["k8s"]
    assert (
        part.gpu_mode,
        part.host_network,
        part.node_label,
        part.runtime_class,
        part.image_pull_policy,
    ) == (
        "device-plugin",
        True,
        "example.org/slurm-node",
        "nvidia",
        "Always",
    )
    assert part.tolerations == (
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "x", "tolerationSeconds": 5},
    )
    assert cfg.api == ApiConfig(listen="[::1]:9000")
    assert (cfg.api.host, cfg.api.port) == ("::1", 9000)


def test_url_trailing_slash_is_dropped_and_pyslurm_needs_no_url() -> None:
    assert parse_config(MINIMAL.replace(":6820", ":6820/")).slurm.rest_url == "http://127.0.0.1:6820"
    text = 'cluster = "c"\n[slurm]\nbackend = "pyslurm"\n[partitions.p]\n'
    assert parse_config(text).slurm == SlurmConfig(backend="pyslurm")


def test_repr_holds_no_token() -> None:
    # Only the token file's path is configuration; the secret is never read here.
    cfg = parse_config(MINIMAL.replace("[slurm]", '[slurm]\ntoken_file = "/run/jwt"'))
    assert "token_file=PosixPath('/run/jwt')" in repr(cfg)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cluster = ", "not valid TOML"),
        ("[partitions.k8s]\n", "cluster: required"),
        ('cluster = "c"\n[slurm]\nurl = "http://x"\n', "partitions: no partition is bridged"),
        (MINIMAL.replace('"c1"', '"bad name"'), "cluster: 'bad name' is not a valid Kubernetes label value"),
        (MINIMAL.replace('"c1"', "1"), "cluster: expected a string, got int"),
        (MINIMAL + 'gpu_mode = "cuda"', "partitions.k8s.gpu_mode: must be one of 'env', 'device-plugin'"),
        (MINIMAL + 'gpu_modes = "env"', "partitions.k8s.gpu_modes: unknown key"),
        (MINIMAL + 'image_pull_policy = "always"', "partitions.k8s.image_pull_policy: must be one of"),
        (MINIMAL + "host_network = 1", "partitions.k8s.host_network: expected true or false"),
        (MINIMAL + 'node_label = "a b"', "partitions.k8s.node_label: 'a b' is not a valid"),
        (MINIMAL + 'node_label = "Bad_Prefix/x"', "partitions.k8s.node_label"),
        (MINIMAL + 'runtime_class = "No"', "partitions.k8s.runtime_class"),
        (MINIMAL + 'default_image = ""', "partitions.k8s.default_image: must not be empty"),
        (MINIMAL + "volumes = 3", "partitions.k8s.volumes: expected an array of tables"),
        (MINIMAL + "volumes = [{host_path = '/h'}]", r"partitions.k8s.volumes\[0\].name: required"),
        (MINIMAL + "volumes = [{name = 'H', host_path = '/h'}]", "name: 'H' is not a valid volume name"),
        (MINIMAL + "volumes = [{name = 'h', host_path = 'h'}]", "host_path: 'h' is not an absolute path"),
        (
            MINIMAL + "volumes = [{name = 'h', host_path = '/h', mount_path = '/slurm-k8s-bridge'}]",
            "mount_path: '/slurm-k8s-bridge' is used by the bridge",
        ),
        (
            MINIMAL + "volumes = [{name = 'slurm-k8s-bridge-script', host_path = '/h'}]",
            "is reserved",
        ),
        (
            MINIMAL + "volumes = [{name = 'h', host_path = '/a'}, {name = 'h', host_path = '/b'}]",
            "volume name 'h' is used twice",
        ),
        (
            MINIMAL + "volumes = [{name = 'a', host_path = '/h'}, {name = 'b', host_path = '/h'}]",
            "mount_path '/h' is used twice",
        ),
        (MINIMAL + "volumes = [{name = 'h', host_path = '/h', ro = true}]", r"volumes\[0\].ro: unknown key"),
        (
            MINIMAL + "tolerations = [{key = 'a', operator = 'In'}]",
            r"tolerations\[0\].operator: must be one of 'Equal', 'Exists'",
        ),
        (
            MINIMAL + "tolerations = [{key = 'a', effect = 'Never'}]",
            r"tolerations\[0\].effect: must be one of 'NoSchedule', 'PreferNoSchedule', 'NoExecute'",
        ),
        (MINIMAL + "tolerations = [{kee = 'a'}]", r"tolerations\[0\].kee: unknown key"),
        (MINIMAL.replace('url = "http://127.0.0.1:6820"', ""), "slurm.url: required when backend is 'rest'"),
        (MINIMAL.replace("http://", "ftp://"), "slurm.url: 'ftp://127.0.0.1:6820' is not an http"),
        (MINIMAL.replace("[slurm]", '[slurm]\nbackend = "sacct"'), "slurm.backend: must be one of"),
        (
            MINIMAL.replace("[slurm]", "[slurm]\npoll_interval_s = 0"),
            "slurm.poll_interval_s: must be greater",
        ),
        (MINIMAL.replace("[slurm]", "[slurm]\npoll_interval_s = true"), "poll_interval_s: expected a number"),
        (MINIMAL.replace("[slurm]", "[slurm]\ntoken = 'abc'"), "slurm.token: unknown key"),
        ('namespace = "Jobs"\n' + MINIMAL, "namespace: 'Jobs' is not a valid namespace"),
        ('log_level = "trace"\n' + MINIMAL, "log_level: must be one of"),
        ("termination_grace_s = -1\n" + MINIMAL, "termination_grace_s: must be at least 0"),
        ('clutser = "x"\n' + MINIMAL, "clutser: unknown key"),
        (MINIMAL + '[api]\nlisten = "8470"', "api.listen: '8470' is not HOST:PORT"),
        (MINIMAL + '[api]\nlisten = "h:99999"', "api.listen: 'h:99999' is not HOST:PORT"),
        (MINIMAL + "[kubernetes]\nkubeconfig = 1", "kubernetes.kubeconfig: expected a string"),
        ("partitions = 1\n" + MINIMAL.replace("[partitions.k8s]", ""), "partitions: expected a table"),
        # The slurmds' /bin/sh runs it in every bridged batch step's wrapper (the step guard's).
        (MINIMAL + '[waiter]\napi_url = "http://h:8470/?a&b"', "a shell would act on: &"),
        (MINIMAL + '[waiter]\napi_url = "http://h:8470/$(id)"', r"a shell would act on: \$\(\)"),
    ],
)
def test_invalid_configs_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_config(text, source="bridge.toml")
    assert str(info.value).startswith("bridge.toml: ")


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")


def test_every_problem_is_named_on_a_line_of_its_own() -> None:
    text = MINIMAL.replace("[slurm]", "[slurm]\npoll_interval_s = 0")
    text += 'gpu_mode = "cuda"\nhost_network = 1\n'
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="bridge.toml")
    lines = str(info.value).splitlines()
    assert len(lines) == 3
    assert all(line.startswith("bridge.toml: ") for line in lines)
    assert {line.split(": ")[1] for line in lines} == {
        "slurm.poll_interval_s", "partitions.k8s.gpu_mode", "partitions.k8s.host_network",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # The attribute's name is no TOML key: only `url` is.
        (MINIMAL.replace('url = "http://127.0.0.1:6820"', 'rest_url = "http://127.0.0.1:6820"'),
         r"slurm\.rest_url: unknown key \(known here: "),
        ('cluster = 1979-05-27\n[slurm]\nurl = "http://x"\n[partitions.k8s]\n',
         "cluster: expected a string, got date"),
        (MINIMAL.replace("[slurm]", "[leader_election]\nrenew_deadline_s = 20\n[slurm]"),
         "leader_election.renew_deadline_s: needs retry_period_s < renew_deadline_s < lease_duration_s"),
        (MINIMAL + "cpu_request_fraction = 1.5", "partitions.k8s.cpu_request_fraction: must be at most 1.0"),
        (MINIMAL + "[waiter]\nunmunge_command = ' '", "waiter.unmunge_command: must not be empty"),
    ],
)
def test_names_are_the_files_and_values_are_never_converted(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(text, source="bridge.toml")


def test_unmunge_command_is_a_command_line() -> None:
    waiter = "[waiter]\nunmunge_command = 'sudo -u munge unmunge'\n"
    cfg = parse_config(MINIMAL.replace("[slurm]", waiter + "[slurm]"))
    assert cfg.waiter.unmunge_command == ("sudo", "-u", "munge", "unmunge")
