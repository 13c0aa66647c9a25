"""Pod creation: a run's payload Secret and pods, made from the Slurm allocation and the waiter's
payload (core.translate), and a script too big for the Secret copied into the first pod.

Owns nothing but what it is given: create expectations (controller.expectations), the payload
Secrets (controller.payload_secrets), the job users' groups and the nodes' policies. Called by the
reconciler, which fails the job with the reason `create` returns.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from bridge.clients.identity import SupplementalGroups
from bridge.clients.kube.actions import KubeActions
from bridge.clients.kube.errors import KubeRejected
from bridge.clients.kube.node_features import StrictGroupsNodes
from bridge.clients.kube.nodes import NodeCache
from bridge.controller.expectations import CreateExpectations
from bridge.controller.metrics import Metrics
from bridge.controller.payload_secrets import PayloadSecrets
from bridge.controller.refusals import judge_refusal
from bridge.controller.sessions import JobSession
from bridge.core import agent_protocol
from bridge.core.config import BridgeConfig, PartitionConfig
from bridge.core.directives import DirectiveError, parse_directives
from bridge.core.errors import BridgeError, TemporaryError
from bridge.core.model import JobAllocation
from bridge.core.pod_view import PodView
from bridge.core.rendezvous import pods_to_create
from bridge.core.translate import TranslateError, desired_objects, kubernetes_node_names


class PodCreation:
    def __init__(
        self, cfg: BridgeConfig, kube: KubeActions, metrics: Metrics, expectations: CreateExpectations,
        payload_secrets: PayloadSecrets, nodes: NodeCache | None,
    ) -> None:
        self.cfg = cfg
        self._kube = kube
        self._metrics = metrics
        self._expectations = expectations
        self._payload_secrets = payload_secrets
        self.nodes = nodes
        """The node watch's cache (maps Slurm nodes by label without listing the cluster)."""
        self.groups = SupplementalGroups(cfg.pods.supplemental_groups)
        """The job user's supplementary groups, from Slurm's user name via NSS (cached)."""
        self.strict_groups = StrictGroupsNodes(lambda name: self._kube.get_node(name))
        """Nodes that enforce supplementalGroupsPolicy Strict (the `auto` policy asks)."""

    async def create(
        self, session: JobSession, alloc: JobAllocation, skip: set[str], bound: Any, first_pod_ip: str = "",
        first_pod_ended: bool = False,
    ) -> str | None:
        """Create the run's Secret and its pods but those named in `skip` (and those that wait for
        the first pod's address, `first_pod_ip`, unless it ended: core.rendezvous.pods_to_create);
        the reason the job fails, if it must (None: created, or created already)."""
        assert session.payload is not None
        part = self.cfg.partition(alloc.partition)
        if part is None:
            return f"partition {alloc.partition} is not bridged"
        k8s_nodes = await self.kubernetes_nodes(part)
        if session.user is None:
            session.user = await self.groups.resolve(alloc)
        resolved = session.user
        groups = self.groups.given(resolved)
        home = resolved.home
        try:
            strict: set[str] = set()
            if self.cfg.pods.supplemental_groups_policy == "auto":
                strict = await self.strict_groups.among(kubernetes_node_names(alloc, part, k8s_nodes))
            directives = parse_directives(session.payload.script)
            secret, manifests = desired_objects(
                alloc, session.payload, directives, part, self.cfg, k8s_nodes,
                supplemental_groups=groups, strict_groups_nodes=strict, home=home, account=resolved.account)
        except (DirectiveError, TranslateError) as error:
            return str(error)
        # First: the pods mount it and import its variables (the same every time: a restart that
        # creates the rest of the pods finds it there).
        secret_name = secret["metadata"]["name"]
        session.payload_secret = secret_name
        try:
            await self._payload_secrets.ensure(secret, bound)
        except KubeRejected as error:
            judge_refusal(session, error, bound)
            return f"Kubernetes refused the job's script and environment (Secret {secret_name}): {error}"
        manifests = [m for m in pods_to_create(manifests, alloc, part, first_pod_ip, first_pod_ended)
                     if m["metadata"]["name"] not in skip]
        names = [m["metadata"]["name"] for m in manifests]
        # Expected before the first request: its ADDED event may be applied before it returns.
        self._expectations.expect(names)
        for done, manifest in enumerate(manifests):
            try:
                created = await self._kube.create_pod(manifest)
            except KubeRejected as error:
                self._expectations.forget(names[done:])
                judge_refusal(session, error, bound)
                return f"Kubernetes refused the job's pod: {error}"
            except BaseException:
                self._expectations.forget(names[done:])
                raise
            if created:
                self._metrics.inc("pods_created_total")
                bound.info("pod.created", pod=manifest["metadata"]["name"],
                           node=manifest["spec"].get("nodeName"))
        session.forbidden_since = None  # a later 403 (a claim, the rest of the pods) is judged anew
        if not session.created and session.attached_at:
            self._metrics.observe("attach_to_pod_seconds", time.monotonic() - session.attached_at)
        session.created = True
        return None

    async def kubernetes_nodes_of(self, partition: str) -> Mapping[str, str] | None:
        """The Slurm → Kubernetes node names of a bridged partition (None: the same names)."""
        part = self.cfg.partition(partition)
        return None if part is None else await self.kubernetes_nodes(part)

    async def kubernetes_node_names_of(self, alloc: JobAllocation) -> list[str]:
        """The Kubernetes nodes of a run's pods; none when they cannot be named (create says why)."""
        part = self.cfg.partition(alloc.partition)
        if part is None:
            return []
        try:
            return kubernetes_node_names(alloc, part, await self.kubernetes_nodes(part))
        except (TranslateError, BridgeError):
            return []

    async def kubernetes_nodes(self, part: PartitionConfig) -> Mapping[str, str] | None:
        if part.node_label and self.nodes is not None and self.nodes.synced.is_set():
            return self.nodes.by_label(part.node_label)  # the node watch's index: no list
        if part.node_label:
            return await self._kube.nodes_by_label(part.node_label)
        return None

    async def deliver_script(self, session: JobSession, pods: list[PodView], bound: Any) -> None:
        """Copy a script too big for an annotation into the first pod, once it runs (the agent
        waits for it there)."""
        for pod in pods:
            if pod.script_delivery != "exec" or not pod.running or session.payload is None:
                continue
            data = session.payload.script.encode("utf-8", "surrogateescape")
            command = agent_protocol.receive_script_command(len(data))
            code = await self._kube.exec_with_input(pod.name, command, data)
            if code != 0:
                raise TemporaryError(f"copying the script into pod {pod.name} exited {code}")
            session.script_delivered = True
            bound.info("script.delivered", pod=pod.name, bytes=len(data))
