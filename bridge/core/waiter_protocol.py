"""What the daemon and the job-side waiter agree on, byte for byte: the digest a waiter's munge
credential carries, the signals a batch script may be sent through the bridge, and the signed
frames of a step's output stream. The API (bridge/manager/api.py) imports it; the
compiled waiter (agent/internal/waiter/protocol.go) is held to the same bytes by the unit tests.

Pure and standard library only: no hashlib (OpenSSL) for the digest that every request carries,
SHA-256 comes from Python's own module where there is one.
"""

from __future__ import annotations

import signal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DIGEST_PREFIX = "slurm-k8s-bridge-v1:"
"""Names the digest's layout: a daemon refuses a credential that carries any other."""

FORWARDED = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)
"""Signals Slurm sends the batch script (scancel -s SIG --batch, --signal=B:SIG@TIME) that the
waiter passes on to the script in the pods. SIGTERM may stop the job instead (the waiter's cancel:
ApiFacade.term_from_slurm decides); SIGKILL and SIGSTOP cannot be caught."""

USAGE_FD = 3
"""The task stream's "fd" of a line of what the task used (agent/task_wait.go), for its proxy to
hand to Slurm's accounting: not output (a proxy writes only fds 1 and 2)."""

MAX_OUTPUT_FRAME = 64 * 1024
"""Bytes of srun output in one frame of a step's output stream (the daemon refuses more)."""


def request_digest(method: str, path: str, job_id: int, body: bytes) -> str:
    """What the munge credential of a request carries: it binds the credential to this one request
    (a captured credential is refused for another job, path or body). The daemon checks it."""
    digest = sha256(f"{method}\n{path}\n{job_id}\n".encode())
    digest.update(body)
    return DIGEST_PREFIX + digest.hexdigest()


def sha256(data: bytes) -> Any:
    """A SHA-256 hash object from Python's own implementation, which loads no OpenSSL: `_sha2`
    since Python 3.12, `_sha256` before. hashlib only where neither is built."""
    try:
        from _sha2 import sha256 as new  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        try:
            from _sha256 import sha256 as new  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            from hashlib import sha256 as new
    return new(data)


def sign_output_frame(stream_key: bytes, seq: int, fd: int, data: bytes) -> bytes:
    """One frame of a step's output stream: fd (1, 2, or 0 for the end, whose data is srun's exit
    code), a 4-byte length, the data, then an HMAC-SHA256 under the key the stream's munge
    credential carries, over the frame's sequence number and content (nothing can be replayed,
    reordered, dropped unseen or changed on the way)."""
    import hashlib  # only for jobs that use srun (hmac imports it anyway)
    import hmac

    head = bytes([fd]) + len(data).to_bytes(4, "big")
    mac = hmac.new(stream_key, seq.to_bytes(8, "big") + head + data, hashlib.sha256).digest()
    return head + data + mac
