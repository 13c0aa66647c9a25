"""slurmrestd's per-node gres_detail strings give the GPU indices Slurm allocated."""

from __future__ import annotations

import pytest

from bridge.core.gres import GresError, gpu_indices, gpu_indices_per_node


@pytest.mark.parametrize(
    ("detail", "indices"),
    [
        ("gpu:2(IDX:0-1)", (0, 1)),
        ("gpu:tesla:1(IDX:3)", (3,)),
        ("gpu:4(IDX:0-3),nic:1(IDX:0)", (0, 1, 2, 3)),
        ("nic:1(IDX:0),gpu:1(IDX:5)", (5,)),
        ("gpu(IDX:0,2)", (0, 2)),
        ("gpu:a100:2(IDX:0-1),gpu:v100:1(IDX:4)", (0, 1, 4)),
        ("gpu:3(IDX:0,2-3)", (0, 2, 3)),
        ("gpu:0", ()),
        ("gpu:tesla:0", ()),
        ("", ()),
        ("nic:1(IDX:0)", ()),
        ("gpu:2(IDX:1,1-2)", (1, 2)),
    ],
)
def test_gpu_indices(detail: str, indices: tuple[int, ...]) -> None:
    assert gpu_indices(detail) == indices


@pytest.mark.parametrize(
    ("detail", "message"),
    [
        ("gpu:2(IDX:N/A)", "without indices"),
        ("gpu:1", "without indices"),
        ("gpu:2(IDX:1-x)", "bad GPU index"),
        ("gpu:2(IDX:3-1)", "bad GPU index range"),
        ("gpu:2(IDX:0-1", "unreadable"),
    ],
)
def test_gpu_indices_rejects_what_it_cannot_pin(detail: str, message: str) -> None:
    with pytest.raises(GresError, match=message):
        gpu_indices(detail)


@pytest.mark.parametrize(
    ("details", "count", "expected"),
    [
        (["gpu:1(IDX:0)", "gpu:1(IDX:1)"], 2, [(0,), (1,)]),
        ([], 3, [(), (), ()]),
        (None, 1, [()]),
        (["gpu:1(IDX:2)"], 2, [(2,), ()]),
    ],
)
def test_gpu_indices_per_node_pads_missing_nodes(
    details: list[str] | None, count: int, expected: list[tuple[int, ...]]
) -> None:
    assert gpu_indices_per_node(details, count) == expected


def test_gpu_indices_per_node_rejects_more_entries_than_nodes() -> None:
    with pytest.raises(GresError, match="2 gres_detail entries for 1 node"):
        gpu_indices_per_node(["gpu:1(IDX:0)", "gpu:1(IDX:1)"], 1)
