"""Kubernetes node health as Slurm node states. Pure: data in, data out.

A bridged node's slurmd runs beside slurmctld (or in a pod), not on the Kubernetes node, so it
keeps answering when the Kubernetes node dies, and Slurm keeps placing jobs there: `nodeName`
ignores cordons, and a pod bound to a dead node just stays Pending. The bridge therefore carries
the node's health over:

- NotReady or Unknown for longer than a grace period, or no Kubernetes node at all: DOWN. Slurm
  then ends the jobs running there as on any failed node (requeued, or NODE_FAIL).
- Cordoned (`spec.unschedulable`), or tainted NoSchedule/NoExecute with a taint the partition's
  pods do not tolerate: DRAIN. Running jobs finish, no new ones start.
- Healthy again: RESUME, but only a node the bridge itself took out, recognised by the reason
  prefix. A drain or down set by an admin (or by Slurm itself) is never overridden.

The other way round, a node an admin took out in Slurm shows that on its Kubernetes twin as the
condition SLURM_CONDITION, so kubectl users see why no Slurm job lands there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from bridge.core import wellknown
from bridge.core.fields import as_list, as_map, as_str, because

REASON_PREFIX: Final = "slurm-k8s-bridge:"
"""Start of every Slurm node reason the bridge sets; the bridge resumes only such nodes."""

SLURM_CONDITION: Final = "SlurmUnavailable"
"""Condition type on a Kubernetes node whose Slurm twin an admin (or Slurm) took out."""

# Taints Kubernetes itself sets from node conditions (not-ready, unreachable, unschedulable,
# memory-, disk- and pid-pressure, network-unavailable, out-of-service): NotReady and cordon are
# judged here on their own, and a pressure condition comes and goes with one job's use of a node
# (draining the node for everybody over it would flap with it).
_CONDITION_TAINT_PREFIX: Final = "node.kubernetes.io/"
_NOT_MANAGED_STATES: Final = frozenset({
    "FUTURE", "CLOUD", "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP", "POWER_DOWN", "REBOOT_REQUESTED",
    "REBOOT_ISSUED",
})
"""Slurm nodes in these states are not expected to have a live Kubernetes node (power saving,
future or rebooting nodes): the bridge leaves them to Slurm."""
OUT_OF_SERVICE_TAINT: Final = "node.kubernetes.io/out-of-service"
"""An operator's word that the node is shut down: its pods may be removed without a kubelet."""
REASON_MAX = 200
"""Slurm keeps a node reason in a 255-byte column (slurmdbd); Kubernetes text is cut to fit."""
_OUT_STATES: Final = frozenset({"DOWN", "DRAIN", "FAIL"})
"""Slurm node states (base or flag) that keep new jobs off the node."""

Verdict = Literal["ok", "drain", "down", "wait"]


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True)
class KubeNode:
    """What the bridge keeps of a Kubernetes node (a few hundred bytes, not the full object)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    ready: str = ""
    """Status of the Ready condition: "True", "False", "Unknown", or "" when it has none yet."""
    ready_reason: str = ""
    ready_message: str = ""
    slurm_condition: tuple[str, str, str] | None = None
    """(status, reason, message) of the SLURM_CONDITION condition, if the node has it."""


def kube_node(obj: Mapping[str, Any], label_keys: Iterable[str] | None = None) -> KubeNode:
    """Trim a Node API dict to a KubeNode; with `label_keys`, only those labels are kept."""
    meta = as_map(obj.get("metadata"))
    spec = as_map(obj.get("spec"))
    status = as_map(obj.get("status"))
    labels = {k: v for k, v in as_map(meta.get("labels")).items() if isinstance(v, str)}
    if label_keys is not None:
        wanted = set(label_keys)
        labels = {k: v for k, v in labels.items() if k in wanted}
    taints = tuple(
        Taint(as_str(t.get("key")), as_str(t.get("value")), as_str(t.get("effect")))
        for t in map(as_map, as_list(spec.get("taints")))
    )
    ready = ready_reason = ready_message = ""
    ours = None
    for cond in map(as_map, as_list(status.get("conditions"))):
        if cond.get("type") == "Ready":
            ready, ready_reason, ready_message = (
                as_str(cond.get("status")), as_str(cond.get("reason")), as_str(cond.get("message"))
            )
        elif cond.get("type") == SLURM_CONDITION:
            ours = (as_str(cond.get("status")), as_str(cond.get("reason")), as_str(cond.get("message")))
    return KubeNode(
        name=as_str(meta.get("name")), labels=labels, unschedulable=spec.get("unschedulable") is True,
        taints=taints, ready=ready, ready_reason=ready_reason, ready_message=ready_message,
        slurm_condition=ours,
    )


@dataclass(frozen=True)
class SlurmNode:
    """A bridged Slurm node as slurmctld reports it."""

    name: str
    states: frozenset[str]
    """Base state and flags, upper case: {"IDLE"}, {"IDLE", "DRAIN"}, {"DOWN", "NOT_RESPONDING"}."""
    reason: str = ""
    partitions: tuple[str, ...] = ()

    @property
    def set_by_bridge(self) -> bool:
        return self.reason.startswith(REASON_PREFIX)

    @property
    def out(self) -> bool:
        """Taking no new jobs by somebody's decision (down, drained or failed)."""
        return not self.states.isdisjoint(_OUT_STATES)


@dataclass(frozen=True)
class Health:
    verdict: Verdict
    why: str = ""
    recheck_in_s: float | None = None
    """For `wait`: when the grace period runs out and the node should be looked at again."""


def tolerated(taint: Taint, tolerations: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a pod with `tolerations` tolerates `taint` for good (Kubernetes' matching rules; a
    NoExecute toleration with tolerationSeconds only delays the eviction, so it does not count)."""
    for tol in tolerations:
        if tol.get("tolerationSeconds") is not None and taint.effect == "NoExecute":
            continue  # tolerated only for a while: the pods would be evicted
        effect = tol.get("effect") or ""
        if effect and effect != taint.effect:
            continue
        key = tol.get("key") or ""
        operator = tol.get("operator") or "Equal"
        if not key:
            if operator == "Exists":
                return True
            continue
        if key != taint.key:
            continue
        if operator == "Exists" or (tol.get("value") or "") == taint.value:
            return True
    return False


def assess(
    twin: KubeNode | None,
    twin_name: str,
    *,
    not_ready_for_s: float | None,
    grace_s: float,
    tolerations: Iterable[Mapping[str, Any]] = (),
) -> Health:
    """The verdict on one bridged node from its Kubernetes twin (None: there is none).

    `not_ready_for_s`: how long the bridge has seen the twin not Ready (None while it is Ready).
    `tolerations`: what the pods of the node's partitions tolerate, besides the bridged taint.
    """
    if twin is None:
        # A relabelling or a re-registered Node object is gone for a moment only: the same grace.
        waited = not_ready_for_s or 0.0
        if waited >= grace_s:
            return Health("down", f"no Kubernetes node {twin_name}")
        return Health("wait", f"no Kubernetes node {twin_name}", recheck_in_s=grace_s - waited)
    if twin.ready != "True":
        state = "NotReady" if twin.ready == "False" else "Unknown" if twin.ready else "not Ready yet"
        detail = because(twin.ready_reason, twin.ready_message)
        why = f"Kubernetes node {twin.name} is {state}" + (f" ({detail})" if detail else "")
        waited = not_ready_for_s or 0.0
        if waited >= grace_s:
            return Health("down", f"{why} for {waited:.0f}s")
        return Health("wait", why, recheck_in_s=grace_s - waited)
    if any(t.key == OUT_OF_SERVICE_TAINT for t in twin.taints):
        return Health("down", f"Kubernetes node {twin.name} is out of service ({OUT_OF_SERVICE_TAINT})")
    if twin.unschedulable:
        return Health("drain", f"Kubernetes node {twin.name} is cordoned")
    accepted = [*tolerations, {"key": wellknown.TAINT_BRIDGED, "operator": "Exists"}]
    for taint in twin.taints:
        if taint.effect not in ("NoSchedule", "NoExecute") or taint.key.startswith(_CONDITION_TAINT_PREFIX):
            continue
        if not tolerated(taint, accepted):
            return Health("drain", f"Kubernetes node {twin.name} has taint {taint}")
    return Health("ok")


@dataclass(frozen=True)
class NodeUpdate:
    """One `scontrol update nodename=<node> state=<state> [reason=<reason>]`."""

    node: str
    state: Literal["DOWN", "DRAIN", "RESUME"]
    reason: str = ""


def plan_updates(
    slurm: SlurmNode, health: Health, *, drain_with_down: bool = False, downed: bool = False
) -> list[NodeUpdate]:
    """The Slurm updates that make `slurm` match `health`; none while an admin's state holds.

    `drain_with_down`: also DRAIN a node set DOWN. Under ReturnToService=2 slurmctld returns a
    DOWN node to service as soon as its slurmd answers, and a bridged node's slurmd always does
    (it runs beside slurmctld); only DRAIN then keeps new jobs off. The caller sets it once it has
    seen one of its DOWN nodes come back while its Kubernetes node was still unhealthy.
    `downed`: the bridge has set this node DOWN before (and not seen it healthy since).
    """
    if health.verdict == "wait" or not slurm.states.isdisjoint(_NOT_MANAGED_STATES):
        return []
    if slurm.out and not slurm.set_by_bridge:
        return []  # an admin's (or Slurm's own) decision: never overridden
    down, drain = "DOWN" in slurm.states, "DRAIN" in slurm.states
    ours = slurm.set_by_bridge
    reason = slurm_reason(health.why)
    if health.verdict == "down":
        if drain_with_down:
            # DRAIN first, so no job starts in between; a registration that lifts DOWN later leaves
            # the DRAIN, which is enough from then on (DOWN again would kill nothing new).
            if ours and drain and (down or downed):
                return []  # DOWN once (its jobs ended); a registration may lift DOWN, DRAIN holds
            if ours and drain:
                return [NodeUpdate(slurm.name, "DOWN", reason)]  # drained for a cordon, now dead
            return [NodeUpdate(slurm.name, "DRAIN", reason), NodeUpdate(slurm.name, "DOWN", reason)]
        return [] if down and ours else [NodeUpdate(slurm.name, "DOWN", reason)]
    if health.verdict == "drain":
        if ours and drain and not down:
            return []
        if ours and down:
            # Only RESUME clears DOWN; the DRAIN right after keeps jobs off in between.
            return [NodeUpdate(slurm.name, "RESUME"), NodeUpdate(slurm.name, "DRAIN", reason)]
        return [NodeUpdate(slurm.name, "DRAIN", reason)]
    return [NodeUpdate(slurm.name, "RESUME")] if ours and (down or drain) else []


def slurm_reason(why: str) -> str:
    """The bridge's node reason: its prefix, then `why` on one line, cut to fit Slurm's column."""
    flat = "".join(ch if ch.isprintable() else " " for ch in why)
    text = f"{REASON_PREFIX} {flat}"
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


def after(slurm: SlurmNode, updates: Iterable[NodeUpdate]) -> SlurmNode:
    """The node as Slurm will show it once `updates` are applied (until the next poll says)."""
    states, reason = set(slurm.states), slurm.reason
    for update in updates:
        if update.state == "RESUME":
            states -= {"DOWN", "DRAIN", "FAIL"}
            if not states & {"ALLOCATED", "MIXED"}:
                states.add("IDLE")
            reason = ""
        else:
            states.add(update.state)
            reason = update.reason
    return SlurmNode(slurm.name, frozenset(states), reason, slurm.partitions)


def wanted_condition(slurm: SlurmNode | None) -> tuple[str, str, str]:
    """(status, reason, message) of SLURM_CONDITION for a twin of `slurm`: True while somebody
    other than the bridge keeps the node out in Slurm."""
    if slurm is None or not slurm.out or slurm.set_by_bridge:
        return ("False", "SlurmNodeAvailable", "")
    state = "DOWN" if "DOWN" in slurm.states else "FAIL" if "FAIL" in slurm.states else "DRAIN"
    reason = {"DOWN": "SlurmNodeDown", "FAIL": "SlurmNodeFailed"}.get(state, "SlurmNodeDrained")
    why = "".join(ch if ch.isprintable() else " " for ch in slurm.reason)[:REASON_MAX] or "no reason given"
    return ("True", reason, f"Slurm node {slurm.name} is {state}: {why}")


def condition_needs_update(twin: KubeNode, wanted: tuple[str, str, str]) -> bool:
    """A twin without the condition needs it only once it would say True."""
    if twin.slurm_condition is None:
        return wanted[0] == "True"
    return twin.slurm_condition != wanted


def disagreement(slurm: SlurmNode, health: Health) -> str | None:
    """What `doctor` says about a node whose Slurm state does not follow its Kubernetes twin
    (None when they agree, or an admin's Slurm state deliberately holds)."""
    if health.verdict == "wait" or not plan_updates(slurm, health):
        return None
    shown = "+".join(sorted(slurm.states)) or "?"
    if health.verdict == "ok":
        return f"{slurm.name}: Slurm {shown} ({slurm.reason}) but its Kubernetes node is healthy"
    return f"{slurm.name}: Slurm {shown} but {health.why} (the bridge would set {health.verdict.upper()})"
