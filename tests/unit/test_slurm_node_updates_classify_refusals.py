"""RestSlurmClient's node verbs read slurmrestd's `errors`: a refusal that retrying cannot cure
(unknown node, no permission) is a PermanentError, anything else a SlurmUnavailable to retry; a
node listing with errors is never taken for "nothing changed". slurmrestd is faked at _request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bridge.clients.slurm import rest
from bridge.clients.slurm.rest import API_VERSION, RestSlurmClient, SlurmNodeRefused, SlurmRequestFailed
from bridge.core.errors import PermanentError, SlurmUnavailable, TemporaryError
from bridge.core.nodehealth import SlurmNode


class FakeRest:
    """Answers every request with `answer` (a body, or an exception to raise) and records it."""

    def __init__(self, answer: dict[str, Any] | Exception) -> None:
        self.answer = answer
        self.requests: list[tuple[str, str, dict[str, Any]]] = []

    async def __call__(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        self.requests.append((method, path, kwargs))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def client(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, answer: dict[str, Any] | Exception) -> tuple[
    RestSlurmClient, FakeRest
]:
    token = tmp_path / "jwt"
    token.write_text("SLURM_JWT=t\n")
    slurm = RestSlurmClient("http://127.0.0.1:6820/", "slurm", token)
    fake = FakeRest(answer)
    monkeypatch.setattr(slurm, "_request", fake)
    return slurm, fake


def errors(description: str, number: int = 2000) -> dict[str, Any]:
    return {"errors": [{"description": description, "error_number": number, "error": description,
                        "source": "slurm_update_node"}]}


def failed(body: dict[str, Any]) -> SlurmRequestFailed:
    return SlurmRequestFailed("POST", f"/slurm/{API_VERSION}/node/kube1", 500, body)


NODE_PATH = f"/slurm/{API_VERSION}/node/kube1"


# -- update_node ------------------------------------------------------------------------------


async def test_an_update_is_posted_with_its_state_and_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    slurm, fake = client(monkeypatch, tmp_path, {"errors": [], "warnings": []})

    await slurm.update_node("kube1", "DRAIN", "slurm-k8s-bridge: cordoned")
    await slurm.update_node("kube1", "RESUME")

    assert fake.requests == [
        ("POST", NODE_PATH, {"json": {"state": ["DRAIN"], "reason": "slurm-k8s-bridge: cordoned"}}),
        ("POST", NODE_PATH, {"json": {"state": ["RESUME"]}}),
    ]


REFUSALS = [
    "Invalid node name specified",
    "Access denied",
    "Access/permission denied",
    "User does not have permission (operator required)",
    "Node kube1 not found",
]


@pytest.mark.parametrize("description", REFUSALS)
@pytest.mark.parametrize("how", ["in the answer", "in a 5xx answer"])
async def test_a_refused_update_is_permanent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, description: str, how: str
) -> None:
    body = errors(description)
    slurm, _ = client(monkeypatch, tmp_path, body if how == "in the answer" else failed(body))

    with pytest.raises(SlurmNodeRefused) as caught:
        await slurm.update_node("kube1", "DOWN", "slurm-k8s-bridge: gone")

    assert isinstance(caught.value, PermanentError)
    assert not isinstance(caught.value, TemporaryError)
    assert "kube1" in str(caught.value) and "DOWN" in str(caught.value)


@pytest.mark.parametrize(
    "description", ["Unable to contact slurm controller (connect failure)", "Socket timed out on send/recv"]
)
@pytest.mark.parametrize("how", ["in the answer", "in a 5xx answer"])
async def test_any_other_error_is_worth_a_retry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, description: str, how: str
) -> None:
    body = errors(description, 1007)
    slurm, _ = client(monkeypatch, tmp_path, body if how == "in the answer" else failed(body))

    with pytest.raises(SlurmUnavailable) as caught:
        await slurm.update_node("kube1", "DRAIN", "slurm-k8s-bridge: cordoned")

    assert not isinstance(caught.value, PermanentError)
    assert "kube1" in str(caught.value) and "DRAIN" in str(caught.value)


async def test_unavailable_is_raised_as_is_when_slurmrestd_does_not_answer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    slurm, _ = client(monkeypatch, tmp_path, SlurmUnavailable("slurmrestd POST: connection refused"))

    with pytest.raises(SlurmUnavailable, match="connection refused"):
        await slurm.update_node("kube1", "DOWN", "r")


async def test_a_5xx_answer_without_errors_is_no_success(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    slurm, _ = client(monkeypatch, tmp_path, failed({}))

    with pytest.raises(SlurmUnavailable):
        await slurm.update_node("kube1", "DOWN", "r")


def test_the_refusal_words_are_matched_in_the_errors_only() -> None:
    assert rest._refused(errors("INVALID NODE NAME"))
    assert not rest._refused({"errors": [], "warnings": [{"description": "Invalid node name"}]})
    assert not rest._refused({"description": "Invalid node name"})
    assert not rest._refused(None)


# -- changed_nodes ----------------------------------------------------------------------------


async def test_a_node_listing_with_errors_is_unavailable_not_unchanged(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    body = {**errors("Unable to contact slurm controller", 1007), "nodes": [],
            "last_update": {"set": True, "number": 1700000000}}
    slurm, fake = client(monkeypatch, tmp_path, body)

    with pytest.raises(SlurmUnavailable, match="could not list nodes"):
        await slurm.changed_nodes(["k8s"])

    assert [(m, p) for m, p, _ in fake.requests] == [("GET", f"/slurm/{API_VERSION}/nodes/")]
    assert slurm._nodes_last_update == 0  # the next poll asks for everything again


async def test_a_node_listing_is_cut_to_the_wanted_partitions(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    body = {
        "errors": [], "last_update": {"set": True, "number": 1700000000},
        "nodes": [
            {"name": "kube1", "state": ["IDLE", "DRAIN"], "reason": "x", "partitions": ["k8s"]},
            {"name": "cpu1", "state": ["IDLE"], "reason": "", "partitions": ["batch"]},
        ],
    }
    slurm, fake = client(monkeypatch, tmp_path, body)

    assert await slurm.changed_nodes(["k8s"]) == [
        SlurmNode("kube1", frozenset({"IDLE", "DRAIN"}), "x", ("k8s",)),
    ]
    assert fake.requests[0][2] == {"params": {"update_time": "0"}}
    fake.answer = {"errors": [], "nodes": []}  # nothing changed since
    assert await slurm.changed_nodes(["k8s"]) is None


# -- node -------------------------------------------------------------------------------------


async def test_one_node_is_read_by_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    body = {"errors": [], "nodes": [
        {"name": "kube1", "state": ["DOWN", "NOT_RESPONDING"], "reason": "r", "partitions": ["k8s", "all"]},
    ]}
    slurm, fake = client(monkeypatch, tmp_path, body)

    assert await slurm.node("kube1") == SlurmNode(
        "kube1", frozenset({"DOWN", "NOT_RESPONDING"}), "r", ("k8s", "all")
    )
    assert fake.requests == [("GET", NODE_PATH, {})]


async def test_an_unknown_node_reads_as_none_and_other_failures_raise(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    slurm, fake = client(monkeypatch, tmp_path, failed(errors("Invalid node name specified")))
    assert await slurm.node("kube1") is None
    fake.answer = {"errors": [], "nodes": [{"name": "kube10", "state": ["IDLE"]}]}
    assert await slurm.node("kube1") is None
    fake.answer = failed(errors("Unable to contact slurm controller", 1007))
    with pytest.raises(SlurmUnavailable):
        await slurm.node("kube1")
