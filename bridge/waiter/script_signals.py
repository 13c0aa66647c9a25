"""The signals Slurm sends the batch script (scancel -s SIG --batch, --signal=B:SIG@TIME), on their
way to the script in the pods: each is kept until the daemon took it, and then until the daemon
reports it delivered, so that none is lost to a waiter that has not attached yet, a daemon that
answered 503 for a moment, or one that restarted (or failed over) before the pod got it. Owned by
the batch waiter (attach.Waiter); the daemon's side is the signal endpoint of bridge/manager/api.py."""

from __future__ import annotations

import signal

from bridge.core.waiter_protocol import FORWARDED
from bridge.waiter.http_client import DaemonError
from bridge.waiter.output import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from bridge.waiter.http_client import PostAction


class ScriptSignals:
    """The one owner of the script's signals not yet delivered. Its methods run in signal handlers
    too: one that interrupts a send only adds its signal, which the send in progress takes along,
    so the daemon gets them in order."""

    def __init__(self, post: PostAction) -> None:
        self._post = post
        # Not taken by the daemon yet, by sequence number: kept until it takes them (its answer to
        # /signal, or the next attach, which carries them).
        self._unsent: dict[int, int] = {}
        # ... and, by signal, the newest sequence number it took but has not reported delivered
        # ("signal-done"): a daemon that restarts before it delivered one gets it again with the
        # next attach. One per kind: the daemon keeps a signal pending once, so the newest stands
        # for the older ones of its kind.
        self._undelivered: dict[int, int] = {}
        self._seq = 0
        self._sending = False

    @property
    def unsent(self) -> bool:
        """Some signal waits for the daemon to take it."""
        return bool(self._unsent)

    def forward(self, signum: int) -> None:
        """Pass a signal on to the script in the pods (the daemon runs the agent there)."""
        if int(signum) not in self._unsent.values():  # pending once, as in the kernel
            self._seq += 1
            self._unsent[self._seq] = int(signum)
        self.send()

    def send(self) -> None:
        """Send the signals the daemon has not taken, oldest first; stop at the first that it
        cannot take now (not attached yet: 409; an outage): the next attach or heartbeat tries
        again. The sequence number lets the daemon drop one it took already."""
        if self._sending:
            return
        self._sending = True
        try:
            taken_all = self._send_kept()
        finally:
            self._sending = False
        if taken_all and self._unsent:
            self.send()  # one came between the last send and the flag's reset

    def _send_kept(self) -> bool:
        """True when the daemon took every kept signal, False at the first it could not take."""
        while self._unsent:
            seq = min(self._unsent)
            body = {"signal": self._unsent[seq], "seq": seq}
            try:
                self._post("signal", body, 10).close()
            except DaemonError as error:
                if 400 <= error.status < 500 and error.status != 409:
                    say(f"the bridge refused signal {body['signal']}: {error.text}")
                    self._unsent.pop(seq, None)
                    continue
                return False
            except OSError:
                return False
            self._taken(seq, self._unsent.pop(seq))
        return True

    def _taken(self, seq: int, signum: int) -> None:
        self._undelivered[signum] = max(seq, self._undelivered.get(signum, 0))

    def for_attach(self) -> list[tuple[int, int]]:
        """The signals an attach carries, as [seq, signal]: every one not taken yet, and the
        newest of each kind taken but not reported delivered."""
        kept = {seq: signum for signum, seq in list(self._undelivered.items())}
        kept.update(self._unsent)
        return sorted(kept.items())

    def taken_with_attach(self, signals: list[tuple[int, int]]) -> None:
        """The daemon accepted an attach that carried `signals`: its session took them; they are
        done once it says they were delivered."""
        for seq, signum in signals:
            self._unsent.pop(seq, None)
            self._taken(seq, signum)

    def delivered(self, signum: object, seq: object) -> None:
        """The daemon delivered (or could never deliver) `signum` taken as `seq`: that one and
        the older ones of its kind, which it stood for, are done."""
        if not isinstance(signum, int) or not isinstance(seq, int):
            return
        # Held meanwhile: a handler that sends one (and changes these dicts) waits till after.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
        try:
            if self._undelivered.get(signum, seq + 1) <= seq:
                del self._undelivered[signum]
            for kept, kind in list(self._unsent.items()):
                if kind == signum and kept <= seq:
                    self._unsent.pop(kept, None)  # its /signal went through, its answer did not
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
