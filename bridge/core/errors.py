"""Error classes shared by the clients: each failure is classified once.

Temporary errors are retried with backoff (network blips, 5xx, a restarting
apiserver); permanent ones are reported to the user or operator and not retried.
"""

from __future__ import annotations


class BridgeError(Exception):
    """Base of every error the bridge raises on purpose."""


class TemporaryError(BridgeError):
    """Worth retrying after a delay: the other side may recover on its own."""


class PermanentError(BridgeError):
    """Retrying cannot help: a person has to change something."""


class SlurmUnavailable(TemporaryError):
    """slurmctld or slurmrestd did not answer."""


class SlurmRefused(PermanentError):
    """slurmctld refused a request for good (a job it will not take); the message says why."""


class WorkloadError(ValueError):
    """A pod or gang of a managed namespace that cannot become a Slurm job; the message is for the
    pods' event."""


class SlurmAuthError(PermanentError):
    """slurmrestd refused our token (wrong, expired, or for the wrong user)."""


class KubeUnavailable(TemporaryError):
    """The Kubernetes API server did not answer."""


class ExecOutcomeUnknown(KubeUnavailable):
    """The exec did not answer in time: its command may have run (a signal sent), so running it
    again may do it twice."""


class ExecNotStarted(KubeUnavailable):
    """The exec was refused before its websocket opened (HTTP 500 from a kubelet that cannot
    reach the container yet, a 400 for a container not running, a dropped connection): its command
    never ran, so running it again is safe."""


class ExecCommandFailed(TemporaryError):
    """The exec's command exited non-zero (`ran`: the agent ran and says why by its exit `code`,
    named in core.agent_protocol; `output` is what it printed, for the logs only), or the runtime
    failed it (not `ran`: most often it could not start the command, so trying again is taken as
    safe)."""

    def __init__(self, message: str, code: int, output: str, ran: bool = True) -> None:
        super().__init__(message)
        self.code = code
        self.output = output
        self.ran = ran
