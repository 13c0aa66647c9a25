"""Running commands in a job pod's container (the exec subresource, over a websocket).

Used only with the bridge's own in-pod agent (signal, step-done, step launch, script delivery).
Each verb classifies how an exec ended, for the callers to know whether running it again is safe:
ExecNotStarted (refused before its websocket opened: the command never ran), ExecOutcomeUnknown
(no answer in time: it may have run), ExecCommandFailed (it exited non-zero, or the runtime could
not start it: its exit `code`, `output` and whether it `ran` kept for the caller). Mixed into
KubeActions (bridge.clients.kube.actions).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.stream import WsApiClient

from bridge.clients.kube.client import REQUESTS_SENT, without_environment_lookups
from bridge.clients.kube.errors import error_for_status
from bridge.core import wellknown
from bridge.core.errors import ExecCommandFailed, ExecNotStarted, ExecOutcomeUnknown, KubeUnavailable

EXEC_TIMEOUT_S = 30.0
"""How long a short exec of the agent (signal, step-done) may take."""
EXEC_OUTPUT_LIMIT = 65536
"""What a short exec may print that is kept (the agent prints a line; a replaced one may not)."""


def _refused_before_running(error: BaseException) -> bool:
    """An exec error that proves its command never ran: the upgrade answered with a status (a
    kubelet's 500, a container not running yet), or no connection at all. A timeout or a
    dropped connection during the upgrade may come after the kubelet started the command; and
    401/403/404 (credentials, RBAC, a pod gone) are not worth trying again."""
    status = error.status if isinstance(error, ApiException | aiohttp.WSServerHandshakeError) else None
    if status is not None:
        return status not in (401, 403, 404)
    return isinstance(error, aiohttp.ClientConnectorError)


async def _open_exec(ws_client: WsApiClient, pod_name: str, namespace: str, command: list[str],
                     container: str, *, stdin: bool, tty: bool = False) -> Any:
    """The exec's websocket connection, to be entered with `async with`. kubernetes_asyncio's
    stubs type the call for a plain request (a str command, a str answer); over a WsApiClient
    with _preload_content=False it takes the argv list and answers a connection."""
    connect: Any = CoreV1Api(api_client=ws_client).connect_get_namespaced_pod_exec
    return await connect(
        pod_name, namespace, command=command, container=container,
        stdout=True, stderr=not tty, stdin=stdin, tty=tty, _preload_content=False,
    )


class ExecVerbs:
    """Exec in the namespace's pods: short commands, streamed output, fed stdin."""

    _api: ApiClient
    namespace: str

    def _exec_client(self) -> WsApiClient:
        """A client for one exec (a websocket upgrade of its own), counted as a request."""
        REQUESTS_SENT["EXEC"] += 1
        client = WsApiClient(configuration=self._api.configuration)
        if not client.configuration.proxy:
            # Its websocket ignores the configured proxy and follows the environment's: only
            # where there is none may it stop looking (and clashing with a netrc login).
            without_environment_lookups(client)
        return client

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
                connection = await _open_exec(ws, pod_name, self.namespace, command, container, stdin=False)
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
        self, pod_name: str, command: list[str], container: str = wellknown.CONTAINER_NAME,
        terminal: asyncio.Queue[tuple[int, bytes]] | None = None, stdin: bytes | None = None,
        feed: asyncio.Queue[tuple[int, bytes]] | None = None,
    ) -> AsyncIterator[tuple[int, bytes]]:
        """Run `command` in the container and yield (1 or 2, bytes) as it writes to stdout or
        stderr, then (0, exit code as text) once it has ended (the exec status channel). `stdin`
        is written to its stdin first (the command must know its length: v4 cannot close stdin).
        With `terminal` the command gets a terminal (its output all comes as 1), fed from the
        queue: (0, bytes typed) and (4, a resize message) as the exec protocol's channels.
        Without one, `feed` is such a queue too, for the stdin of a command without a terminal
        (after `stdin`'s bytes).

        Raises ExecNotStarted when the exec was refused before it opened (a container not yet
        running, a kubelet or API server that failed the upgrade): the command did not run, so
        the caller may try again; any later error may come after the command started."""
        ws_client = self._exec_client()
        exit_code = b"1"
        started = False
        feeding: asyncio.Future[None] | None = None
        try:
            try:
                connection = await _open_exec(
                    ws_client, pod_name, self.namespace, command, container,
                    stdin=terminal is not None or stdin is not None or feed is not None,
                    tty=terminal is not None,
                )
                async with connection as ws:
                    # From here on the command may be running: an error is no longer "not started".
                    started = True
                    for start in range(0, len(stdin or b""), 65536):
                        await ws.send_bytes(b"\x00" + (stdin or b"")[start:start + 65536])
                    if (queue := terminal if terminal is not None else feed) is not None:
                        feeding = asyncio.ensure_future(_feed_terminal(ws, queue))
                    output = False
                    async for message in ws:
                        data = message.data if isinstance(message.data, bytes) else str(message.data).encode()
                        if not data:
                            continue
                        channel, payload = data[0], data[1:]
                        if channel in (1, 2) and payload:
                            output = True
                            yield channel, payload
                        elif channel == 3 and payload:
                            if not output and _runtime_could_not_start(payload):
                                # The runtime found no program to run (e.g. the agent's copy in
                                # the pod not in place yet, issue 22): nothing ran, try again.
                                raise ExecNotStarted(f"exec in pod {pod_name}: {_status_message(payload)}")
                            exit_code = _exit_code_of(payload)
            except (ApiException, aiohttp.ClientError, TimeoutError, OSError) as error:
                raise _exec_failure(error, pod_name, started) from error
        finally:
            if feeding is not None:
                feeding.cancel()
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
            connection = await _open_exec(
                ws_client, pod_name, self.namespace, command, container, stdin=True
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
        container: str = wellknown.CONTAINER_NAME, on_output: Callable[[bytes], None] | None = None,
    ) -> int:
        """Run `command` in the container and write what arrives in `feed` to its stdin as it
        comes, until a None; return its exit code. The command must know where its input ends (the
        v4 exec protocol cannot close stdin). Slow readers hold the writer: the websocket's send
        waits for the transport to drain. What it writes to stdout goes to `on_output`. Raises
        ExecNotStarted as exec_stream does (nothing was taken from `feed` then)."""
        ws_client = self._exec_client()
        code = b"1"
        started = False
        try:
            connection = await _open_exec(
                ws_client, pod_name, self.namespace, command, container, stdin=True
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
                        elif raw[:1] == b"\x01" and len(raw) > 1 and on_output is not None:
                            on_output(raw[1:])
                finally:
                    sender.cancel()
        except (ApiException, aiohttp.ClientError, TimeoutError, OSError) as error:
            raise _exec_failure(error, pod_name, started) from error
        finally:
            await ws_client.close()
        return int(code)


async def _feed_terminal(ws: Any, terminal: asyncio.Queue[tuple[int, bytes]]) -> None:
    """Send what the terminal queue holds to the exec's stdin (0) and resize (4) channels."""
    with contextlib.suppress(aiohttp.ClientError, OSError, ConnectionResetError):
        while True:
            channel, data = await terminal.get()
            await ws.send_bytes(bytes([channel]) + data)


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


def _runtime_could_not_start(status: bytes) -> bool:
    """The exec status says the runtime could not start the command (no exit code: it never ran),
    as runc words it ("exec failed: unable to start container process: ... no such file")."""
    try:
        parsed = json.loads(status)
    except ValueError:
        return False
    if not isinstance(parsed, dict) or parsed.get("status") == "Success":
        return False
    if any(cause.get("reason") == "ExitCode" for cause in (parsed.get("details") or {}).get("causes") or []):
        return False
    message = str(parsed.get("message") or "")
    return "unable to start container process" in message or "executable file not found" in message


def _status_message(status: bytes) -> str:
    """The message of an exec status (why the runtime could not run the command)."""
    try:
        return str(json.loads(status).get("message") or "")
    except (ValueError, AttributeError):
        return status.decode("utf-8", errors="replace")


def _exec_failure(error: Exception, pod_name: str, started: bool) -> Exception:
    """What an exec that failed raises: ExecNotStarted if the command surely never ran (tried
    again), else the API's refusal or KubeUnavailable."""
    what = f"exec in pod {pod_name}"
    failure: Exception = (error_for_status(error.status or 500, error.body or b"", what)
                          if isinstance(error, ApiException) else KubeUnavailable(f"cannot {what}: {error}"))
    if not started and _refused_before_running(error):
        return ExecNotStarted(str(failure))
    return failure
