"""`sbatch job.sh a 'b c'` (parity): the script gets its arguments in the pod, as natively. The
wrapper job_submit.lua writes passes them to the waiter ("$@"), the waiter sends them, the pod's
command carries them after the script, escaped for the kubelet."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.core.config import PartitionConfig
from bridge.core.directives import parse_directives
from bridge.core.model import ModelError, payload_from_json
from bridge.core.translate import MAX_ARGUMENT_BYTES, TranslateError, desired_pods
from tests.unit.builders import SCRIPT, allocation, config, payload

REPO = Path(__file__).resolve().parents[2]


def test_the_payload_takes_the_arguments_as_a_list_of_strings() -> None:
    base = {"script": SCRIPT, "environment": {}, "work_dir": "/home/alice", "uid": 1000, "gid": 100}
    assert payload_from_json(base).arguments == ()
    assert payload_from_json({**base, "arguments": ["a", "b c", ""]}).arguments == ("a", "b c", "")
    for bad in ("a b", [1], [["a"]], {"a": "b"}):
        with pytest.raises(ModelError, match="arguments"):
            payload_from_json({**base, "arguments": bad})


def test_the_pods_command_runs_the_script_with_its_arguments_unexpanded() -> None:
    made = payload(arguments=("a", "b c", "$(HOME)"))
    (pod, _) = desired_pods(allocation(), made, parse_directives(made.script), PartitionConfig(), config())
    command = pod["spec"]["containers"][0]["command"]
    assert command[-3:] == ["a", "b c", "$$(HOME)"]  # the kubelet would expand $(HOME)


def test_arguments_too_big_for_a_pod_are_refused() -> None:
    made = payload(arguments=("x" * MAX_ARGUMENT_BYTES,))
    with pytest.raises(TranslateError, match="arguments exceed"):
        desired_pods(allocation(), made, parse_directives(made.script), PartitionConfig(), config())
