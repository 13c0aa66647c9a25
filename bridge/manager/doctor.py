"""`slurm-k8s-bridge doctor`: check, one by one, everything the daemon needs; say plainly what is
wrong and how to fix it. Exit status 1 when any check fails."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bridge.clients.kube.client import make_api_client, request_json
from bridge.clients.kube.dra import SLICES_PATH
from bridge.clients.kube.leader_pod import OwnPod
from bridge.clients.slurm import slurm_node as read_slurm_node
from bridge.clients.slurm.rest import API_VERSION
from bridge.core import hostlist, nodehealth, wellknown
from bridge.core.attach_command import attach_command_files
from bridge.core.config import BridgeConfig
from bridge.core.device_claims import SliceView, trim_slice
from bridge.core.errors import BridgeError
from bridge.manager.config_file import secret_file_exposure
from bridge.manager.doctor_access import needed_access
from bridge.manager.doctor_gpus import gpu_problems
from bridge.manager.doctor_waiter import waiter_install_problems
from bridge.manager.doctor_workloads import capacity_notes, not_slurms

TOKEN_WARN_S = 24 * 3600


class CheckFailed(Exception):
    """A check found a problem; the message says what and how to fix it."""


@dataclass
class Result:
    name: str
    ok: bool
    message: str


def jwt_expiry(token: str) -> int | None:
    """The `exp` claim of a JWT (not verified: slurmrestd does that), or None."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return int(claims["exp"])
    except (IndexError, KeyError, ValueError, TypeError):
        return None


class Doctor:
    def __init__(self, cfg: BridgeConfig, slurm_conf: Path | None) -> None:
        self.cfg = cfg
        self.slurm_conf = slurm_conf
        self.slurm_nodes: dict[str, list[str]] = {}
        self.slurm_alternates: dict[str, str] = {}

    # -- Slurm --------------------------------------------------------------------
    async def _rest(self, path: str) -> dict:
        slurm = self.cfg.slurm
        assert slurm.rest_url is not None and slurm.token_file is not None
        token = Path(slurm.token_file).read_text().strip().removeprefix("SLURM_JWT=")
        headers = {"X-SLURM-USER-NAME": slurm.rest_user or "slurm", "X-SLURM-USER-TOKEN": token}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            try:
                async with session.get(f"{slurm.rest_url}{path}", headers=headers) as response:
                    if response.status in (401, 403, 511):
                        raise CheckFailed(
                            f"slurmrestd refused the token in {slurm.token_file} for user "
                            f"{slurm.rest_user or 'slurm'} (HTTP {response.status}). Mint a new one on the "
                            "controller: scontrol token username=slurm lifespan=... > that file (mode 600)"
                        )
                    if response.status >= 400:
                        raise CheckFailed(f"slurmrestd answered HTTP {response.status} for {path}")
                    return await response.json(content_type=None)
            except aiohttp.ClientResponseError as error:
                raise CheckFailed(
                    f"slurmrestd refused the token in {slurm.token_file} (its answer was malformed, "
                    f"{error.message!r}, as slurmrestd 26.05's answers to refused tokens are). Mint a new "
                    "one on the controller: scontrol token username=slurm lifespan=... > that file (mode 600)"
                ) from None
            except aiohttp.ClientError as error:
                raise CheckFailed(
                    f"slurmrestd at {slurm.rest_url} is unreachable ({error}). Is slurmrestd running "
                    "and listening there? (systemctl status slurmrestd)"
                ) from None

    async def check_config(self) -> str:
        c = self.cfg
        return f"cluster {c.cluster}, partitions {', '.join(sorted(c.partitions))}, namespace {c.namespace}"

    async def check_slurm(self) -> str:
        slurm = self.cfg.slurm
        if slurm.backend == "pyslurm":
            return await self.check_pyslurm()
        if slurm.token_file is None:
            raise CheckFailed("slurm.token_file is not set: the rest backend needs a JWT file")
        path = Path(slurm.token_file)
        if not path.exists():
            raise CheckFailed(f"the JWT file {path} does not exist; create it with scontrol token")
        stat = path.stat()
        mode = stat.st_mode & 0o777
        exposed_to = secret_file_exposure(mode, stat.st_gid, {os.getegid(), *os.getgroups()})
        if exposed_to:
            raise CheckFailed(
                f"the JWT file {path} is readable by {exposed_to} (mode {mode:o}); chmod 600 {path}"
            )
        body = await self._rest(f"/slurm/{API_VERSION}/partitions/")
        for part in body.get("partitions") or []:
            nodes = (part.get("nodes") or {}).get("configured") or ""
            self.slurm_nodes[part.get("name", "")] = hostlist.expand(nodes) if nodes else []
            alternate = part.get("alternate")
            if isinstance(alternate, str) and alternate:
                self.slurm_alternates[part.get("name", "")] = alternate
        missing = sorted(set(self.cfg.partitions) - set(self.slurm_nodes))
        if missing:
            raise CheckFailed(f"bridged partition(s) {', '.join(missing)} do not exist in Slurm (slurm.conf)")
        expiry = jwt_expiry(path.read_text().strip().removeprefix("SLURM_JWT="))
        left = None if expiry is None else expiry - int(time.time())
        note = "no expiry in the token" if left is None else f"token valid for {left // 3600} h more"
        if left is not None and left < TOKEN_WARN_S:
            note += " (renew it soon: the daemon re-reads the file, no restart needed)"
        return f"slurmrestd {slurm.rest_url} accepts the token; {note}"

    async def check_pyslurm(self) -> str:
        try:
            import pyslurm
        except ImportError as error:
            raise CheckFailed(
                f"pyslurm is not importable ({error}); build it against this Slurm "
                '(containers/pyslurm/build.sh) or use backend = "rest"'
            ) from None
        return f"pyslurm {getattr(pyslurm, '__version__', '?')} imported"

    async def check_job_submit(self) -> str:
        conf = self.slurm_conf
        if conf is None or not conf.exists():
            raise CheckFailed(f"slurm.conf not found at {conf}; pass --slurm-conf or set SLURM_CONF")
        text = conf.read_text()
        plugins = [
            line.split("=", 1)[1]
            for line in text.splitlines()
            if line.strip().lower().startswith("jobsubmitplugins=")
        ]
        if not any("lua" in p for p in plugins):
            raise CheckFailed(
                f"{conf} lacks JobSubmitPlugins=lua: bridged jobs would not be checked at submission"
            )
        lua = conf.parent / "job_submit.lua"
        if not lua.exists() and OwnPod.from_environment() is not None:
            # A pod has slurm.conf (for libslurm) but not slurmctld's directory.
            return ("JobSubmitPlugins=lua set; job_submit.lua is on the slurmctld host, not in this "
                    "pod: run `slurm-k8s-bridge doctor` there to check it")
        if not lua.exists() or wellknown.JOB_SUBMIT_LUA_SIGNATURE not in lua.read_text():
            raise CheckFailed(
                f"{lua} is not the bridge's job_submit.lua (copy deploy/slurm/job_submit.lua there)"
            )
        settings = conf.parent / "job_submit_bridge.conf"
        if not settings.exists():
            raise CheckFailed(
                f"{settings} is missing: write it with "
                f"`slurm-k8s-bridge job-submit-conf -c CONFIG > {settings}`"
            )
        listed = {
            line.split("=", 1)[1].split()[0]
            for line in settings.read_text().splitlines()
            if line.startswith("partition=")
        }
        if listed != set(self.cfg.partitions):
            raise CheckFailed(
                f"{settings} bridges {sorted(listed)} but the config bridges "
                f"{sorted(self.cfg.partitions)}: regenerate it with job-submit-conf"
            )
        return f"{lua} and {settings.name} in place"

    async def check_waiter(self) -> str:
        command = self.cfg.waiter.attach_command
        if OwnPod.from_environment() is not None:
            return f"the waiter runs on the slurmd hosts, not in this pod: run doctor there ({command})"
        program = attach_command_files(command)[0]
        install = f"as root, from the bridge's source: deploy/slurm/install-waiter.sh {program}"
        problems = waiter_install_problems(command, ca_file=self.cfg.waiter.ca_file)
        if problems:
            raise CheckFailed(f"waiter.attach_command {command!r}: {'; '.join(problems)}. "
                              f"Install it {install}")
        if not Path(program).exists():
            # Not a failure: doctor also runs where no slurmd does (an image, another host).
            return (f"{program} not on this host: install it on every host of a bridged slurmd "
                    f"({install}) and run doctor there")
        return f"{command} is in place: a static program, root-owned, writable by root only"

    async def check_munge(self) -> str:
        if shutil.which("munge") is None:
            return "munge not on this host's PATH; skipped the round trip (waiters encode on the slurmds)"
        credential = subprocess.run(["munge", "-n"], capture_output=True, text=True, timeout=10)
        if credential.returncode != 0:
            raise CheckFailed(f"munge -n failed: {credential.stderr.strip()} (is munged running?)")
        decoded = subprocess.run(
            [*self.cfg.waiter.unmunge_command],
            input=credential.stdout,
            capture_output=True,
            text=True,
            timeout=10,
        )
        if decoded.returncode != 0:
            raise CheckFailed(
                f"{' '.join(self.cfg.waiter.unmunge_command)} cannot decode: {decoded.stderr.strip()}"
            )
        return "munge credentials round-trip"

    # -- Kubernetes ----------------------------------------------------------------
    async def check_kubernetes(self) -> str:
        kube = self.cfg.kube
        api = await make_api_client(str(kube.kubeconfig) if kube.kubeconfig else None, context=kube.context)
        try:
            version = await request_json(api, "GET", "/version", "read the API server version")
            denied = []
            own = OwnPod.from_environment() if self.cfg.leader.enabled else None
            own_namespace = own.namespace if own else None
            dra = any(p.gpu_mode == "dra" for p in self.cfg.partitions.values())
            workloads = bool(self.cfg.workloads.namespaces)
            for verb, group, resource, namespace in needed_access(self.cfg.namespace, own_namespace, dra,
                                                                  workloads):
                resource_name, _, sub = resource.partition("/")
                attributes = {"verb": verb, "group": group, "resource": resource_name, "subresource": sub}
                if resource_name == "namespaces":
                    attributes["name"] = self.cfg.namespace
                if namespace:
                    attributes["namespace"] = namespace
                review = await request_json(
                    api,
                    "POST",
                    "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                    "review access",
                    body={
                        "apiVersion": "authorization.k8s.io/v1",
                        "kind": "SelfSubjectAccessReview",
                        "spec": {"resourceAttributes": attributes},
                    },
                )
                if not (review.get("status") or {}).get("allowed"):
                    where = f" in namespace {namespace}" if namespace else " (cluster-wide)"
                    denied.append(f"{verb} {resource}{where}")
            if denied:
                raise CheckFailed(
                    "RBAC: the bridge may not "
                    + "; ".join(denied)
                    + ". Install the Helm chart deploy/helm/slurm-k8s-bridge (its Roles and ClusterRole)"
                    " or grant these verbs"
                )
            nodes = await request_json(api, "GET", "/api/v1/nodes", "list nodes")
            # Managed namespaces: what the pods Slurm does not place (DaemonSets) hold on the nodes.
            running = await request_json(api, "GET", "/api/v1/pods?fieldSelector=status.phase%3DRunning",
                                         "list pods") if self.cfg.workloads.namespaces else {}
        except BridgeError as error:
            raise CheckFailed(f"Kubernetes: {error}") from None
        finally:
            await api.close()
        self.k8s_nodes = {n["metadata"]["name"]: n for n in nodes.get("items") or []}
        self.k8s_running_pods: list[dict] = running.get("items") or []
        return f"API server {version.get('gitVersion', '?')} reachable, RBAC sufficient"

    async def check_node_mapping(self) -> str:
        if not self.slurm_nodes or not hasattr(self, "k8s_nodes"):
            raise CheckFailed("skipped: needs the Slurm and Kubernetes checks to pass first")
        problems, count = [], 0
        for name, part in sorted(self.cfg.partitions.items()):
            by_label = {}
            if part.node_label:
                by_label = {
                    n["metadata"].get("labels", {}).get(part.node_label): k for k, n in self.k8s_nodes.items()
                }
            for slurm_node in self.slurm_nodes.get(name, []):
                count += 1
                k8s_name = by_label.get(slurm_node) if part.node_label else slurm_node
                node = self.k8s_nodes.get(k8s_name or "")
                if node is None:
                    problems.append(
                        f"Slurm node {slurm_node} (partition {name}) has no Kubernetes node"
                        + (f" labelled {part.node_label}={slurm_node}" if part.node_label else "")
                    )
                    continue
                taints = node.get("spec", {}).get("taints") or []
                if not any(t.get("key") == wellknown.TAINT_BRIDGED for t in taints):
                    problems.append(
                        f"Kubernetes node {k8s_name} lacks the taint {wellknown.TAINT_BRIDGED}"
                        f"=true:NoSchedule (kubectl taint node {k8s_name} "
                        f"{wellknown.TAINT_BRIDGED}=true:NoSchedule)"
                    )
        if problems:
            raise CheckFailed(
                "; ".join(problems[:10]) + (f" (and {len(problems) - 10} more)" if len(problems) > 10 else "")
            )
        return f"{count} bridged Slurm nodes each have a tainted Kubernetes twin"

    async def check_node_health(self) -> str:
        """Slurm node states against their Kubernetes twins, as the daemon's node sync sees them
        (a NotReady node counts as past its grace: doctor has no history)."""
        if not hasattr(self, "k8s_nodes") or self.cfg.slurm.backend != "rest":
            raise CheckFailed("skipped: needs the rest backend and the Kubernetes check to pass first")
        body = await self._rest(f"/slurm/{API_VERSION}/nodes/")
        problems, held, count = [], [], 0
        for raw in body.get("nodes") or []:
            parts = [p for p in raw.get("partitions") or [] if p in self.cfg.partitions]
            if not parts:
                continue
            count += 1
            slurm = read_slurm_node(str(raw.get("name")), raw.get("state") or [], raw.get("reason"), parts)
            labels = [self.cfg.partitions[p].node_label for p in parts if self.cfg.partitions[p].node_label]
            twin_name = slurm.name
            if labels:
                twin_name = next(
                    (k for k, n in self.k8s_nodes.items()
                     if (n["metadata"].get("labels") or {}).get(labels[0]) == slurm.name),
                    slurm.name,
                )
            twin_obj = self.k8s_nodes.get(twin_name)
            tolerations = [t for p in parts for t in self.cfg.partitions[p].tolerations]
            health = nodehealth.assess(
                nodehealth.kube_node(twin_obj) if twin_obj else None, twin_name,
                not_ready_for_s=float("inf"), grace_s=self.cfg.nodes.not_ready_grace_s,
                tolerations=tolerations,
            )
            problem = nodehealth.disagreement(slurm, health)
            if problem:
                problems.append(problem)
            elif slurm.out and not slurm.set_by_bridge:
                held.append(f"{slurm.name} ({slurm.reason or 'no reason'})")
        if problems:
            more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
            raise CheckFailed(
                "Slurm and Kubernetes disagree (is the daemon running and leading?): "
                + "; ".join(problems[:10]) + more
            )
        note = f"; held out in Slurm by an admin: {', '.join(held[:10])}" if held else ""
        return f"{count} bridged Slurm nodes agree with their Kubernetes nodes{note}"

    async def check_partition_boundaries(self) -> str:
        if not self.slurm_nodes:
            return "not checked: the partitions are read through slurmrestd (backend rest) only"
        problems = partition_boundary_problems(self.slurm_nodes, self.slurm_alternates, self.cfg.partitions)
        if problems:
            raise CheckFailed("; ".join(problems))
        return "no bridged node is in a non-bridged partition; no Alternate crosses the boundary"

    async def check_gpus(self) -> str:
        """How each partition's GPUs reach its pods: under `dra`, every GRES GPU of every bridged
        node maps to exactly one device its ResourceSlices publish; `env` is trusted only with a
        warning (it needs the NVIDIA toolkit's insecure default)."""
        if not hasattr(self, "k8s_nodes") or self.cfg.slurm.backend != "rest":
            raise CheckFailed("skipped: needs the rest backend and the Kubernetes check to pass first")
        nodes = (await self._rest(f"/slurm/{API_VERSION}/nodes/")).get("nodes") or []
        slices: list[SliceView] = []
        if any(p.gpu_mode == "dra" for p in self.cfg.partitions.values()):
            kube = self.cfg.kube
            config = str(kube.kubeconfig) if kube.kubeconfig else None
            api = await make_api_client(config, context=kube.context)
            try:
                body = await request_json(api, "GET", SLICES_PATH, "list resourceslices")
            except BridgeError as error:
                raise CheckFailed(f"Kubernetes: {error}") from None
            finally:
                await api.close()
            slices = [trim_slice(item) for item in body.get("items") or []]
        gres = {str(n.get("name")): (str(n.get("gres") or ""), list(n.get("partitions") or []))
                for n in nodes}
        problems, notes = gpu_problems(self.cfg.partitions, gres, slices)
        if problems:
            raise CheckFailed("; ".join(problems[:10]) + (f" (and {len(problems) - 10} more)"
                                                          if len(problems) > 10 else ""))
        return "; ".join(notes) or "no bridged partition has GPUs"

    async def check_workloads(self) -> str:
        """Managed namespaces: their partitions' nodes admit what Slurm gives their pods."""
        managed = self.cfg.workloads.namespaces
        if not managed:
            return "no managed namespace"
        if not hasattr(self, "k8s_nodes") or self.cfg.slurm.backend != "rest":
            raise CheckFailed("skipped: needs the rest backend and the Kubernetes check to pass first")
        partitions = {p for m in managed.values() for p in (m.partition, *m.partitions)}
        nodes = (await self._rest(f"/slurm/{API_VERSION}/nodes/")).get("nodes") or []
        notes = capacity_notes(partitions, nodes, self.k8s_nodes, not_slurms(self.k8s_running_pods))
        summary = f"{len(managed)} managed namespace(s) on partitions {', '.join(sorted(partitions))}"
        return "; ".join([summary, *notes])

    async def run(self) -> list[Result]:
        checks: list[tuple[str, Callable[[], Awaitable[str]]]] = [
            ("config", self.check_config),
            ("slurm", self.check_slurm),
            ("job_submit.lua", self.check_job_submit),
            ("waiter", self.check_waiter),
            ("munge", self.check_munge),
            ("kubernetes", self.check_kubernetes),
            ("node mapping", self.check_node_mapping),
            ("node health", self.check_node_health),
            ("partition boundaries", self.check_partition_boundaries),
            ("gpus", self.check_gpus),
            ("workloads", self.check_workloads),
        ]
        results = []
        for name, check in checks:
            try:
                results.append(Result(name, True, await check()))
            except CheckFailed as problem:
                results.append(Result(name, False, str(problem)))
            except (TimeoutError, OSError, BridgeError) as error:
                results.append(Result(name, False, f"{type(error).__name__}: {error}"))
        return results


def partition_boundary_problems(
    nodes: Mapping[str, list[str]], alternates: Mapping[str, str], bridged: Collection[str]
) -> list[str]:
    """Slurm configurations that would run a user's script natively on a bridged slurmd: a bridged
    node that is also in a non-bridged partition, and an Alternate across the boundary (the step
    guard refuses such a script, and Slurm then drains the node)."""
    bridged_nodes = {node for part in bridged for node in nodes.get(part, [])}
    problems = []
    for part, members in sorted(nodes.items()):
        shared = [node for node in members if node in bridged_nodes]
        if part not in bridged and shared:
            problems.append(
                f"partition {part} is not bridged but holds bridged node(s) {hostlist.compress(shared)}: "
                "its jobs would run natively on the bridged slurmd (beside slurmctld); give it other nodes"
            )
    for part, alternate in sorted(alternates.items()):
        if (part in bridged) != (alternate in bridged):
            problems.append(
                f"partition {part} has Alternate={alternate} across the bridged/non-bridged line: "
                "job_submit.lua refuses its jobs; set Alternate within the same kind"
            )
    return problems


def run_doctor(cfg: BridgeConfig, slurm_conf: str | None) -> int:
    conf = Path(slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    results = asyncio.run(Doctor(cfg, conf).run())
    for result in results:
        print(f"{'ok  ' if result.ok else 'FAIL'} {result.name:15} {result.message}")
    failed = [r for r in results if not r.ok]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed" if failed else "all checks passed")
    return 1 if failed else 0
