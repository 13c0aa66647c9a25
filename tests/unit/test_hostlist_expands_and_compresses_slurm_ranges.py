"""Slurm hostlist expressions expand to host names and compress back."""

from __future__ import annotations

import pytest

from bridge.core.hostlist import HostlistError, compress, expand


@pytest.mark.parametrize(
    ("expr", "hosts"),
    [
        ("a", ["a"]),
        ("a,b", ["a", "b"]),
        (" a , b ", ["a", "b"]),
        ("", []),
        ("node[1-3,7]", ["node1", "node2", "node3", "node7"]),
        ("node[1-3,7],gpu[01-02]", ["node1", "node2", "node3", "node7", "gpu01", "gpu02"]),
        ("ksim[0001-0003]", ["ksim0001", "ksim0002", "ksim0003"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[0-1]", ["n0", "n1"]),
        ("n[5]", ["n5"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
        ("n[2,1,2]", ["n2", "n1", "n2"]),
    ],
)
def test_expand(expr: str, hosts: list[str]) -> None:
    assert expand(expr) == hosts


@pytest.mark.parametrize(
    "expr",
    ["n[1-", "n1-2]", "n[[1]]", "n[a-b]", "n[3-1]", "n[1-]", "n[]", "n[1-100000]", "n o", "n[\u0661]"],
)
def test_expand_rejects_malformed(expr: str) -> None:
    with pytest.raises(HostlistError):
        expand(expr)


@pytest.mark.parametrize(
    ("hosts", "expr"),
    [
        ([], ""),
        (["a"], "a"),
        (["a", "b"], "a,b"),
        (["node7"], "node7"),
        (["node1", "node2", "node3", "node7"], "node[1-3,7]"),
        (["ksim0001", "ksim0002", "ksim0016"], "ksim[0001-0002,0016]"),
        (["n09", "n10", "n11"], "n[09-11]"),
        (["n9", "n10"], "n[9-10]"),
        (["n1", "n01"], "n1,n01"),
        (["gpu01", "gpu02", "node1"], "gpu[01-02],node1"),
        (["node3", "node1", "node2", "node1"], "node[1-3]"),
        (["a", "node1", "b", "node2"], "a,node[1-2],b"),
    ],
)
def test_compress(hosts: list[str], expr: str) -> None:
    assert compress(hosts) == expr


@pytest.mark.parametrize(
    "hosts",
    [
        ["ksim0001", "ksim0002", "ksim0003", "ksim0010"],
        [f"n{i:02d}" for i in range(1, 17)],
        ["gpu1", "gpu2", "cpu7", "login"],
        ["n8", "n9", "n10", "n11"],
    ],
)
def test_compress_round_trips_sorted_lists(hosts: list[str]) -> None:
    assert expand(compress(hosts)) == hosts
