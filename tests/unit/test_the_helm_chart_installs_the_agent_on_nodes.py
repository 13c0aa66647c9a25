"""The chart's agentOnNodes DaemonSet (issue 22, a pod that starts once): it puts the agent image's
agent in hostDir on every node job pods may run on, and the chart refuses a daemon config that
would not mount what it installs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bridge.core.config import parse_config
from tests.unit.helm_chart import CHART, RELEASE, RELEASE_NAMESPACE, find, helm, render

AGENT_IMAGE = "reg.example/slurm-k8s-bridge-agent:0.9"
TABLES = ('[pods]\nagent_image = "reg.example/slurm-k8s-bridge-agent:0.9"\n'
          'agent_host_dir = "/var/lib/slurm-k8s-bridge/agent/current"\n\n'
          '[partitions.k8s]\ndefault_image = "debian:stable-slim"\n')
SECRETS = {"secrets": {"jwt": {"value": "SLURM_JWT=x"}, "munge": {"keyBase64": "a2V5"}}}


def _values(**agent: Any) -> dict[str, Any]:
    return {**SECRETS, "config": {"extraTables": TABLES},
            "agentOnNodes": {"enabled": True, "image": AGENT_IMAGE, **agent}}


def test_no_daemonset_unless_asked(tmp_path: Path) -> None:
    assert [o for o in render(tmp_path, SECRETS) if o["kind"] == "DaemonSet"] == []


def test_the_daemonset_installs_the_agent_into_the_host_directory_and_holds(tmp_path: Path) -> None:
    objects = render(tmp_path, _values(nodeSelector={"type": "gpu"}))
    spec = find(objects, "DaemonSet", f"{RELEASE}-agent")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["image"] == AGENT_IMAGE
    assert container["command"] == ["/slurm-k8s-bridge-agent", "install-on-node", "/host-agent", "hold"]
    assert container["volumeMounts"] == [{"name": "agent-dir", "mountPath": "/host-agent"}]
    assert spec["volumes"] == [{"name": "agent-dir", "hostPath": {
        "path": "/var/lib/slurm-k8s-bridge/agent", "type": "DirectoryOrCreate"}}]
    assert spec["nodeSelector"] == {"type": "gpu"}
    assert spec["tolerations"] == [{"operator": "Exists"}]  # job pods may be on any tainted node
    assert "priorityClassName" not in spec
    # Root only to write the node's directory: no capability, nothing else writable, no token.
    security = container["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["privileged"] is False
    assert spec["automountServiceAccountToken"] is False


def test_the_daemons_deployment_and_service_do_not_select_the_agents_pods(tmp_path: Path) -> None:
    objects = render(tmp_path, _values())
    labels = find(objects, "DaemonSet", f"{RELEASE}-agent")["spec"]["template"]["metadata"]["labels"]
    for selector in (find(objects, "Deployment", RELEASE)["spec"]["selector"]["matchLabels"],
                     find(objects, "Service", RELEASE)["spec"]["selector"]):
        assert not all(labels.get(key) == value for key, value in selector.items()), selector


def test_the_daemon_config_that_mounts_it_is_accepted_by_the_daemon(tmp_path: Path) -> None:
    objects = render(tmp_path, _values())
    text = find(objects, "ConfigMap", RELEASE)["data"]["config.toml"]
    pods = parse_config(text).pods
    assert pods.agent_host_dir == "/var/lib/slurm-k8s-bridge/agent/current"
    assert pods.agent_image == AGENT_IMAGE


def test_a_config_that_would_not_mount_what_it_installs_is_refused(tmp_path: Path) -> None:
    values = _values(hostDir="/opt/bridge-agent")
    result = helm("template", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, values=values,
                  tmp_path=tmp_path)
    assert result.returncode != 0
    assert 'must hold agent_host_dir = "/opt/bridge-agent/current"' in result.stderr


def test_a_commented_out_key_or_another_image_is_refused(tmp_path: Path) -> None:
    commented = TABLES.replace('agent_host_dir = "', '# agent_host_dir = "')
    other_image = TABLES.replace("slurm-k8s-bridge-agent:0.9", "slurm-k8s-bridge-agent:0.8")
    for tables, says in ((commented, "must hold agent_host_dir"), (other_image, "must hold agent_image")):
        values = {**_values(), "config": {"extraTables": tables}}
        result = helm("template", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, values=values,
                      tmp_path=tmp_path)
        assert result.returncode != 0 and says in result.stderr, (tables, result.stderr)


def test_a_relative_host_directory_or_no_image_is_refused(tmp_path: Path) -> None:
    for values, says in ((_values(hostDir="agent"), "must be an absolute path"),
                         (_values(image=""), "agentOnNodes.image")):
        result = helm("template", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, values=values,
                      tmp_path=tmp_path)
        assert result.returncode != 0 and says in result.stderr, (values, result.stderr)
