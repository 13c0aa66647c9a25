"""A partition's pod_annotations land on every pod, with ${NAME} / ${NAME:-default} taken from the
job's environment (the sandbox's sim partition drives kwok's pod stages this way)."""

from __future__ import annotations

import pytest

from bridge.core import wellknown
from bridge.core.annotation_templates import expand_annotations
from bridge.core.config import ConfigError, PartitionConfig, parse_config
from bridge.core.directives import Directives
from bridge.core.translate import desired_pods

from .builders import allocation, config, payload

MINIMAL = 'cluster = "c1"\n[slurm]\nurl = "http://127.0.0.1:6820"\n[partitions.sim]\n'


@pytest.mark.parametrize(
    ("template", "env", "expected"),
    [
        ("${A}", {"A": "1"}, "1"),
        ("${A}", {}, ""),
        ("${A:-5s}", {}, "5s"),
        ("${A:-5s}", {"A": ""}, "5s"),  # as sh: unset or empty
        ("${A:-${B:-7}}", {"B": "3"}, "3"),
        ("${A:-${B:-7}}", {}, "7"),
        ("x-${A}-y", {"A": "m"}, "x-m-y"),
        ("${A}", {"A": "${B}"}, "${B}"),  # a job's value is inserted as it is, never expanded again
        ("$A ${ not a reference", {"A": "1"}, "$A ${ not a reference"),
    ],
)
def test_expansion(template: str, env: dict[str, str], expected: str) -> None:
    assert expand_annotations({"k": template}, env) == {"k": expected}


def test_annotations_reach_every_pod_but_never_the_bridges_own_keys() -> None:
    part = PartitionConfig(pod_annotations={"pod-complete.stage.kwok.x-k8s.io/exit-code": "${CODE:-0}"})
    job = payload(environment={"CODE": "3"})
    pods = desired_pods(allocation(), job, Directives(image="i"), part, config())
    for index, pod in enumerate(pods):
        annotations = pod["metadata"]["annotations"]
        assert annotations["pod-complete.stage.kwok.x-k8s.io/exit-code"] == "3"
        assert annotations[wellknown.ANNOTATION_NODE_INDEX] == str(index)


def test_config_reads_them() -> None:
    cfg = parse_config(MINIMAL + '[partitions.sim.pod_annotations]\n"example.com/a" = "${X:-1}"\n')
    assert cfg.partitions["sim"].pod_annotations == {"example.com/a": "${X:-1}"}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('"slurm-k8s-bridge/script" = "x"', "are the bridge's own"),
        ('"bad key!" = "x"', "is not a valid annotation key"),
        ('"example.com/a" = 3', "expected a string"),
    ],
)
def test_bad_annotations_are_named(table: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(MINIMAL + "[partitions.sim.pod_annotations]\n" + table + "\n")
