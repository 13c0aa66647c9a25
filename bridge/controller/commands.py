"""Slurm's commands from inside the pod (`scontrol`, `squeue`, `sbatch`, `scancel`, `sacct`,
`sinfo`): the agent in the first pod frames each request ("c <base64>", keys shared with srun's
steps); the log relay hands it here. This checks it (core.slurm_commands: the allow-list, the
sizes, one answer per key) and turns the event into what the waiter acts on: the request to run,
or the refusal to write to the command's stderr. Either way the key is booked as open in the
run's StepBook (through Steps, its owner), so that the waiter's output stream for it
(controller.step_streams) and its end (step-done) reach the waiting command in the pod.

Owns nothing of its own: the keys live in the StepBook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bridge.controller.steps import MAX_OPEN_STEPS, Steps
from bridge.core import slurm_commands
from bridge.core.slurm_commands import Refused, parse_request, prepare_request

if TYPE_CHECKING:
    from bridge.controller.sessions import JobSession


class Commands:
    def __init__(self, steps: Steps) -> None:
        self._steps = steps

    def register(self, session: JobSession, event: dict[str, Any], bound: Any) -> None:
        """Check a command request from the pod and rewrite `event` for the waiter: "command" with
        the key and the request (still encoded), or with a `refused` reason instead."""
        data = str(event.pop("data", ""))
        try:
            request = parse_request(data)
        except ValueError as error:
            bound.warning("command.bad_request", error=str(error))
            event.clear()
            event.update(type="heartbeat")  # no key to answer: nothing the waiter should act on
            return
        key, command = request["key"], request["command"]
        if self._steps.answered(session, key):
            # Seen before (a relay replaying after a re-attach, or a frame forged with a used
            # key): never answered twice.
            bound.warning("command.replayed", key=key, command=command)
            event.clear()
            event.update(type="heartbeat")
            return
        refusal = None
        if len(data) > slurm_commands.MAX_REQUEST_BYTES:
            refusal = f"{command}: the request exceeds {slurm_commands.MAX_REQUEST_BYTES // 1024} KiB"
        elif self._steps.open_count(session) >= MAX_OPEN_STEPS:
            refusal = f"{command}: more than {MAX_OPEN_STEPS} job steps and Slurm commands at once"
        else:
            try:
                prepare_request(request)
            except Refused as error:
                refusal = str(error)
        # Open either way: the refusal too reaches the command's stderr through the output stream.
        self._steps.open_command(session, key, command, request["cwd"])
        event.update(type="command", key=key, command=command)
        if refusal is not None:
            bound.warning("command.refused", key=key, command=command, reason=refusal)
            event["refused"] = refusal
        else:
            bound.info("command.requested", key=key, command=command, argv=request["argv"][:20])
            event["data"] = data
