"""Slurm's own commands for the batch script in the pod (`scontrol`, `squeue`, `sbatch`, `scancel`,
`sacct`, `sinfo`). The pod's command asks through the daemon's attach stream; the daemon checked
it (or says why it refused it); this checks it again (core.slurm_commands) and runs Slurm's real
binary here, as the job's user: by absolute path, no shell, a fixed environment, the arguments
as checked, sbatch's script text on stdin and the job's variables through --export-file on a
memfd, bounded output and time. Its output and exit code go back to the pod's command through the
step-output relay (relay.py), or step-done should the relay fail. Nothing the user chose runs
here: the binary is Slurm's, and no argument may make it read a file or run a program here."""

from __future__ import annotations

import contextlib
import os

import bridge.core.slurm_commands as slurm_commands
from bridge.core.slurm_commands import Refused
from bridge.waiter.environment import SAFE_ENVIRONMENT
from bridge.waiter.relay import Bounds, StepOutputRelay, run_relayed
from bridge.waiter.steps import root_controlled

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

MAX_CONCURRENT_COMMANDS = 32
"""Slurm commands a waiter runs at once (each is a process here and RPCs to slurmctld)."""
OUTPUT_LIMIT = 64 * 1024 * 1024
"""Bytes of a command's output relayed before it is stopped (sacct of a busy cluster is large)."""
TIME_LIMIT_S = 3600.0
"""A command still running after this is stopped (squeue -i, sbatch --wait of a long job)."""


def command_binary(command: str) -> str:
    """Slurm's binary by absolute path, never from the job's PATH."""
    for directory in slurm_commands.BINARY_DIRS:
        path = f"{directory}/{command}"
        if os.access(path, os.X_OK):
            return path
    raise OSError(f"{command} is not installed on this host (looked in "
                  f"{', '.join(slurm_commands.BINARY_DIRS)})")


def command_environment(command: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The binary's environment: fixed, nothing of the user's (no LD_*, SQUEUE_FORMAT, SBATCH_*):
    a PATH and locale, SLURM_CONF only if root owns it, and for scontrol the job's node list
    (`scontrol show hostnames` with no list reads it), which slurmstepd set for this batch step."""
    env = dict(SAFE_ENVIRONMENT)
    conf = environ.get("SLURM_CONF", "")
    if conf.startswith("/") and root_controlled(conf):
        env["SLURM_CONF"] = conf
    if command == "scontrol" and environ.get("SLURM_JOB_NODELIST"):
        env["SLURM_JOB_NODELIST"] = environ["SLURM_JOB_NODELIST"]
    return env


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)  # not inheritable: passed on by pass_fds or as stdin only
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class ScriptCommands:
    """The Slurm commands one batch waiter runs for its script: which keys were started (a request
    seen again after a reconnect is not run twice) and how many run now."""

    def __init__(self, url: tuple[str, str, int], job_id: int, ca_file: str | None,
                 done: Callable[[str, int], None]) -> None:
        self._url, self._job_id, self._ca_file = url, job_id, ca_file
        self._done = done
        self._started: set[str] = set()
        self.active = 0

    def start(self, event: dict[str, Any]) -> None:
        """The daemon passed a command request on (or its refusal): run it, or say why not, on
        the pod's command's stderr."""
        import threading  # only for jobs that use Slurm commands

        try:
            key = str(int(event["key"]))
        except (KeyError, TypeError, ValueError):
            return
        if key in self._started:
            return
        self._started.add(key)
        refusal = event.get("refused")
        prepared = None
        if not isinstance(refusal, str):
            refusal = None
            try:
                request = slurm_commands.parse_request(str(event.get("data")))
                prepared = slurm_commands.prepare_request(request)
            except Refused as error:
                refusal = str(error)
            except ValueError as error:
                refusal = f"slurm-k8s-bridge: {error}"
        if prepared is not None and self.active >= MAX_CONCURRENT_COMMANDS:
            refusal = f"{prepared.command}: more than {MAX_CONCURRENT_COMMANDS} Slurm commands at once"
        self.active += 1
        threading.Thread(target=self._run, args=(key, prepared, refusal), name=f"command-{key}",
                         daemon=True).start()

    def _run(self, key: str, prepared: slurm_commands.Prepared | None, refusal: str | None) -> None:
        relay = StepOutputRelay(self._url, self._job_id, key, self._ca_file)
        try:
            if prepared is None or refusal is not None:
                relay.open()
                relay.send(2, f"{refusal}\n".encode())
                relay.finish(1)
                code = 1
            else:
                code = self._execute(prepared, relay)
        finally:
            self.active -= 1
        if not relay.delivered:
            self._done(key, code)

    def _execute(self, prepared: slurm_commands.Prepared, relay: StepOutputRelay) -> int:
        fds: list[int] = []
        try:
            try:
                binary = command_binary(prepared.command)
            except OSError as error:
                relay.open()
                relay.send(2, f"{prepared.command}: error: {error}\n".encode())
                relay.finish(1)
                return 1
            argv = [binary]
            stdin = os.open("/dev/null", os.O_RDONLY)
            fds.append(stdin)
            pass_fds: tuple[int, ...] = ()
            if prepared.export is not None:
                export = _memfd("sbatch-export", slurm_commands.export_file_bytes(prepared.export))
                fds.append(export)
                os.set_inheritable(export, True)
                pass_fds = (export,)
                argv.append(f"--export-file={export}")  # ours: the user's is refused
            if prepared.stdin is not None:
                stdin = _memfd("sbatch-script", prepared.stdin)
                fds.append(stdin)
            argv += prepared.argv
            env = command_environment(prepared.command, os.environ)
            return run_relayed(argv, env, relay, stdin=stdin, pass_fds=pass_fds,
                               bounds=Bounds(OUTPUT_LIMIT, TIME_LIMIT_S))
        except (OSError, ValueError) as error:
            relay.send(2, f"{prepared.command}: error: {error}\n".encode())
            relay.finish(1)
            return 1
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
