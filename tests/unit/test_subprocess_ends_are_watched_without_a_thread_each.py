"""Measured on the sandbox: a burst of 300 attaches ran up to 64 unmunge processes at once, and
Python 3.11's default child watcher parks one thread in waitpid per child. Those threads passed
the GIL around on a starved host while the event loop's timers ran 8 s late (an outside probe
process saw no lag), and the Lease was lost. The daemon watches its children through pidfds on
the loop instead."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_the_daemon_spawns_its_subprocesses_without_a_thread_each() -> None:
    # A fresh interpreter: the child watcher is process-wide state.
    program = textwrap.dedent("""
        import asyncio, threading
        from bridge.manager.process_health import watch_children_without_threads

        async def main():
            most = threading.active_count()
            procs = [await asyncio.create_subprocess_exec("sleep", "0.3") for _ in range(20)]
            most = max(most, threading.active_count())
            codes = [await p.wait() for p in procs]
            print(watch_children_without_threads.__name__, most, codes.count(0))

        used = watch_children_without_threads()
        asyncio.run(main())
        print("pidfd" if used else "default")
    """)
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True,
                         timeout=60).stdout.split()

    if sys.version_info < (3, 12):
        assert out[-1] == "pidfd", "this kernel has pidfd_open: it must be used"
    assert int(out[1]) <= 2, f"{out[1]} threads while 20 children ran"
    assert int(out[2]) == 20

