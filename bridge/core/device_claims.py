"""GPUs by Dynamic Resource Allocation (the `dra` GPU mode), pure: which devices a node's
ResourceSlices publish, which of them Slurm's GRES indices name, the pod's claim and the allocation
the bridge writes into it, and which claims already hold a device.

The bridge places pods itself (Slurm chose the node), so no scheduler allocates their claims: the
bridge writes the allocation and the reservation for the pod, as kube-scheduler would, before it
binds the pod. The kubelet then has the driver prepare exactly those devices and the runtime inject
them through CDI. docs/architecture.md § GPUs by DRA says why this way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bridge.core import wellknown
from bridge.core.errors import PermanentError

RESOURCE_API = "resource.k8s.io/v1"


class DeviceMappingError(PermanentError, ValueError):
    """Slurm's GRES indices do not name exactly one published device each on a node."""


@dataclass(frozen=True)
class PublishedDevice:
    """One device of a ResourceSlice: where it is (driver, pool) and what it says of itself."""

    driver: str
    pool: str
    name: str
    attributes: Mapping[str, object]
    """Attribute name -> its value (int, str, bool or version str); names in the driver's own domain
    without it (`index`), others qualified (`resource.kubernetes.io/pciBusID`)."""

    @property
    def key(self) -> tuple[str, str, str]:
        return self.driver, self.pool, self.name


@dataclass(frozen=True)
class SliceView:
    """A ResourceSlice trimmed to what the mapping reads."""

    name: str
    driver: str
    node: str
    pool: str
    generation: int
    slice_count: int
    """How many slices the pool's generation has (resourceSliceCount)."""
    devices: tuple[PublishedDevice, ...]


def trim_slice(obj: Mapping[str, Any]) -> SliceView:
    spec = obj.get("spec") or {}
    driver = str(spec.get("driver") or "")
    pool = spec.get("pool") or {}
    pool_name = str(pool.get("name") or "")
    devices = []
    for device in spec.get("devices") or ():
        attributes: dict[str, object] = {}
        for key, value in (device.get("attributes") or {}).items():
            bare = key.split("/", 1)[1] if key.startswith(f"{driver}/") else key
            for kind in ("int", "string", "bool", "version"):
                if isinstance(value, Mapping) and kind in value:
                    attributes[bare] = value[kind]
        devices.append(PublishedDevice(driver, pool_name, str(device.get("name") or ""), attributes))
    return SliceView(
        name=str((obj.get("metadata") or {}).get("name") or ""), driver=driver,
        node=str(spec.get("nodeName") or ""), pool=pool_name, generation=int(pool.get("generation") or 0),
        slice_count=int(pool.get("resourceSliceCount") or 1), devices=tuple(devices),
    )


def current_devices(slices: Iterable[SliceView]) -> list[PublishedDevice]:
    """The devices of the newest generation of each pool, once all its slices are in (a driver
    republishing a pool leaves the older generation's slices behind for a moment, and a pool of
    several slices arrives slice by slice): an incomplete pool gives no device yet."""
    newest: dict[str, int] = {}
    kept = list(slices)
    for piece in kept:
        newest[piece.pool] = max(newest.get(piece.pool, piece.generation), piece.generation)
    current = [piece for piece in kept if piece.generation == newest[piece.pool]]
    arrived: dict[str, int] = {}
    for piece in current:
        arrived[piece.pool] = arrived.get(piece.pool, 0) + 1
    return [d for piece in current if arrived[piece.pool] >= piece.slice_count for d in piece.devices]


PCI_BUS_ID_KEYS = ("resource.kubernetes.io/pciBusID", "pciBusID", "pcieBusID")
"""Where a driver publishes a device's PCI bus id: the standard attribute (KEP 4381), or one of
its own domain (NVIDIA's is `pcieBusID`)."""


def identity_of(device: PublishedDevice, identity: str) -> tuple[str, str, object] | None:
    """(attribute domain, name, value) that names `device` by `identity`; None if it has none."""
    if identity == "pciBusID":
        for key in PCI_BUS_ID_KEYS:
            value = device.attributes.get(key)
            if isinstance(value, str):
                domain, _, name = key.rpartition("/")
                return domain or device.driver, name, value.lower()
        return None
    value = device.attributes.get(identity)
    if isinstance(value, int) and not isinstance(value, bool):
        return device.driver, identity, value
    return None


def slurm_index_map(devices: Sequence[PublishedDevice], identity: str) -> dict[int, list[PublishedDevice]]:
    """Slurm GRES index -> the published devices it names (exactly one each when the mapping is
    right), by the partition's `dra_device_identity`. By `pciBusID`, index N is the N-th bus id in
    ascending order among whole GPUs (a `type` attribute other than `gpu`, e.g. a MIG slice sharing
    its parent's bus id, is left out); two devices on one bus id name the same index."""
    by_index: dict[int, list[PublishedDevice]] = {}
    if identity == "pciBusID":
        by_bus: dict[str, list[PublishedDevice]] = {}
        for device in devices:
            kind = device.attributes.get("type")
            named = identity_of(device, identity)
            if named is not None and (kind is None or kind == "gpu"):
                by_bus.setdefault(str(named[2]), []).append(device)
        for position, bus in enumerate(sorted(by_bus)):
            by_index[position] = by_bus[bus]
        return by_index
    for device in devices:
        named = identity_of(device, identity)
        if named is not None:
            by_index.setdefault(int(named[2]), []).append(device)  # type: ignore[call-overload]
    return by_index


def devices_for(
    indices: Sequence[int], devices: Sequence[PublishedDevice], identity: str, *, driver: str, node: str
) -> list[PublishedDevice]:
    """The published devices behind Slurm's GRES `indices` on `node`; DeviceMappingError names what
    is wrong (no slice, too few devices, an index that names none or two)."""
    if not devices:
        raise DeviceMappingError(
            f"node {node} publishes no devices of DRA driver {driver} (is the driver running there?)")
    by_index = slurm_index_map(devices, identity)
    chosen = []
    for index in indices:
        named = by_index.get(index, [])
        if not named:
            raise DeviceMappingError(
                f"Slurm gave GPU index {index} on {node}, but driver {driver} publishes no device with "
                f"{_identity_words(identity)} {index} there ({len(devices)} device(s) published)")
        if len(named) > 1:
            raise DeviceMappingError(
                f"GPU index {index} on {node} names {len(named)} devices of driver {driver} "
                f"({', '.join(sorted(d.name for d in named))}): the mapping by {identity} is ambiguous")
        chosen.append(named[0])
    return chosen


def _identity_words(identity: str) -> str:
    return "position by pciBusID" if identity == "pciBusID" else f"attribute {identity} ="


def claim_name(pod: str) -> str:
    return pod + wellknown.CLAIM_NAME_SUFFIX


def claim_manifest(
    pod: str, pod_uid: str, namespace: str, labels: Mapping[str, str], device_class: str,
    devices: Sequence[PublishedDevice], identity: str,
) -> dict[str, Any]:
    """The pod's claim, owned by the pod (the garbage collector deletes it with the pod, also when
    the daemon is gone). Its request asks for exactly these devices, so the spec says what the
    allocation holds."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {
            "name": claim_name(pod),
            "namespace": namespace,
            "labels": dict(labels),
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Pod", "name": pod, "uid": pod_uid,
                # No blockOwnerDeletion: it needs update on pods/finalizers where
                # OwnerReferencesPermissionEnforcement is on, and the pod's deletion need not wait.
                "controller": True,
            }],
        },
        "spec": {"devices": {"requests": [{
            "name": wellknown.POD_CLAIM_NAME,
            "exactly": {
                "deviceClassName": device_class,
                "allocationMode": "ExactCount",
                "count": len(devices),
                "selectors": [{"cel": {"expression": _selector(identity, devices)}}],
            },
        }]}},
    }


def _selector(identity: str, devices: Sequence[PublishedDevice]) -> str:
    """CEL naming exactly `devices` by the attribute they were mapped by."""
    named = [identity_of(device, identity) for device in devices]
    domain, name = (named[0][0], named[0][1]) if named[0] else (devices[0].driver, identity)
    values = [str(n[2]) if isinstance(n[2], int) else "'" + str(n[2]).replace("'", "") + "'"
              for n in named if n is not None]
    return f"device.attributes['{domain}'].{name} in [{', '.join(values)}]"


def claim_status(
    pod: str, pod_uid: str, node: str, devices: Sequence[PublishedDevice], requests: Sequence[str] = (),
) -> dict[str, Any]:
    """The allocation of exactly `devices` on `node`, reserved for the pod (what the kubelet checks
    before it asks the driver to prepare them). `requests`: the claim's request each device answers
    (the bridge's own claims have one, POD_CLAIM_NAME)."""
    names = list(requests) or [wellknown.POD_CLAIM_NAME] * len(devices)
    return {
        "allocation": {
            "devices": {"results": [
                {"request": request, "driver": d.driver, "pool": d.pool, "device": d.name}
                for d, request in zip(devices, names, strict=True)
            ]},
            "nodeSelector": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]},
        },
        "reservedFor": [{"resource": "pods", "name": pod, "uid": pod_uid}],
    }


def claim_pod(spec: dict[str, Any], container: dict[str, Any], annotations: dict[str, str], pod: str) -> None:
    """Make a pod manifest one that waits for its claim: no nodeName (the bridge binds it once the
    claim is allocated, so the kubelet never sees the pod before its devices), the bridge's
    schedulerName (kube-scheduler leaves it alone), and the claim in the container's resources."""
    annotations[wellknown.ANNOTATION_KUBE_NODE] = spec.pop("nodeName")
    spec["schedulerName"] = wellknown.SCHEDULER_NAME
    spec["resourceClaims"] = [{"name": wellknown.POD_CLAIM_NAME, "resourceClaimName": claim_name(pod)}]
    container.setdefault("resources", {})["claims"] = [{"name": wellknown.POD_CLAIM_NAME}]


@dataclass(frozen=True)
class ClaimRequest:
    """One request of a claim's spec, as far as the bridge honours it."""

    name: str
    device_class: str
    """"" for a request of alternatives (firstAvailable), which the bridge does not choose among."""
    count: int
    """ExactCount's count; 0 for allocationMode All."""
    admin_access: bool
    unhonoured: tuple[str, ...] = ()
    """What else it asks that Slurm's choice of devices cannot honour (selectors, tolerations,
    capacity)."""


@dataclass(frozen=True)
class ClaimView:
    """A ResourceClaim trimmed to who holds what."""

    namespace: str
    name: str
    uid: str
    owner_pod_uid: str
    """The uid of the pod that controls it ("" for none)."""
    ours: bool
    """Labelled as the bridge's."""
    cluster: str
    """Its Slurm cluster label (bridges of two clusters may share a namespace)."""
    devices: frozenset[tuple[str, str, str]]
    """(driver, pool, device) of its allocation."""
    reserved_for: frozenset[str]
    deleting: bool
    requests: tuple[ClaimRequest, ...] = ()
    extras: tuple[str, ...] = ()
    """What else its spec asks that Slurm's choice of devices cannot honour (constraints, config)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def trim_claim(obj: Mapping[str, Any]) -> ClaimView:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    devices_spec = (obj.get("spec") or {}).get("devices") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or ()
    owners = meta.get("ownerReferences") or ()
    owner: Mapping[str, Any] = next((r for r in owners if r.get("kind") == "Pod" and r.get("controller")), {})
    return ClaimView(
        namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        owner_pod_uid=str(owner.get("uid") or ""),
        ours=(meta.get("labels") or {}).get(wellknown.LABEL_MANAGED_BY) == wellknown.MANAGER,
        cluster=str((meta.get("labels") or {}).get(wellknown.LABEL_CLUSTER) or ""),
        devices=frozenset((str(r.get("driver")), str(r.get("pool")), str(r.get("device"))) for r in results),
        reserved_for=frozenset(str(r.get("uid") or "") for r in status.get("reservedFor") or ()),
        deleting=bool(meta.get("deletionTimestamp")),
        requests=tuple(_request(r) for r in devices_spec.get("requests") or ()),
        extras=tuple(key for key in ("constraints", "config") if devices_spec.get(key)),
    )


def _request(request: Mapping[str, Any]) -> ClaimRequest:
    exactly = request.get("exactly") or {}
    mode = exactly.get("allocationMode") or "ExactCount"
    return ClaimRequest(
        name=str(request.get("name") or ""),
        device_class=str(exactly.get("deviceClassName") or "") if exactly else "",
        count=int(exactly.get("count") or 1) if mode == "ExactCount" else 0,
        admin_access=bool(exactly.get("adminAccess")),
        unhonoured=tuple(key for key in ("selectors", "tolerations", "capacity") if exactly.get(key)),
    )


def holders(
    wanted: Iterable[PublishedDevice], claims: Iterable[ClaimView], mine: str
) -> list[tuple[PublishedDevice, ClaimView]]:
    """Which of the `wanted` devices another claim than `mine` (namespace/name) holds already."""
    want = {d.key: d for d in wanted}
    found = []
    for claim in claims:
        if claim.key == mine:
            continue
        for key in claim.devices & want.keys():
            found.append((want[key], claim))
    return found
