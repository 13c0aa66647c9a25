"""Signals that come while the waiter (or a task proxy) starts, before it can act on them. The SPANK
step guard blocks HELD_SIGNALS when it starts the waiter (slurm_spank_task_init); the waiter's first
act is to keep them in order and unblock them, and it acts on them once its real handlers are set.
Used by main (batch waiter) and task (task proxy)."""

from __future__ import annotations

import signal

from bridge.core.waiter_protocol import FORWARDED

HELD_SIGNALS = frozenset(FORWARDED)
"""Blocked by the step guard when it starts the waiter (slurm_spank_task_init): one of these that
comes while Python starts waits, pending, until main() has handlers for it and unblocks them (its
default action would end the waiter, and the job with it, before the script even started).
SIGTERM and SIGINT are not held: a site's TaskProlog runs with the guard's mask too, and an early
TERM that ends the waiter ends the job as the cancel or time limit it stands for."""
EARLY_KEPT = HELD_SIGNALS | {signal.SIGTERM, signal.SIGINT}


def hold_early_signals() -> list[int]:
    """Keep, in order, the signals that come before the waiter can act on them, and unblock what
    the step guard blocked for the waiter's start: every later process (munge, srun) starts
    with none blocked."""
    early: list[int] = []
    for signum in EARLY_KEPT:
        signal.signal(signum, lambda number, _frame: early.append(number))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, EARLY_KEPT)
    return early


def take_early_signals(early: list[int] | None) -> list[int]:
    """The kept signals, once the real handlers are set (the list is emptied)."""
    if not early:
        return []
    taken = list(early)
    del early[:len(taken)]
    return taken
