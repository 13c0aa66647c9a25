"""When Kubernetes refusing one of a run's objects (its Secret, pods, GPU claims) ends the job.

Owns nothing but `JobSession.forbidden_since`. Used by controller.pod_creation and
controller.device_claims, which fail the job with the refusal as its reason once `judge_refusal`
returns.
"""

from __future__ import annotations

import time
from typing import Any

from bridge.clients.kube.errors import KubeConflict, KubeRejected
from bridge.controller.sessions import JobSession
from bridge.core.errors import TemporaryError

FORBIDDEN_CONFIRM_S = 20.0
"""How long a 403 must persist before it fails the job. An API server that has just (re)started
answers 403 "not yet ready to handle request" from its admission plugins (NamespaceLifecycle & co)
until their caches are synced, which takes seconds on a loaded host; a quota or a policy that
refuses the job goes on refusing it. CI failed an array task 1:0 when the API server was
restarted under load."""


class BridgeNotAuthorised(TemporaryError):
    """Kubernetes refused the bridge's own credentials (401), or a conflict: no fault of the job's.
    Temporary, so the work queue tries the job again with backoff (a permanent error is not)."""


class RefusalNotConfirmed(TemporaryError):
    """Kubernetes forbade the run's object, but not yet for FORBIDDEN_CONFIRM_S: asked again later."""


def judge_refusal(session: JobSession, error: KubeRejected, bound: Any, now: float | None = None) -> None:
    """Return when `error` refuses the job for good (invalid, too big, an admission policy or a
    quota: asking again would not help). Raise BridgeNotAuthorised for the bridge's credentials
    (401: every job would fail while a token is renewed) or a conflict, and RefusalNotConfirmed while
    a 403 has not yet persisted for FORBIDDEN_CONFIRM_S; the work queue retries with backoff."""
    if error.status == 401 or isinstance(error, KubeConflict):
        raise BridgeNotAuthorised(str(error)) from error
    if error.status != 403:
        return
    now = time.monotonic() if now is None else now
    if session.forbidden_since is None:
        session.forbidden_since = now
    waited = now - session.forbidden_since
    if waited < FORBIDDEN_CONFIRM_S:
        bound.warning("kube.forbidden_unconfirmed", waited_s=round(waited, 1), error=str(error))
        raise RefusalNotConfirmed(str(error))
