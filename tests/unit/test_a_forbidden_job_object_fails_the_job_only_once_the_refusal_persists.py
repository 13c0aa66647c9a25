"""A 403 on a run's Secret or pod fails the job only once it persists: an API server that has just
restarted answers 403 ("not yet ready to handle request") until its admission plugins are synced.
CI saw an array task end FAILED 1:0 when the API server was killed and restarted under load."""

from __future__ import annotations

import pytest
import structlog

from bridge.clients.kube.errors import KubeRejected, error_for_status
from bridge.controller.refusals import (
    FORBIDDEN_CONFIRM_S,
    BridgeNotAuthorised,
    RefusalNotConfirmed,
    judge_refusal,
)
from bridge.controller.sessions import JobSession

LOG = structlog.get_logger("test")
NOT_READY = {"kind": "Status", "code": 403, "reason": "Forbidden",
             "message": 'pods "slurm-9-0" is forbidden: not yet ready to handle request'}


def _error(status: int, body: dict[str, object]) -> KubeRejected:
    error = error_for_status(status, body, "create pods in namespace slurm-jobs")
    assert isinstance(error, KubeRejected)
    return error


def test_a_first_403_is_asked_again_not_the_jobs_end() -> None:
    session = JobSession(job_id=9)
    with pytest.raises(RefusalNotConfirmed):
        judge_refusal(session, _error(403, NOT_READY), LOG, now=100.0)
    with pytest.raises(RefusalNotConfirmed):
        judge_refusal(session, _error(403, NOT_READY), LOG, now=100.0 + FORBIDDEN_CONFIRM_S - 1)


def test_a_403_that_persists_fails_the_job() -> None:
    session = JobSession(job_id=9)
    with pytest.raises(RefusalNotConfirmed):
        judge_refusal(session, _error(403, NOT_READY), LOG, now=100.0)
    judge_refusal(session, _error(403, NOT_READY), LOG, now=100.0 + FORBIDDEN_CONFIRM_S)  # no raise: final


@pytest.mark.parametrize("status", [400, 422, 413])
def test_a_refusal_that_cannot_pass_fails_the_job_at_once(status: int) -> None:
    session = JobSession(job_id=9)
    judge_refusal(session, _error(status, {"reason": "Invalid", "message": "bad"}), LOG, now=100.0)
    assert session.forbidden_since is None


@pytest.mark.parametrize(
    ("status", "body"), [(401, {"reason": "Unauthorized"}), (409, {"reason": "AlreadyExists"})])
def test_the_bridges_credentials_or_a_conflict_never_fail_the_job(
    status: int, body: dict[str, object]
) -> None:
    session = JobSession(job_id=9)
    with pytest.raises(BridgeNotAuthorised):
        judge_refusal(session, _error(status, body), LOG, now=100.0 + FORBIDDEN_CONFIRM_S * 10)
