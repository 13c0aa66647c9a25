"""deploy/helm/slurm-k8s-bridge: lints clean, templates one job namespace into both the RBAC and
the daemon's config, switches what the pyslurm backend changes, refuses what would break, and
writes a config the daemon accepts."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

import bridge
from tests.unit.helm_chart import CHART, RELEASE, RELEASE_NAMESPACE, find, helm, render

SECRETS = {"secrets": {"jwt": {"value": "SLURM_JWT=x"}, "munge": {"keyBase64": "a2V5"}}}


def _config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return tomllib.loads(find(objects, "ConfigMap", RELEASE)["data"]["config.toml"])


def _pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = find(objects, "Deployment", RELEASE)["spec"]["template"]["spec"]
    return spec


def test_helm_lint_passes(tmp_path: Path) -> None:
    result = helm("lint", "--strict", str(CHART), tmp_path=tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_lint_fails_on_a_broken_template(tmp_path: Path) -> None:
    """The lint test above can fail: the same lint on a copy with one unclosed action does."""
    broken = tmp_path / "chart"
    subprocess.run(["cp", "-r", str(CHART), str(broken)], check=True)
    service = broken / "templates" / "service.yaml"
    service.write_text(service.read_text().replace("{{ .Values.service.type }}", "{{ .Values.service.type"))

    assert helm("lint", "--strict", str(broken), tmp_path=tmp_path).returncode != 0


def test_one_job_namespace_value_goes_into_the_rbac_and_the_config(tmp_path: Path) -> None:
    objects = render(tmp_path, {"jobNamespace": {"name": "hpc-jobs"}})

    assert _config(objects)["namespace"] == "hpc-jobs"
    role = find(objects, "Role", f"{RELEASE}-jobs")
    binding = find(objects, "RoleBinding", f"{RELEASE}-jobs")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "hpc-jobs"
    assert [r["resourceNames"] for r in role["rules"] if "namespaces" in r["resources"]] == [["hpc-jobs"]]
    namespace = find(objects, "Namespace", "hpc-jobs")
    assert namespace["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep", "jobs may still run"
    rendered = yaml.safe_dump_all(objects)
    assert "slurm-jobs" not in rendered, "the default job namespace is left nowhere"
    # The daemon's own objects stay in the release's namespace.
    assert find(objects, "Role", f"{RELEASE}-self")["metadata"]["namespace"] == RELEASE_NAMESPACE
    account = {"kind": "ServiceAccount", "name": RELEASE, "namespace": RELEASE_NAMESPACE}
    assert binding["subjects"] == [account]


def test_an_existing_job_namespace_is_not_created(tmp_path: Path) -> None:
    objects = render(tmp_path, {"jobNamespace": {"create": False}})

    assert [o for o in objects if o["kind"] == "Namespace"] == []
    assert find(objects, "Role", f"{RELEASE}-jobs")["metadata"]["namespace"] == "slurm-jobs"


def test_the_app_version_is_the_daemons_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())

    assert chart["appVersion"] == bridge.__version__


def test_image_replicas_and_leader_election_come_from_the_values(tmp_path: Path) -> None:
    image = {"repository": "reg.example/bridge", "tag": "9.9", "pullPolicy": "Always"}
    objects = render(tmp_path, {"image": image, "replicas": 1, "leaderElection": {"enabled": False}})

    pod = _pod(objects)
    assert {c["image"] for c in pod["containers"] + pod["initContainers"]} == {"reg.example/bridge:9.9"}
    assert {c["imagePullPolicy"] for c in pod["containers"] + pod["initContainers"]} == {"Always"}
    assert find(objects, "Deployment", RELEASE)["spec"]["replicas"] == 1
    assert _config(objects)["leader_election"]["enabled"] is False


def test_the_default_image_tag_is_the_app_version(tmp_path: Path) -> None:
    pod = _pod(render(tmp_path))

    assert pod["containers"][0]["image"] == f"slurm-k8s-bridge:{bridge.__version__}"


def test_two_replicas_without_leader_election_are_refused(tmp_path: Path) -> None:
    values = {"replicas": 2, "leaderElection": {"enabled": False}}
    result = helm("template", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, values=values,
                  tmp_path=tmp_path)

    assert result.returncode != 0
    assert "leaderElection.enabled" in result.stderr


def test_the_rest_backend_runs_unprivileged_without_slurm_conf(tmp_path: Path) -> None:
    objects = render(tmp_path)

    pod = _pod(objects)
    assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["fsGroup"] == 65532
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert _config(objects)["slurm"]["backend"] == "rest"
    assert "slurm-conf" not in {v["name"] for v in pod["volumes"]}
    assert [c["name"] for c in pod["initContainers"]] == ["munged"], "unmunge needs the sidecar either way"


def test_the_pyslurm_backend_runs_as_slurm_user_with_slurm_conf(tmp_path: Path) -> None:
    slurm_conf = "ClusterName=x\nSlurmctldHost=ctl(10.0.0.1)\nAuthInfo=socket=/run/munge/munge.socket.2\n"
    slurm = {"backend": "pyslurm", "slurmUserId": 64030, "slurmConf": slurm_conf}
    objects = render(tmp_path, {"slurm": slurm})

    pod = _pod(objects)
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"],
            pod["securityContext"]["fsGroup"]) == (64030, 64030, 64030)
    assert _config(objects)["slurm"]["backend"] == "pyslurm"
    assert find(objects, "ConfigMap", f"{RELEASE}-slurm-conf")["data"]["slurm.conf"] == slurm_conf
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["slurm-conf"] == "/etc/slurm"
    assert mounts["munge-socket"] == "/run/munge", "libslurm signs with the sidecar's munged"


@pytest.mark.parametrize(("slurm", "needs"), [
    ({"backend": "pyslurm", "slurmConf": "ClusterName=x\n"}, "slurm.slurmUserId"),
    ({"backend": "pyslurm", "slurmUserId": 64030}, "slurm.conf"),
    ({"backend": "sacct"}, "rest or pyslurm"),
])
def test_a_pyslurm_backend_without_what_it_needs_is_refused(tmp_path: Path, slurm: dict[str, Any],
                                                            needs: str) -> None:
    result = helm("template", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, values={"slurm": slurm},
                  tmp_path=tmp_path)

    assert result.returncode != 0
    assert needs in result.stderr


def test_existing_secrets_are_used_and_none_are_made(tmp_path: Path) -> None:
    objects = render(tmp_path, {"secrets": {"jwt": {"existingSecret": "site-jwt"},
                                            "munge": {"existingSecret": "site-munge"}}})

    assert [o for o in objects if o["kind"] == "Secret"] == []
    volumes = {v["name"]: v for v in _pod(objects)["volumes"]}
    assert volumes["jwt"]["secret"]["secretName"] == "site-jwt"
    assert volumes["munge-key"]["secret"]["secretName"] == "site-munge"


def test_secret_values_become_the_releases_own_secrets(tmp_path: Path) -> None:
    objects = render(tmp_path, SECRETS)

    assert find(objects, "Secret", f"{RELEASE}-jwt")["data"] == {"slurm.jwt": "U0xVUk1fSldUPXg="}
    assert find(objects, "Secret", f"{RELEASE}-munge")["data"] == {"munge.key": "a2V5"}
    volumes = {v["name"]: v for v in _pod(objects)["volumes"]}
    assert volumes["jwt"]["secret"] == {"secretName": f"{RELEASE}-jwt", "defaultMode": 0o440}


def test_a_changed_secret_rolls_the_replicas(tmp_path: Path) -> None:
    def checksums(jwt: str, path: Path) -> dict[str, str]:
        path.mkdir()
        values = {"secrets": {"jwt": {"value": jwt}, "munge": {"keyBase64": "a2V5"}}}
        template = find(render(path, values), "Deployment", RELEASE)["spec"]["template"]
        annotations = template["metadata"]["annotations"]
        return {k: v for k, v in annotations.items() if k.startswith("checksum/")}

    before, after = checksums("one", tmp_path / "a"), checksums("two", tmp_path / "b")

    assert before["checksum/config"] == after["checksum/config"]
    assert before["checksum/secrets"] != after["checksum/secrets"]


def test_the_service_selects_only_the_leader_of_this_release(tmp_path: Path) -> None:
    objects = render(tmp_path, {"service": {"clusterIP": "10.96.84.70", "port": 8471}})

    service = find(objects, "Service", RELEASE)
    pod_labels = find(objects, "Deployment", RELEASE)["spec"]["template"]["metadata"]["labels"]
    selector = service["spec"]["selector"]
    assert selector.pop("slurm-k8s-bridge/role") == "leader"
    assert selector.items() <= pod_labels.items()
    assert service["spec"]["clusterIP"] == "10.96.84.70"
    assert _config(objects)["waiter"]["api_url"] == "http://10.96.84.70:8471", "waiters follow the fixed IP"


def test_without_a_fixed_ip_waiters_use_the_services_dns_name(tmp_path: Path) -> None:
    config = _config(render(tmp_path))

    assert config["waiter"]["api_url"] == f"http://{RELEASE}.{RELEASE_NAMESPACE}.svc:8470"


def test_scheduling_and_resources_come_from_the_values(tmp_path: Path) -> None:
    toleration = {"key": "slurm-k8s-bridge/bridged", "operator": "Exists", "effect": "NoSchedule"}
    objects = render(tmp_path, {"nodeSelector": {"type": "real"}, "tolerations": [toleration],
                                "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                              "limits": {"memory": "2Gi"}}})

    pod = _pod(objects)
    assert pod["nodeSelector"] == {"type": "real"}
    assert pod["tolerations"] == [toleration]
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"},
                                                 "limits": {"memory": "2Gi"}}
    assert "podAntiAffinity" in pod["affinity"], "replicas prefer different nodes by default"


def test_the_daemon_accepts_the_config_the_chart_writes(tmp_path: Path) -> None:
    extra = {"config": {
        "extraTopLevel": "termination_grace_s = 5\n",
        "extraSlurm": "poll_interval_s = 0.2\n",
        "extraWaiter": 'attach_command = "/opt/slurm-k8s-bridge/waiter"\n',
        "extraTables": '[pods]\nagent_image = "a:1"\n\n[partitions.k8s]\ndefault_image = "busybox:1"\n',
    }}
    config = tmp_path / "config.toml"
    config.write_text(find(render(tmp_path, extra), "ConfigMap", RELEASE)["data"]["config.toml"])

    command = [sys.executable, "-m", "bridge.manager.cli", "job-submit-conf", "-c", str(config)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)

    assert result.returncode == 0, result.stderr
    assert (f"attach_command=/opt/slurm-k8s-bridge/waiter --api http://{RELEASE}.{RELEASE_NAMESPACE}"
            ".svc:8470") in result.stdout
    assert "partition=k8s default_image=busybox:1" in result.stdout
    assert tomllib.loads(config.read_text())["termination_grace_s"] == 5


KEY = re.compile(r"^(\s*)([A-Za-z][A-Za-z0-9]*):")


def test_every_key_of_values_yaml_is_documented_above_itself() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented, block_indent = [], None
    for number, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if block_indent is not None and (not line.strip() or indent > block_indent):
            continue  # inside a block scalar (|): TOML, not keys
        block_indent = None
        match = KEY.match(line)
        if not match:
            continue
        if line.rstrip().endswith("|"):
            block_indent = indent
        above = lines[number - 1].strip() if number else ""
        if not above.startswith("#"):
            undocumented.append(match.group(2))

    assert undocumented == []


def test_one_replica_without_leader_election_is_reached_by_the_release_labels(tmp_path: Path) -> None:
    """Without an election nothing labels a leader: a Service that asked for one would have no
    endpoint, and no waiter could attach."""
    objects = render(tmp_path, {"replicas": 1, "leaderElection": {"enabled": False}})

    selector = find(objects, "Service", RELEASE)["spec"]["selector"]
    pod_labels = find(objects, "Deployment", RELEASE)["spec"]["template"]["metadata"]["labels"]
    assert "slurm-k8s-bridge/role" not in selector
    assert selector.items() <= pod_labels.items()


def test_two_releases_of_one_name_in_two_namespaces_claim_different_cluster_objects(tmp_path: Path) -> None:
    names = []
    for namespace in ("cluster-a", "cluster-b"):
        result = helm("template", RELEASE, str(CHART), "--namespace", namespace, values={}, tmp_path=tmp_path)
        assert result.returncode == 0, result.stderr
        names.append({(o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all(result.stdout)
                      if o and o["kind"] in ("ClusterRole", "ClusterRoleBinding")})
    assert len(names[0]) == 2 and not names[0] & names[1]


@pytest.mark.parametrize(("namespace", "values", "says"), [
    ("slurm-jobs", {}, "not the job namespace"),
    ("default", {}, "namespace of its own"),
    (RELEASE_NAMESPACE, {"podLabels": {"slurm-k8s-bridge/role": "leader"}}, "must not set"),
    (RELEASE_NAMESPACE, {"config": {"extraLeaderElection": 'namespace = "x"\n'}}, "namespace or lease_name"),
    (RELEASE_NAMESPACE, {"config": {"extraTopLevel": 'namespace = "x"\n'}}, "namespace or lease_name"),
    (RELEASE_NAMESPACE, {"runAsUser": 0}, "never run as root"),
    (RELEASE_NAMESPACE, {"slurm": {"backend": "pyslurm", "slurmUserId": 0, "slurmConf": "x"}}, "as root"),
], ids=["job-namespace", "default", "leader-label", "lease-namespace", "job-namespace-in-config", "root",
        "pyslurm-root"])
def test_values_that_would_break_the_rbac_or_run_as_root_are_refused(
    tmp_path: Path, namespace: str, values: dict[str, Any], says: str
) -> None:
    result = helm("template", RELEASE, str(CHART), "--namespace", namespace, values=values, tmp_path=tmp_path)

    assert result.returncode != 0
    assert says in result.stderr


def test_the_pyslurm_backend_does_not_wait_for_a_jwt(tmp_path: Path) -> None:
    objects = render(tmp_path, {"slurm": {"backend": "pyslurm", "slurmUserId": 64030, "slurmConf": "x"}})

    volumes = {v["name"]: v for v in _pod(objects)["volumes"]}
    assert volumes["jwt"]["secret"].get("optional") is True
    assert "optional" not in {v["name"]: v for v in _pod(render(tmp_path))["volumes"]}["jwt"]["secret"]
