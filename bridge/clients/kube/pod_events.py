"""Explaining a pod from its events: the latest one (Pulling, FailedMount, ...) or the latest Warning.

Mixed into KubeActions (bridge.clients.kube.actions); the reconciler reads it for pods that do not
start, to fail the job with the reason.
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio.client import ApiClient

from bridge.clients.kube.client import request_json
from bridge.clients.kube.pod_logs import timestamp_ns_or_none


class EventVerbs:
    """Read the events about the namespace's pods."""

    _api: ApiClient
    namespace: str

    async def latest_pod_event(
        self, pod_name: str, uid: str | None = None, reasons: frozenset[str] | None = None
    ) -> tuple[str, str, str] | None:
        """(type, reason, message) of the latest event about the pod, Normal or Warning (Pulling,
        FailedMount, ...); with `uid`, of that incarnation only; with `reasons`, only Normal events
        and Warnings of those reasons count. None if there is none."""
        selector = f"involvedObject.kind=Pod,involvedObject.name={pod_name}"
        if uid:
            selector += f",involvedObject.uid={uid}"
        body = await request_json(
            self._api, "GET", f"/api/v1/namespaces/{self.namespace}/events",
            f"list events in namespace {self.namespace}", query={"fieldSelector": selector},
        )
        events = [e for e in body.get("items") or []
                  if reasons is None or e.get("type") != "Warning" or e.get("reason") in reasons]
        if not events:
            return None
        latest = max(events, key=_event_time_ns)
        return (
            str(latest.get("type") or ""), str(latest.get("reason") or ""),
            (latest.get("message") or "").strip(),
        )

    async def pod_events_reason(self, pod_name: str, uid: str | None = None) -> str | None:
        """"Reason: message" of the latest Warning event about the pod (FailedScheduling, image pull...).

        With `uid`, only events of that incarnation of the pod. None if there is no warning.
        """
        selector = f"involvedObject.kind=Pod,involvedObject.name={pod_name},type=Warning"
        if uid:
            selector += f",involvedObject.uid={uid}"
        body = await request_json(
            self._api, "GET", f"/api/v1/namespaces/{self.namespace}/events",
            f"list events in namespace {self.namespace}", query={"fieldSelector": selector},
        )
        events = body.get("items") or []
        if not events:
            return None
        latest = max(events, key=_event_time_ns)
        return f"{latest.get('reason') or 'Warning'}: {(latest.get('message') or '').strip()}"


def _event_time_ns(event: dict[str, Any]) -> int:
    """When the event last happened: lastTimestamp, else eventTime, else creation; 0 if none parse."""
    meta = event.get("metadata") or {}
    for stamp in (event.get("lastTimestamp"), event.get("eventTime"), meta.get("creationTimestamp")):
        if stamp and (ns := timestamp_ns_or_none(str(stamp))) is not None:
            return ns
    return 0
