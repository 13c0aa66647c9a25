"""doctor's GPU check, pure: how each bridged partition's GPUs reach its pods.

- `dra`: every GRES GPU of every node of the partition must name exactly one device that the
  partition's driver publishes on that node (core.device_claims.slurm_index_map), or jobs given
  that index fail at their start.
- `env`: works only while the NVIDIA container toolkit honours NVIDIA_VISIBLE_DEVICES from
  unprivileged containers (`accept-nvidia-visible-devices-envvar-when-unprivileged = true`, its
  default). That default lets any pod on the node ask for every GPU by writing the variable
  (NVIDIA/gpu-operator#421): a warning, since a hardened node shows such pods no GPU at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bridge.core.config import PartitionConfig
from bridge.core.device_claims import SliceView, current_devices, slurm_index_map
from bridge.core.gres import gpu_count

ENV_MODE_WARNING = (
    "warning: gpu_mode \"env\" pins GPUs through NVIDIA_VISIBLE_DEVICES, which the NVIDIA toolkit honours "
    "only with accept-nvidia-visible-devices-envvar-when-unprivileged = true, a default that lets any pod "
    "take every GPU of its node; hardened nodes turn it off and the pods see no GPU: use gpu_mode \"dra\"")


def gpu_problems(
    partitions: Mapping[str, PartitionConfig], nodes: Mapping[str, tuple[str, Sequence[str]]],
    slices: Sequence[SliceView],
) -> tuple[list[str], list[str]]:
    """(problems, notes) for `nodes` (Slurm node -> (its configured gres, its partitions)); the
    Kubernetes node of a Slurm node is taken to be of the same name (node_label partitions are
    checked by the devices of the node of that name too)."""
    problems: list[str] = []
    notes: list[str] = []
    for name, part in sorted(partitions.items()):
        members = sorted((node, gpu_count(gres)) for node, (gres, parts) in nodes.items() if name in parts)
        gpus = sum(count for _, count in members)
        if part.gpu_mode == "env" and gpus:
            notes.append(f"partition {name}: {ENV_MODE_WARNING}")
        if part.gpu_mode != "dra" or not gpus:
            continue
        assert part.dra_driver is not None
        for node, count in members:
            devices = current_devices(s for s in slices if s.driver == part.dra_driver and s.node == node)
            if count and not devices:
                problems.append(f"partition {name}: node {node} has {count} GPU(s) in Slurm but driver "
                                f"{part.dra_driver} publishes no device there (is the driver running?)")
                continue
            by_index = slurm_index_map(devices, part.dra_device_identity)
            published = sum(len(named) for named in by_index.values())
            if published > count or (published != count and part.dra_device_identity == "pciBusID"):
                words = (f"partition {name}: node {node} publishes {published} GPU(s) of {part.dra_driver} "
                         f"named by {part.dra_device_identity}, Slurm counts {count}")
                if part.dra_device_identity == "pciBusID":
                    problems.append(words + ": positions by bus id would name GPUs other than Slurm's")
                    continue
                notes.append(f"warning: {words} (is gres.conf missing some?)")
            for index in range(count):
                named = by_index.get(index, [])
                if len(named) != 1:
                    problems.append(
                        f"partition {name}: GPU index {index} of node {node} names {len(named)} device(s) "
                        f"of {part.dra_driver} by {part.dra_device_identity} (exactly one needed; "
                        f"{len(devices)} published)")
        if not any(p.startswith(f"partition {name}:") for p in problems):
            notes.append(f"partition {name}: {gpus} GPU(s) on {len(members)} node(s) map to "
                         f"{part.dra_driver}'s devices by {part.dra_device_identity}")
    return problems, notes
