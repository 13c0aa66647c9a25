"""Serve PyslurmSlurmClient's verbs over stdin/stdout, one JSON object per line. Runs in the rootfs.

pyslurm loads the rootfs's libslurm, which needs the rootfs's glibc, so the client under test lives
in this process and the tests on the host talk to it (tests/contract/pyslurm_proxy.py).

Request:  {"verb": "open" | "close" | "changed_jobs" | "job" | "signal_job" | "set_comment", "args": [...]}
Reply:    {"result": ...} or {"error": {"type", "message", "errno"}}
`open` replaces the client with a fresh one (no remembered update time), as a new daemon would start.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, TextIO

from bridge.clients.slurm.pyslurm_backend import PyslurmSlurmClient
from tests.contract import wire


async def _dispatch(client: PyslurmSlurmClient, verb: str, args: list[Any]) -> Any:
    if verb == "changed_jobs":
        listing = await client.changed_jobs(*args)
        return None if listing is None else wire.listing_to_json(listing)
    if verb == "job":
        job = await client.job(*args)
        return None if job is None else wire.allocation_to_json(job)
    if verb == "signal_job":
        return await client.signal_job(*args)
    if verb == "set_comment":
        return await client.set_comment(*args)
    raise ValueError(f"unknown verb {verb!r}")


def serve(requests: TextIO, replies: TextIO) -> None:
    loop = asyncio.new_event_loop()
    client: PyslurmSlurmClient | None = None
    try:
        for line in requests:
            request = json.loads(line)
            verb, args = request["verb"], request.get("args", [])
            try:
                if verb in ("open", "close") and client is not None:
                    loop.run_until_complete(client.close())
                    client = None
                if verb == "open":
                    client = PyslurmSlurmClient()
                    result = None
                elif verb == "close":
                    result = None
                elif client is None:
                    raise RuntimeError(f"{verb} before open")
                else:
                    result = loop.run_until_complete(_dispatch(client, verb, args))
                reply: dict[str, Any] = {"result": result}
            except Exception as error:  # every failure goes back to the test, which judges it
                reply = {"error": wire.error_to_json(error)}
            replies.write(json.dumps(reply) + "\n")
            replies.flush()
    finally:
        if client is not None:
            loop.run_until_complete(client.close())
        loop.close()


def main() -> None:
    # The protocol owns stdout; anything else printed (logs) goes to stderr.
    replies, sys.stdout = sys.stdout, sys.stderr
    serve(sys.stdin, replies)


if __name__ == "__main__":
    main()
