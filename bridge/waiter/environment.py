"""The job's environment as the waiter takes it, and the fixed one its own helpers get. The waiter
runs on the slurmd host as the user, so nothing it starts may be steered by what the user shapes:
the SPANK step guard holds every variable but SLURM_* out of its way, and this gives them back to
the pods under their own names. Used by the batch waiter (attach), munge and the step launcher."""

from __future__ import annotations

HELD_PREFIX = "SLURM_K8S_BRIDGE_HELD_"
"""The SPANK step guard moves every variable but SLURM_* out of the waiter's way under this
prefix (LD_PRELOAD, OPENSSL_CONF, ... would steer the loader or libcrypto); the pods get them
back under their own names."""
HELD_MARKER = "SLURM_K8S_BRIDGE_ENV_HELD"
"""Set by the guard once it has held the environment."""
SAFE_ENVIRONMENT = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
"""What the waiter's own helpers (munge, Slurm's srun) run with: nothing of the user's."""


def job_environment(environ: dict[str, str]) -> dict[str, str]:
    """The job's environment as the user exported it: held variables get their names back. Where
    the guard held the environment, any other variable but SLURM_* is the waiter's own (Python's
    C locale coercion sets LC_CTYPE), not the user's, and stays out."""
    guarded = environ.get(HELD_MARKER) == "1"
    held = {k[len(HELD_PREFIX):]: v for k, v in environ.items() if k.startswith(HELD_PREFIX)}
    env = {k: v for k, v in environ.items()
           if not k.startswith(HELD_PREFIX) and k != HELD_MARKER and (not guarded or k.startswith("SLURM_"))}
    env.update({k: v for k, v in held.items() if k})
    return env
