"""Handles on the running sandbox for end-to-end tests: Slurm CLI, REST, Kubernetes.

Everything here talks to the real daemons started by `make sandbox-up`.
"""

from __future__ import annotations

import fcntl
import functools
import json
import operator
import os
import re
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[2]
SANDBOX_SCRIPT = REPO / "containers" / "sandbox" / "sandbox.sh"

T = TypeVar("T")


@contextmanager
def one_starter() -> Iterator[None]:
    """Test workers running at once (pytest-xdist) start the sandbox or the daemon one at a time:
    the first starts it, the others then find it up."""
    with open("/tmp/slurm-k8s-bridge-e2e-start.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def sandbox_env() -> dict[str, str]:
    """The exports `make sandbox-env` prints, parsed into a dict."""
    out = subprocess.run([str(SANDBOX_SCRIPT), "env"], check=True, capture_output=True, text=True).stdout
    env: dict[str, str] = {}
    for line in out.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export ") :].partition("=")
            value = value.strip('"')
            if key == "PATH":
                value = value.replace("$PATH", os.environ.get("PATH", ""))
            env[key] = value
    return env


def wait_until(what: str, probe: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.2) -> T:
    """Poll `probe` until it returns something truthy; fail with `what` on timeout."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


STEPD_CANCEL_LINE = re.compile(
    r"^\[[\d\-T:.]+\] error: \*\*\* (JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ (.*) \*\*\*$", re.MULTILINE)
SRUN_TASK_NODE = re.compile(r"srun: error: \S+: task")


def cancelled_lines_alike(text: str) -> list[str]:
    """A cancelled job's file as lines, sorted, with slurmstepd's "*** JOB|STEP ... CANCELLED ***"
    and srun's "srun: error: NODE: task" lines freed of the job, node and time that differ between
    partitions: slurmstepd's and srun's lines interleave with the tasks' in no fixed order,
    natively too."""
    text = SRUN_TASK_NODE.sub("srun: error: <node>: task", STEPD_CANCEL_LINE.sub(r"<\1 cancelled \2>", text))
    return sorted(text.splitlines())


def within_natives_span(case: Sequence[list[str]], natives: Sequence[Sequence[list[str]]]) -> bool:
    """Whether each part of a bridged run (its sacct rows, its lines, ...) is native's: all that every
    native run had, and nothing that no native run had. Native's runs of one job nearly always agree,
    and then this is equality; under load one of srun's own lines now and then comes or goes
    natively (a CI run's three native jobs disagreed), and the bridge is held to the span of what
    native did. Counted: a line twice is not the line once."""
    for part in range(len(case)):
        counts = [Counter(native[part]) for native in natives]
        every, any_ = functools.reduce(operator.and_, counts), functools.reduce(operator.or_, counts)
        if not every <= Counter(case[part]) <= any_:
            return False
    return True


def at_once(variants: Mapping[str, Callable[[], T]]) -> dict[str, T]:
    """Run each variant (a native run and a bridged one, say, on nodes of their own) in a thread of
    its own, so that their waits on Slurm's timers overlap; every variant runs to its end. A
    variant that failed is named in the failure, with what it raised."""
    with ThreadPoolExecutor(max_workers=len(variants)) as pool:
        futures = {name: pool.submit(variant) for name, variant in variants.items()}
    failed = {name: error for name, future in futures.items() if (error := future.exception()) is not None}
    if failed:
        detail = "\n".join(f"[{name}] {type(error).__name__}: {error}" for name, error in failed.items())
        raise AssertionError(f"{', '.join(failed)} failed:\n{detail}") from next(iter(failed.values()))
    return {name: future.result() for name, future in futures.items()}


WORKER_TERMINAL_SIZE = frozenset({"COLUMNS", "LINES"})


@dataclass(frozen=True)
class Sandbox:
    env: dict[str, str]

    def environ(self) -> dict[str, str]:
        # pytest-xdist's workers export COLUMNS=80 and LINES=24; srun hands them to its tasks, and
        # busybox (the bridged image's stty, ash) prefers them to the terminal's own size.
        return {**{k: v for k, v in os.environ.items() if k not in WORKER_TERMINAL_SIZE}, **self.env}

    def slurm(
        self, cmd: str, *args: str, user: str = "root", cwd: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command from the host shell, as `user` (via runuser)."""
        argv: Sequence[str] = [cmd, *args]
        if user != "root":
            argv = ["runuser", "-u", user, "--", *argv]
        return subprocess.run(
            argv, env=self.environ(), cwd=cwd, check=check, capture_output=True, text=True, timeout=60
        )

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", *args], env=self.environ(), check=check, capture_output=True, text=True, timeout=60
        )

    def kubectl_create(self, manifest: dict[str, Any]) -> None:
        subprocess.run(
            ["kubectl", "create", "-f", "-"], input=json.dumps(manifest), env=self.environ(),
            check=True, capture_output=True, text=True, timeout=60,
        )

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def service_account_kubeconfig(self, namespace: str, account: str, path: Path) -> Path:
        """A kubeconfig at `path` for the sandbox's API server that acts as a ServiceAccount."""
        token = self.kubectl("create", "token", account, "-n", namespace).stdout.strip()
        cluster = self.kubectl("config", "view", "-o", "jsonpath={.clusters[0].name}").stdout.strip()
        path.write_text(Path(self.kubeconfig).read_text())
        for args in (["set-credentials", account, f"--token={token}"],
                     ["set-context", account, "--cluster", cluster, f"--user={account}"],
                     ["use-context", account]):
            subprocess.run(["kubectl", "config", "--kubeconfig", str(path), *args],
                           check=True, capture_output=True, env=self.environ())
        return path

    @property
    def rest_url(self) -> str:
        return self.env["SLURMRESTD_URL"]

    @property
    def control_ip(self) -> str:
        """The host's address as pods see it."""
        return self.env["SBX_CONTROL_IP"]

    @property
    def kubeconfig(self) -> str:
        return self.env["KUBECONFIG"]

    def token(self, user: str, lifespan_s: int = 3600) -> str:
        """A slurmrestd JWT for `user`, minted by `scontrol token` as root."""
        out = self.slurm("scontrol", "token", f"username={user}", f"lifespan={lifespan_s}").stdout
        return out.strip().removeprefix("SLURM_JWT=")

    def home(self, user: str) -> Path:
        return Path("/home") / user

    def sbatch(self, *args: str, user: str = "alice", cwd: str | None = None) -> int:
        """Submit as `user` from their shared home; return the job id."""
        out = self.slurm("sbatch", "--parsable", *args, user=user, cwd=cwd or str(self.home(user))).stdout
        return int(out.strip().split(";")[0])

    def sacct_line(self, job_id: int) -> dict[str, str] | None:
        """The job's allocation line from sacct once it has a final state, else None."""
        fields = "JobID,User,Account,Partition,State,ExitCode,NodeList"
        out = self.slurm("sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", fields).stdout
        for line in out.splitlines():
            row = dict(zip(fields.split(","), line.split("|"), strict=True))
            if row["JobID"] == str(job_id) and row["State"] not in ("PENDING", "RUNNING", "REQUEUED"):
                return row
        return None

    def wait_job_final(self, job_id: int, timeout: float = 60.0) -> dict[str, str]:
        return wait_until(f"job {job_id} to finish in sacct", lambda: self.sacct_line(job_id), timeout)

    def array_rows(self, job_id: int, tasks: int) -> list[str] | None:
        """`State|ExitCode` of each task of array `job_id` once all `tasks` have a final state in
        sacct, else None (for wait_until)."""
        out = self.slurm("sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", "State,ExitCode").stdout
        rows = out.split()
        if len(rows) != tasks or any(row.split("|")[0] in ("PENDING", "RUNNING", "REQUEUED") for row in rows):
            return None
        return rows


BRIDGE_UP = REPO / "containers" / "bridge" / "up.sh"
DAEMON_LOG = Path("/var/lib/slurm-k8s-sandbox/log/bridge.log")


def daemon_log_size() -> int:
    return DAEMON_LOG.stat().st_size if DAEMON_LOG.exists() else 0


def daemon_log_since(offset: int) -> list[str]:
    """The lines the host daemon logged from `offset` on (from the start if a restart truncated it)."""
    try:
        with DAEMON_LOG.open("rb") as log:
            log.seek(offset if offset <= DAEMON_LOG.stat().st_size else 0)
            return log.read().decode(errors="replace").splitlines()
    except OSError:
        return []
SANDBOX_LOGS = Path("/var/lib/slurm-k8s-sandbox/log")


def job_trail(job_id: int, lines_per_log: int = 30) -> str:
    """What the daemon, slurmctld and the slurmds logged about one job: put in a failing test's
    output, it tells a CI failure's cause without the machine (which CI tears down)."""
    patterns = (f'"job_id": {job_id},', f"JobId={job_id} ", f"StepId={job_id}.", f"job {job_id} ",
                f"JobId={job_id}\n", f"slurm-{job_id}-")
    parts = []
    for log in sorted(SANDBOX_LOGS.glob("*.log")):
        if not (log.name.startswith(("bridge", "slurmctld", "slurmd", "kubelet"))):
            continue
        try:
            with log.open(errors="replace") as lines:
                hits = [line.rstrip("\n")[:400] for line in lines if any(p in line for p in patterns)]
        except OSError:
            continue
        if hits:
            parts.append(f"--- {log.name} ({len(hits)} lines, last {lines_per_log})")
            parts.extend(hits[-lines_per_log:])
    return "\n".join(parts) or f"(no log lines about job {job_id})"
JOB_NAMESPACE = "slurm-jobs"


def job_pods(sandbox: Sandbox, job_id: int) -> list[dict[str, Any]]:
    """The bridge's pods of one Slurm job, as the API server has them now."""
    return sandbox.kubectl_json(
        "get", "pods", "-n", JOB_NAMESPACE, "-l", f"slurm-k8s-bridge/job-id={job_id}"
    )["items"]


def write_script(sandbox: Sandbox, user: str, name: str, body: str) -> Path:
    """A batch script in the user's shared home, written by them: root writing there would follow
    whatever link the user left at that name (to /etc/passwd, say)."""
    path = sandbox.home(user) / name
    subprocess.run(["runuser", "-u", user, "--", "sh", "-c", 'cat > "$1"', "sh", str(path)],
                   input=body, check=True, capture_output=True, text=True, timeout=60)
    return path
