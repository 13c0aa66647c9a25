"""Render deploy/helm/slurm-k8s-bridge with the sandbox's helm, for the tests of the chart.

helm is built from the Go module proxy by containers/helm/build.sh (sandbox-up runs it; cached
under $SBX_CACHE). A machine without it builds it here once, so these tests never skip."""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "slurm-k8s-bridge"
RELEASE = "slurm-k8s-bridge"
RELEASE_NAMESPACE = "slurm-k8s-bridge"


@functools.cache
def helm_binary() -> Path:
    """The helm binary build.sh makes (a no-op when it is there; minutes the first time)."""
    built = subprocess.run([str(REPO / "containers" / "helm" / "build.sh")], capture_output=True,
                           text=True, timeout=1800)
    assert built.returncode == 0, built.stderr
    return Path(built.stdout.strip())


def helm(*args: str, values: Mapping[str, Any] | None = None,
         tmp_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run helm ARGS (with VALUES as a values file in tmp_path); its own config dirs stay in tmp."""
    argv = [str(helm_binary()), *args]
    if values is not None:
        assert tmp_path is not None, "values need a tmp_path to be written to"
        path = tmp_path / "values.json"
        path.write_text(json.dumps(values))
        argv += ["-f", str(path)]
    home = tmp_path or Path("/tmp")
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "HELM_CONFIG_HOME": str(home / ".helm-config"),
           "HELM_CACHE_HOME": str(home / ".helm-cache"), "HELM_DATA_HOME": str(home / ".helm-data")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def render(tmp_path: Path, values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """`helm template` of the chart as the release slurm-k8s-bridge: its objects, parsed."""
    result = helm("template", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE,
                  values=values or {}, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one object of KIND named NAME."""
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]
