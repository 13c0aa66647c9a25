"""The verbs reconcile and attach use on Kubernetes: create/delete pods, follow logs, explain failures.

Every verb is idempotent in the way reconcile needs: creating a pod that exists and deleting one
that is gone both succeed (they return False to say "nothing to do"), so a restarted daemon that
re-plans from scratch never makes duplicates and never fails on a half-done previous attempt.
Retrying temporary errors is the caller's job (the work queue requeues with backoff).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import structlog
from kubernetes_asyncio.client import ApiClient, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.stream import WsApiClient

from bridge.clients.kube.client import REQUESTS_SENT, iter_pieces, request, request_json
from bridge.clients.kube.errors import (
    KubeConflict,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    LogsNotReady,
    error_for_status,
)
from bridge.clients.kube.lines import ns_to_rfc3339, rfc3339_to_ns, split_log_line
from bridge.core import wellknown
from bridge.core.errors import ExecCommandFailed, ExecNotStarted, ExecOutcomeUnknown, KubeUnavailable

log = structlog.get_logger(__name__)

EXEC_TIMEOUT_S = 30.0
"""How long a short exec of the agent (signal, step-done) may take."""
EXEC_OUTPUT_LIMIT = 65536
"""What a short exec may print that is kept (the agent prints a line; a replaced one may not)."""
LOG_READ_TIMEOUT_S = 60.0
"""A followed log silent this long is broken off: a half-open connection (a restarted API server or
kubelet, a lost network path) would otherwise hang for ever. A job that computes quietly for hours
is fine: its relay resumes after the last line it saw (reconcile._relay_logs)."""


STREAM_OPENS_AT_ONCE = 32
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
"""Accept header for a list of objects' metadata only."""
LIST_PAGE = 500


def _refused_before_running(error: BaseException) -> bool:
    """An exec error that proves its command never ran: the upgrade answered with a status (a
    kubelet's 500, a container not running yet), or no connection at all. A timeout or a
    dropped connection during the upgrade may come after the kubelet started the command; and
    401/403/404 (credentials, RBAC, a pod gone) are not worth trying again."""
    status = error.status if isinstance(error, ApiException | aiohttp.WSServerHandshakeError) else None
    if status is not None:
        return status not in (401, 403, 404)
    return isinstance(error, aiohttp.ClientConnectorError)


class KubeActions:
    """Pod verbs in one namespace."""

    def __init__(
        self, api_client: ApiClient, namespace: str, *, log_read_timeout_s: float = LOG_READ_TIMEOUT_S,
        streams: ApiClient | None = None,
    ) -> None:
        self._api = api_client
        self._streams = streams or api_client
        """Long-lived reads (followed logs): their own pool, if the caller gave one."""
        # Streams once open are not capped, but at most this many are being opened at once: a
        # thousand relays (re)starting together must not bury the API server, whose slowness
        # would cost the Lease (each open is a request the server routes to a kubelet).
        self._opening_streams = asyncio.Semaphore(STREAM_OPENS_AT_ONCE)
        self.namespace = namespace
        self._pods = f"/api/v1/namespaces/{namespace}/pods"
        self._secrets = f"/api/v1/namespaces/{namespace}/secrets"
        self._log_timeout = aiohttp.ClientTimeout(connect=10, sock_read=log_read_timeout_s)

    async def create_pod(self, manifest: dict[str, Any]) -> bool:
        """Create the pod; True if created, False if a pod of that name already exists (not an error)."""
        meta = manifest.get("metadata") or {}
        name = meta.get("name")
        bound = log.bind(pod=name, job_id=(meta.get("labels") or {}).get(wellknown.LABEL_JOB_ID))
        what = f"create pods in namespace {self.namespace}"
        try:
            response = await request(self._api, "POST", self._pods, what, body=manifest)
        except KubeConflict:
            bound.debug("kube.pod_exists")
            return False
        response.release()
        bound.info("kube.pod_created", node=(manifest.get("spec") or {}).get("nodeName"))
        return True

    async def delete_pod(
        self, name: str, grace_seconds: int | None = None, *, uid: str | None = None
    ) -> bool:
        """Delete the pod (in the background); True if a deletion was requested, False if already gone.

        With `uid`, only that incarnation is deleted: a newer pod with the same name is left alone
        (and False is returned). Careful with `grace_seconds=0`: the API server then forgets the pod
        at once (a force delete) although its container may still run on the node for a while;
        the pod's own terminationGracePeriodSeconds (None here) or >= 1 waits for the kubelet.
        """
        options: dict[str, Any] = {
            "apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background",
        }
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        what = f"delete pods in namespace {self.namespace}"
        try:
            response = await request(self._api, "DELETE", f"{self._pods}/{name}", what, body=options)
        except (KubeNotFound, KubeConflict):
            log.debug("kube.pod_already_gone", pod=name, uid=uid)
            return False
        response.release()
        log.info("kube.pod_deleted", pod=name, grace_s=grace_seconds)
        return True

    async def create_secret(self, manifest: dict[str, Any]) -> bool:
        """Create the Secret; True if created, False if one of that name exists (not an error).
        Only its name is ever logged: it holds a job's script and environment."""
        name = (manifest.get("metadata") or {}).get("name")
        what = f"create secrets in namespace {self.namespace}"
        try:
            response = await request(self._api, "POST", self._secrets, what, body=manifest)
        except KubeConflict:
            log.debug("kube.secret_exists", secret=name)
            return False
        response.release()
        return True

    async def delete_secret(self, name: str, *, uid: str | None = None) -> bool:
        """Delete the Secret (with `uid`: only that incarnation); True if deleted, False if gone
        (or, with `uid`, replaced)."""
        what = f"delete secrets in namespace {self.namespace}"
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        try:
            response = await request(self._api, "DELETE", f"{self._secrets}/{name}", what, body=options)
        except (KubeNotFound, KubeConflict):
            return False
        response.release()
        return True

    async def secrets_metadata(self, selector: str) -> list[dict[str, Any]]:
        """The metadata of every Secret matching the label `selector`: names, labels and creation
        times only (a metadata-only list: their data never crosses the wire)."""
        items: list[dict[str, Any]] = []
        query: dict[str, str | int] = {"labelSelector": selector, "limit": LIST_PAGE}
        while True:
            page = await request_json(
                self._api, "GET", self._secrets, f"list secrets in namespace {self.namespace}",
                query=query, accept=METADATA_LIST,
            )
            items.extend(item.get("metadata") or {} for item in page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            query = {**query, "continue": token}

    async def get_pod(self, name: str) -> dict[str, Any] | None:
        """The pod as the API server has it now (raw dict), or None. Reconcile reads the cache instead."""
        try:
            return await request_json(
                self._api, "GET", f"{self._pods}/{name}", f"get pods in namespace {self.namespace}"
            )
        except KubeNotFound:
            return None

    async def get_node(self, name: str) -> dict[str, Any]:
        return await request_json(self._api, "GET", f"/api/v1/nodes/{name}", f"get node {name}")

    def _exec_client(self) -> WsApiClient:
        """A client for one exec (a websocket upgrade of its own), counted as a request."""
        REQUESTS_SENT["EXEC"] += 1
        return WsApiClient(configuration=self._api.configuration)

    async def exec_in_pod(
        self, pod_name: str, command: list[str], container: str = wellknown.CONTAINER_NAME
    ) -> str:
        """Run `command` in a container of the pod (the exec subresource, over a websocket) and
        return what it printed. Used only with the bridge's own agent (`agent signal`).

        Raises ExecCommandFailed when the command exited non-zero, or the runtime could not run
        it (the status channel says so; stdout and stderr alone would look like a success)."""
        ws = self._exec_client()
        output: list[str] = []
        kept = 0
        status = b""
        try:
            # Bounded: the command is the agent's (signal, step-done), which ends at once; a user
            # who replaced it in their pod must not hold the daemon.
            async with asyncio.timeout(EXEC_TIMEOUT_S):
                connection = await CoreV1Api(api_client=ws).connect_get_namespaced_pod_exec(
                    pod_name, self.namespace, command=command, container=container,
                    stdout=True, stderr=True, stdin=False, tty=False, _preload_content=False,
                )
                async with connection as socket:
                    async for message in socket:
                        data = message.data if isinstance(message.data, bytes) else str(message.data).encode()
                        if data[:1] in (b"\x01", b"\x02") and kept < EXEC_OUTPUT_LIMIT:
                            output.append(data[1:].decode("utf-8", errors="replace"))
                            kept += len(data) - 1
                        elif data[:1] == b"\x03" and len(data) > 1:
                            status = data[1:]
        except ApiException as error:
            what = f"exec in pod {pod_name}"
            raise error_for_status(error.status or 500, error.body or b"", what) from error
        except TimeoutError as error:
            if not status:  # else it ended in time, only its socket's close did not
                raise ExecOutcomeUnknown(f"exec in pod {pod_name} did not answer within "
                                         f"{EXEC_TIMEOUT_S:.0f} s") from error
        except (aiohttp.ClientError, OSError) as error:
            raise KubeUnavailable(f"cannot exec in pod {pod_name}: {error}") from error
        finally:
            await ws.close()
        printed = "".join(output)[:EXEC_OUTPUT_LIMIT]
        if not status:
            # Closed without the status the kubelet sends last: the command may or may not have run.
            raise ExecOutcomeUnknown(f"exec in pod {pod_name} ended without an exit status")
        code = int(_exit_code_of(status))  # 1 for a Failure without a code: it could not start
        if code != 0:
            detail = printed.strip() or _status_message(status)
            raise ExecCommandFailed(f"{command[-2:]} in pod {pod_name} exited {code}: {detail[:300]}",
                                    code, printed, ran=b'"NonZeroExitCode"' in status)
        return printed

    async def exec_stream(
        self, pod_name: str, command: list[str], container: str = wellknown.CONTAINER_NAME
    ) -> AsyncIterator[tuple[int, bytes]]:
        """Run `command` in the container and yield (1 or 2, bytes) as it writes to stdout or
        stderr, then (0, exit code as text) once it has ended (the exec status channel).

        Raises ExecNotStarted when the exec was refused before it opened (a container not yet
        running, a kubelet or API server that failed the upgrade): the command did not run, so
        the caller may try again; any later error may come after the command started."""
        ws_client = self._exec_client()
        exit_code = b"1"
        started = False
        try:
            try:
                connection = await CoreV1Api(api_client=ws_client).connect_get_namespaced_pod_exec(
                    pod_name, self.namespace, command=command, container=container,
                    stdout=True, stderr=True, stdin=False, tty=False, _preload_content=False,
                )
                async with connection as ws:
                    # From here on the command may be running: an error is no longer "not started".
                    started = True
                    async for message in ws:
                        data = message.data if isinstance(message.data, bytes) else str(message.data).encode()
                        if not data:
                            continue
                        channel, payload = data[0], data[1:]
                        if channel in (1, 2) and payload:
                            yield channel, payload
                        elif channel == 3 and payload:
                            exit_code = _exit_code_of(payload)
            except ApiException as error:
                what = f"exec in pod {pod_name}"
                refused = error_for_status(error.status or 500, error.body or b"", what)
                if not started and _refused_before_running(error):
                    raise ExecNotStarted(str(refused)) from error
                raise refused from error
            except (aiohttp.ClientError, TimeoutError, OSError) as error:
                if not started and _refused_before_running(error):
                    raise ExecNotStarted(f"cannot exec in pod {pod_name}: {error}") from error
                raise KubeUnavailable(f"cannot exec in pod {pod_name}: {error}") from error
        finally:
            await ws_client.close()
        yield 0, exit_code

    async def exec_with_input(
        self, pod_name: str, command: list[str], data: bytes, container: str = wellknown.CONTAINER_NAME
    ) -> int:
        """Run `command` in the container with `data` on its stdin (it must read exactly that much,
        as the v4 exec protocol cannot close stdin); return its exit code."""
        ws_client = self._exec_client()
        code = b"1"
        try:
            connection = await CoreV1Api(api_client=ws_client).connect_get_namespaced_pod_exec(
                pod_name, self.namespace, command=command, container=container,
                stdout=True, stderr=True, stdin=True, tty=False, _preload_content=False,
            )
            async with asyncio.timeout(EXEC_TIMEOUT_S * 4), connection as ws:
                for start in range(0, len(data), 65536):
                    await ws.send_bytes(b"\x00" + data[start:start + 65536])
                async for message in ws:
                    raw = message.data if isinstance(message.data, bytes) else str(message.data).encode()
                    if raw[:1] == b"\x03" and len(raw) > 1:
                        code = _exit_code_of(raw[1:])
        except ApiException as error:
            what = f"exec in pod {pod_name}"
            raise error_for_status(error.status or 500, error.body or b"", what) from error
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise KubeUnavailable(f"cannot exec in pod {pod_name}: {error}") from error
        finally:
            await ws_client.close()
        return int(code)

    async def exec_feeding(
        self, pod_name: str, command: list[str], feed: asyncio.Queue[bytes | None],
        container: str = wellknown.CONTAINER_NAME,
    ) -> int:
        """Run `command` in the container and write what arrives in `feed` to its stdin as it
        comes, until a None; return its exit code. The command must know where its input ends (the
        v4 exec protocol cannot close stdin). Slow readers hold the writer: the websocket's send
        waits for the transport to drain. Raises ExecNotStarted as exec_stream does (nothing
        was taken from `feed` then)."""
        ws_client = self._exec_client()
        code = b"1"
        started = False
        try:
            connection = await CoreV1Api(api_client=ws_client).connect_get_namespaced_pod_exec(
                pod_name, self.namespace, command=command, container=container,
                stdout=True, stderr=True, stdin=True, tty=False, _preload_content=False,
            )
            async with connection as ws:
                started = True

                async def send() -> None:
                    while (chunk := await feed.get()) is not None:
                        for start in range(0, len(chunk), 65536):
                            await ws.send_bytes(b"\x00" + chunk[start:start + 65536])

                sender = asyncio.ensure_future(send())
                # Its error (the socket closed under it) shows as the receive loop's end.
                sender.add_done_callback(lambda done: done.cancelled() or done.exception())
                try:
                    async for message in ws:
                        raw = message.data if isinstance(message.data, bytes) else str(message.data).encode()
                        if raw[:1] == b"\x03" and len(raw) > 1:
                            code = _exit_code_of(raw[1:])
                finally:
                    sender.cancel()
        except ApiException as error:
            refused = error_for_status(error.status or 500, error.body or b"", f"exec in pod {pod_name}")
            if not started and _refused_before_running(error):
                raise ExecNotStarted(str(refused)) from error
            raise refused from error
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            if not started and _refused_before_running(error):
                raise ExecNotStarted(f"cannot exec in pod {pod_name}: {error}") from error
            raise KubeUnavailable(f"cannot exec in pod {pod_name}: {error}") from error
        finally:
            await ws_client.close()
        return int(code)

    async def set_node_condition(
        self, name: str, condition_type: str, status: str, reason: str, message: str
    ) -> None:
        """Set one condition on a node's status (a strategic merge keyed by type, so the kubelet's
        own conditions are left alone)."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {
            "type": condition_type, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": now, "lastHeartbeatTime": now,
        }
        await request_json(
            self._api, "PATCH", f"/api/v1/nodes/{name}/status", f"patch the status of node {name}",
            body={"status": {"conditions": [condition]}},
            content_type="application/strategic-merge-patch+json",
        )

    async def nodes_by_label(self, label: str) -> dict[str, str]:
        """Map each value of node label `label` to the name of the node carrying it."""
        body = await request_json(
            self._api, "GET", "/api/v1/nodes", "list nodes", query={"labelSelector": label}
        )
        return {
            node["metadata"]["labels"][label]: node["metadata"]["name"]
            for node in body.get("items") or []
            if label in (node["metadata"].get("labels") or {})
        }

    async def ensure_namespace(self) -> bool:
        """Create the namespace if it does not exist; True if it was created.

        If the bridge may not read namespaces (a namespaced Role only), assume it exists: creating
        a pod in a missing one then fails with a clear NotFound.
        """
        path = f"/api/v1/namespaces/{self.namespace}"
        try:
            await request_json(self._api, "GET", path, f"get namespace {self.namespace}")
            return False
        except KubeNotFound:
            pass
        except KubeForbidden as error:
            log.warning("kube.namespace_unchecked", namespace=self.namespace, error=str(error))
            return False
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}
        try:
            await request_json(self._api, "POST", "/api/v1/namespaces", "create namespaces", body=body)
        except KubeConflict:
            return False
        log.info("kube.namespace_created", namespace=self.namespace)
        return True

    async def stream_logs(
        self, pod_name: str, container: str = wellknown.CONTAINER_NAME, since_time: str | None = None
    ) -> AsyncIterator[tuple[str, str]]:
        """Follow the container's log: yield (RFC 3339 nano timestamp, line without its newline).

        Ends when the container exits (the server closes the stream), or raises KubeUnavailable when
        the connection breaks or stays silent for `log_read_timeout_s`; to resume, call again with
        `since_time` = the last timestamp seen: only lines stamped strictly after it are yielded
        (the server keeps whole seconds, so lines of that second are filtered here). Raises
        LogsNotReady while the container has not started. Consumers that may stop early should
        wrap it in `contextlib.aclosing` so the connection is closed at once rather than when the
        generator is garbage-collected.
        """
        query: dict[str, str | int] = {"container": container, "follow": "true", "timestamps": "true"}
        after_ns: int | None = None
        if since_time:
            after_ns = rfc3339_to_ns(since_time)
            query["sinceTime"] = ns_to_rfc3339(after_ns)
        what = f"read the log of container {container} of pod {pod_name} in namespace {self.namespace}"
        try:
            async with self._opening_streams:
                response = await request(
                    self._streams, "GET", f"{self._pods}/{pod_name}/log", what, query=query,
                    timeout=self._log_timeout,
                )
        except KubeInvalid as error:
            raise LogsNotReady(str(error)) from error
        continues = ""  # the stamp of a line too long to hold, while its pieces come
        async with contextlib.aclosing(iter_pieces(response, what)) as pieces:
            async for line, ended in pieces:
                if continues:
                    # A piece of one long line: only its first carried the stamp.
                    stamp = continues
                    continues = "" if ended else continues
                    if after_ns is None or rfc3339_to_ns(stamp) > after_ns:
                        yield stamp, line.decode("utf-8", errors="replace")
                    continue
                stamp, text = split_log_line(line)
                stamp_ns = _ns_or_none(stamp) if stamp else None
                if stamp_ns is None:
                    # With timestamps=true every line of the container's log carries one. A line
                    # without is the kubelet's own error, written into a body it had begun with a
                    # 200 ("unable to retrieve container logs for containerd://..." once the
                    # container is gone): never the job's output.
                    raise KubeUnavailable(f"cannot {what}: the log stream ended with {text[:200]!r}")
                if not ended:
                    continues = stamp
                if after_ns is not None and stamp_ns <= after_ns:
                    continue
                yield stamp, text

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


def _exit_code_of(status: bytes) -> bytes:
    """The exit code in an exec status message ({"status": "Success"} or a NonZeroExitCode cause)."""
    try:
        parsed = json.loads(status)
    except ValueError:
        return b"1"
    if parsed.get("status") == "Success":
        return b"0"
    for cause in (parsed.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode" and str(cause.get("message", "")).isdigit():
            return str(cause["message"]).encode()
    return b"1"


def _status_message(status: bytes) -> str:
    """The message of an exec status (why the runtime could not run the command)."""
    try:
        return str(json.loads(status).get("message") or "")
    except (ValueError, AttributeError):
        return status.decode("utf-8", errors="replace")


def _ns_or_none(stamp: str) -> int | None:
    try:
        return rfc3339_to_ns(stamp)
    except ValueError:
        return None


def _event_time_ns(event: dict[str, Any]) -> int:
    """When the event last happened: lastTimestamp, else eventTime, else creation; 0 if none parse."""
    meta = event.get("metadata") or {}
    for stamp in (event.get("lastTimestamp"), event.get("eventTime"), meta.get("creationTimestamp")):
        if stamp and (ns := _ns_or_none(str(stamp))) is not None:
            return ns
    return 0
