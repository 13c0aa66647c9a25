"""Errors of the Kubernetes client, classified once: temporary (retry later) or permanent (a person acts).

Every HTTP answer the bridge gets from the API server goes through `error_for_status`, so the rest
of the bridge never sees a raw `ApiException` or aiohttp error, only these classes (and
`bridge.core.errors.KubeUnavailable` for transport trouble). Classification is by HTTP status and the
`reason` field of the Kubernetes `Status` object, never by searching message text; the server's
message is kept verbatim in the error text because it is what a person needs to read.
"""

from __future__ import annotations

import json
from typing import Any

from bridge.core.errors import KubeUnavailable, PermanentError, TemporaryError


class KubeConfigError(PermanentError):
    """No usable kubeconfig / in-cluster configuration, or the server's TLS certificate is not trusted."""


class KubeRejected(PermanentError):
    """The API server understood the request and refused it; sending it again cannot help."""

    def __init__(self, message: str, *, status: int, reason: str, what: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.what = what


class KubeForbidden(KubeRejected):
    """401/403: the bridge's credentials are not accepted or lack a permission (RBAC, quota, policy)."""


class KubeInvalid(KubeRejected):
    """400/422: the object or the query is malformed (a bug in the bridge or a bad partition setting)."""


class KubeNotFound(KubeRejected):
    """404: the object (or its namespace) does not exist; callers that delete treat this as done."""


class KubeConflict(KubeRejected):
    """409: AlreadyExists on create (callers treat as done) or a failed precondition."""


class ResourceVersionExpired(TemporaryError):
    """410 Gone: the watch asked for history the server no longer keeps; list again, then watch."""


def status_of(body: bytes | str | dict[str, Any] | None) -> dict[str, Any]:
    """The Kubernetes `Status` object in an error body, or {} when the body is not one."""
    if isinstance(body, dict):
        return body
    if not body:
        return {}
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def error_for_status(
    status: int, body: bytes | str | dict[str, Any] | None, what: str
) -> KubeRejected | KubeUnavailable | ResourceVersionExpired:
    """The error to raise for a non-2xx answer to the request described by `what`.

    `what` reads as the end of "cannot ...", e.g. "create pods in namespace slurm".
    """
    st = status_of(body)
    reason = str(st.get("reason") or "")
    message = str(st.get("message") or "").strip()
    if not message and isinstance(body, bytes | str):
        message = (body.decode(errors="replace") if isinstance(body, bytes) else body).strip()[:500]
    detail = f"HTTP {status} {reason or 'error'}: {message or '(no message)'}"
    if status == 410:
        return ResourceVersionExpired(f"cannot {what}: {detail}")
    if status == 429 or status >= 500:
        # Throttling, an overloaded or restarting apiserver, a kubelet that does not answer.
        return KubeUnavailable(f"cannot {what}: {detail}")
    if status == 401:
        return KubeForbidden(
            f"Kubernetes rejected the bridge's credentials, so it cannot {what} ({detail}); "
            "check the kubeconfig or the service account token",
            status=status, reason=reason, what=what,
        )
    if status == 403:
        return KubeForbidden(
            f"Kubernetes forbids the bridge to {what} ({detail}); if this is RBAC, grant the bridge's "
            "service account that verb on that resource",
            status=status, reason=reason, what=what,
        )
    if status == 404:
        return KubeNotFound(f"cannot {what}: {detail}", status=status, reason=reason, what=what)
    if status == 409:
        return KubeConflict(f"cannot {what}: {detail}", status=status, reason=reason, what=what)
    if status in (400, 422):
        return KubeInvalid(f"cannot {what}: {detail}", status=status, reason=reason, what=what)
    return KubeRejected(f"cannot {what}: {detail}", status=status, reason=reason, what=what)


class LogsNotReady(TemporaryError):
    """400 from the log endpoint: the container has not started yet (or is not in the pod); ask later."""
