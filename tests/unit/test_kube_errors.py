"""Each API server answer maps to one error class: temporary (retry) or permanent (a person acts)."""

from __future__ import annotations

import json

import pytest

from bridge.clients.kube.errors import (
    KubeConflict,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeRejected,
    ResourceVersionExpired,
    error_for_status,
)
from bridge.core.errors import KubeUnavailable, PermanentError, TemporaryError


def body(code: int, reason: str, message: str) -> bytes:
    return json.dumps({"kind": "Status", "code": code, "reason": reason, "message": message}).encode()


@pytest.mark.parametrize(
    ("code", "reason", "cls", "kind"),
    [
        (401, "Unauthorized", KubeForbidden, PermanentError),
        (403, "Forbidden", KubeForbidden, PermanentError),
        (400, "BadRequest", KubeInvalid, PermanentError),
        (422, "Invalid", KubeInvalid, PermanentError),
        (404, "NotFound", KubeNotFound, PermanentError),
        (409, "AlreadyExists", KubeConflict, PermanentError),
        (405, "MethodNotAllowed", KubeRejected, PermanentError),
        (410, "Expired", ResourceVersionExpired, TemporaryError),
        (429, "TooManyRequests", KubeUnavailable, TemporaryError),
        (500, "InternalError", KubeUnavailable, TemporaryError),
        (503, "ServiceUnavailable", KubeUnavailable, TemporaryError),
        (504, "Timeout", KubeUnavailable, TemporaryError),
    ],
)
def test_status_codes_map_to_one_class(code: int, reason: str, cls: type, kind: type) -> None:
    error = error_for_status(code, body(code, reason, "details"), "create pods in namespace slurm")

    assert type(error) is cls
    assert isinstance(error, kind)
    assert "create pods in namespace slurm" in str(error)
    assert f"HTTP {code} {reason}: details" in str(error)


def test_forbidden_says_who_may_not_do_what_and_keeps_the_servers_words() -> None:
    message = 'pods is forbidden: User "system:serviceaccount:slurm:bridge" cannot create resource "pods"'

    error = error_for_status(403, body(403, "Forbidden", message), "create pods in namespace slurm")

    assert isinstance(error, KubeForbidden)
    assert str(error).startswith("Kubernetes forbids the bridge to create pods in namespace slurm")
    assert message in str(error)
    assert "RBAC" in str(error)
    assert (error.status, error.reason, error.what) == (403, "Forbidden", "create pods in namespace slurm")


def test_a_body_that_is_not_a_status_is_quoted_instead() -> None:
    error = error_for_status(502, b"<html>bad gateway</html>", "list pods in namespace slurm")

    assert isinstance(error, KubeUnavailable)
    assert "<html>bad gateway</html>" in str(error)
