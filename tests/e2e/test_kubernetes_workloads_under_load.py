"""Kubernetes workloads scheduled by Slurm under load (issue 20's Load bar): 50 batch/v1 Jobs of 4 pods
each (200 pods) in the kwok partition `sim`, created at once by alice and bob in their managed
namespaces, every 5th one's pods exiting 3, while the daemon is killed -9 and started again; and a
smaller run beside sbatch jobs in the same partition, with no fault.

For every Job, whatever the fault:
- exactly one Slurm job (by its name `<namespace>/<Job>`, and by the gang its comment names), of the
  namespace's user and account, COMPLETED 0:0 or FAILED 3:0, and the Job Complete or Failed to match;
- each pod bound once (one `pod.bound` line of the daemon), on a node of its job's NodeList, only
  after Slurm started the job;
- nothing left pending in Slurm, and no Slurm job of a gang without its Kubernetes Job.

Wall times are printed (run with -s), never asserted: these machines are shared and noisy."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import bridge_ready
from tests.e2e.sandbox import BRIDGE_UP, SANDBOX_LOGS, Sandbox, job_trail, wait_until, write_script

pytestmark = pytest.mark.e2e

DAEMON_LOG = SANDBOX_LOGS / "bridge.log"
DAEMON_PID = Path("/var/lib/slurm-k8s-sandbox/run/bridge.pid")
TEAMS = {"team-alice": ("alice", "lab_alice"), "team-bob": ("bob", "lab_bob")}
"""Managed namespace -> (Slurm user, account), as containers/bridge/common.sh maps them."""
RUN_LABEL = "e2e.slurm-k8s-bridge/load-run"
"""On the Jobs and their pods: what one run created, for the checks and the cleanup."""
SLURM_JOB = "slurm-k8s-bridge/slurm-job-id"
MARKER = "slurm-k8s-bridge workload"
"""The first words of the comment of every job the daemon submits for a gang."""
IMAGE = "sandbox.local/busybox:1"
SLACK = timedelta(seconds=1)
"""sacct's Start and the API server's condition times are whole seconds."""
OPEN_STATES = ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED", "SUSPENDED", "RESIZING")
SACCT_FIELDS = ("JobID", "JobName", "User", "Account", "Partition", "State", "ExitCode", "NodeList",
                "Start", "End")


@dataclass(frozen=True)
class JobSpec:
    """One batch/v1 Job of a run."""

    namespace: str
    name: str
    pods: int
    exit_code: int
    run_time: str
    """kwok's delay before each pod ends (containers/kube/kwok.yaml): a Go duration."""
    cpu: str

    @property
    def key(self) -> str:
        """`<namespace>/<name>`: also the name of its Slurm job."""
        return f"{self.namespace}/{self.name}"

    @property
    def expected(self) -> tuple[str, str]:
        return ("COMPLETED", "0:0") if self.exit_code == 0 else ("FAILED", f"{self.exit_code}:0")


@dataclass
class Run:
    """What one test created, and where it started reading the daemon's log."""

    sandbox: Sandbox
    run: str
    specs: dict[str, JobSpec] = field(default_factory=dict)
    created: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Job key -> the Job as the API server returned it on create (its uid names its gang)."""
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    log_offset: int = 0
    sbatch: dict[int, tuple[str, int]] = field(default_factory=dict)
    """sbatch job id -> (user, exit code asked of kwok)."""

    def gang(self, key: str) -> str:
        """The gang key the daemon gives a Job's pods (bridge.core.workloads.trim_pod)."""
        return f"{self.specs[key].namespace}/job/{self.created[key]['metadata']['uid']}"


@pytest.fixture
def load_run(bridge: Sandbox) -> Iterator[Run]:
    """A run of its own name; whatever it made is deleted afterwards, pass or fail: the Jobs and pods
    (by label), the sbatch jobs, and any Slurm job still queued under one of its Jobs' names (a
    duplicate the daemon left behind must not hold sim's nodes for the next test)."""
    run = Run(bridge, uuid.uuid4().hex[:6])
    yield run
    for namespace in TEAMS:
        for kind in ("jobs", "pods"):
            bridge.kubectl("delete", kind, "-n", namespace, "-l", f"{RUN_LABEL}={run.run}", "--wait=false",
                           "--ignore-not-found", check=False)
    leftovers = [row["JobID"] for row in squeue_rows(bridge)
                 if row["State"] in OPEN_STATES and (row["JobName"] in run.specs
                                                    or int(row["JobID"]) in run.sbatch)]
    if leftovers:
        bridge.slurm("scancel", *leftovers, check=False)
    for namespace in TEAMS:
        def gone(namespace: str = namespace) -> bool:
            return not labelled(run, "pods", namespace)

        wait_until(f"the run's pods gone from {namespace}", gone, timeout=120, interval=1)


# -- what the run creates ---------------------------------------------------------------------------

def job_manifest(spec: JobSpec, run: str) -> dict[str, Any]:
    """All of a Job's pods at once (parallelism = completions), no retry: one gang, one Slurm job."""
    annotations = {
        "slurm-k8s-bridge/partition": "sim",
        "pod-complete.stage.kwok.x-k8s.io/delay": spec.run_time,
        "pod-complete.stage.kwok.x-k8s.io/exit-code": str(spec.exit_code),
    }
    # A pod runs as its Slurm job's user or not at all (bridge.core.workloads.unsafe): the namespace's
    # user's uid and gid, as Slurm and this host know them.
    user = pwd.getpwnam(TEAMS[spec.namespace][0])
    container = {"name": "main", "image": IMAGE, "command": ["true"],
                 "resources": {"requests": {"cpu": spec.cpu, "memory": "16Mi"},
                               "limits": {"cpu": spec.cpu, "memory": "16Mi"}},
                 "securityContext": {"runAsUser": user.pw_uid, "runAsGroup": user.pw_gid,
                                     "runAsNonRoot": True, "allowPrivilegeEscalation": False}}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": spec.name, "labels": {RUN_LABEL: run}},
        "spec": {"parallelism": spec.pods, "completions": spec.pods, "backoffLimit": 0,
                 "template": {"metadata": {"labels": {RUN_LABEL: run}, "annotations": annotations},
                              "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                                       "containers": [container]}}},
    }


def specs_of(run: str, count: int, pods: int, bob_every: int) -> list[JobSpec]:
    """`count` Jobs; every `bob_every`th in team-bob (from the second), every 5th failing with 3 (from
    the fifth: both users have some); run times and CPU requests differ so that gangs end at
    different times and Slurm packs different shapes."""
    specs = []
    for i in range(count):
        namespace = "team-bob" if i % bob_every == 1 else "team-alice"
        specs.append(JobSpec(namespace, f"load-{run}-{i:02d}", pods, 3 if i % 5 == 4 else 0,
                             f"{2 + (i % 4) * 4}s", ("100m", "500m", "1")[i % 3]))
    return specs


def create_jobs(run: Run, specs: list[JobSpec]) -> None:
    """All Jobs at once, as their namespace's user (edit in their namespace, nothing more): one List
    per namespace, both created in parallel."""
    run.specs = {s.key: s for s in specs}
    run.log_offset = DAEMON_LOG.stat().st_size
    run.created_at = datetime.now(UTC)
    procs = []
    for namespace, (user, _) in TEAMS.items():
        items = [job_manifest(s, run.run) for s in specs if s.namespace == namespace]
        if not items:
            continue
        proc = subprocess.Popen(
            ["kubectl", "create", "-n", namespace, "-f", "-", "-o", "json", f"--as={user}",
             "--as-group=system:authenticated"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=run.sandbox.environ())
        procs.append((namespace, proc, json.dumps({"apiVersion": "v1", "kind": "List", "items": items})))
    for namespace, proc, body in procs:
        out, err = proc.communicate(body, timeout=120)
        assert proc.returncode == 0, f"creating the Jobs in {namespace}: {err}"
        # kubectl prints one JSON document per object created, one after the other.
        decoder, at = json.JSONDecoder(), 0
        while out[at:].strip():
            item, end = decoder.raw_decode(out, out.index("{", at))
            run.created[f"{namespace}/{item['metadata']['name']}"] = item
            at = end


# -- what Kubernetes, Slurm and the daemon say --------------------------------------------------------

def daemon_log(offset: int) -> list[dict[str, Any]]:
    """The daemon's JSON log lines from `offset` on (the log is appended across restarts)."""
    with DAEMON_LOG.open("rb") as log:
        log.seek(offset)
        text = log.read().decode(errors="replace")
    entries = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line cut by the kill -9
            if isinstance(entry, dict):
                entries.append(entry)
    return entries


def utc(text: str | None) -> datetime | None:
    """A timestamp of the daemon's log, the API server or Slurm (run with TZ=UTC) as an aware datetime."""
    if not text or text in ("Unknown", "None"):
        return None
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def slurm_utc(sandbox: Sandbox, *argv: str) -> str:
    """A Slurm command's output with its times in UTC, as the daemon logs and the API server write."""
    return subprocess.run(list(argv), env={**sandbox.environ(), "TZ": "UTC"}, check=True,
                          capture_output=True, text=True, timeout=60).stdout


def sacct_rows(sandbox: Sandbox, since: datetime) -> list[dict[str, str]]:
    start = (since - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S")
    out = slurm_utc(sandbox, "sacct", "-X", "-a", "-n", "-P", "-S", start, "-o", ",".join(SACCT_FIELDS))
    return [dict(zip(SACCT_FIELDS, line.split("|"), strict=True)) for line in out.splitlines() if line]


SQUEUE_FIELDS = ("JobID", "JobName", "User", "State", "Submit", "Comment")


def squeue_rows(sandbox: Sandbox) -> list[dict[str, str]]:
    """Every job slurmctld still holds (finished ones for MinJobAge, 300 s): squeue has the comment,
    which the sandbox's sacct does not store (no AccountingStoreFlags=job_comment)."""
    out = slurm_utc(sandbox, "squeue", "-h", "-a", "-t", "all", "-o", "%i|%j|%u|%T|%V|%k")
    return [dict(zip(SQUEUE_FIELDS, line.split("|", 5), strict=True)) for line in out.splitlines() if line]


def gang_of(comment: str) -> str | None:
    """The gang key in a workload job's comment: `<marker> <gang> <kind> <namespace>/<name>`."""
    if not comment.startswith(MARKER + " "):
        return None
    return comment[len(MARKER) + 1:].split(" ", 1)[0]


def labelled(run: Run, kind: str, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = run.sandbox.kubectl_json(
        "get", kind, "-n", namespace, "-l", f"{RUN_LABEL}={run.run}")["items"]
    return items


def run_jobs(run: Run) -> dict[str, dict[str, Any]]:
    found = {}
    for namespace in {s.namespace for s in run.specs.values()}:
        for job in labelled(run, "jobs", namespace):
            found[f"{namespace}/{job['metadata']['name']}"] = job
    return found


def run_pods(run: Run) -> dict[str, list[dict[str, Any]]]:
    """Job key -> its pods, as the API server has them now."""
    found: dict[str, list[dict[str, Any]]] = {}
    for namespace in {s.namespace for s in run.specs.values()}:
        for pod in labelled(run, "pods", namespace):
            job = (pod["metadata"].get("labels") or {}).get("job-name", "")
            found.setdefault(f"{namespace}/{job}", []).append(pod)
    return found


def k8s_end(job: dict[str, Any]) -> str | None:
    """`Complete` or `Failed` once the Job controller has said so."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return str(condition["type"])
    return None


def scheduled_at(pod: dict[str, Any]) -> datetime | None:
    """When the API server recorded the binding (PodScheduled True), to the second."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            return utc(condition.get("lastTransitionTime"))
    return None


def exit_code(pod: dict[str, Any]) -> int | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if terminated:
            return int(terminated.get("exitCode", -1))
    return None


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


# -- on failure: what explains it ---------------------------------------------------------------------

def explain(run: Run, key: str, entries: list[dict[str, Any]], slurm_ids: set[int]) -> str:
    """For one Job: the daemon's log lines about its gang, its Slurm jobs and its pods; Slurm's log
    lines about those jobs; each pod's state and events. CI's machine is gone after a failure."""
    spec = run.specs[key]
    gang = run.gang(key) if key in run.created else ""
    pods = run_pods(run).get(key, [])
    names = {f"{spec.namespace}/{p['metadata']['name']}" for p in pods}
    slurm_ids |= {int(v) for p in pods if (v := (p["metadata"].get("annotations") or {}).get(SLURM_JOB, ""))
                  .isdigit()}
    def concerns(entry: dict[str, Any]) -> bool:
        listed = entry.get("pods")  # gang.submitted lists the pods' names; other lines count them
        return (entry.get("gang") == gang or entry.get("job_id") in slurm_ids or entry.get("pod") in names
                or (isinstance(listed, list) and any(f"{spec.namespace}/{n}" in names for n in listed)))

    about = [e for e in entries if concerns(e)]
    parts = [f"=== {key} (gang {gang}, Slurm jobs {sorted(slurm_ids)}): daemon log, last 30 of {len(about)}"]
    parts += [json.dumps({k: v for k, v in e.items() if k != "level"})[:400] for e in about[-30:]]
    for job_id in sorted(slurm_ids):
        parts.append(job_trail(job_id, lines_per_log=8))
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        conditions = [(c["type"], c["status"], c.get("reason"), c.get("lastTransitionTime"))
                      for c in status.get("conditions") or []]
        parts.append(f"--- pod {meta['name']} uid {meta['uid']}: phase {status.get('phase')} node "
                     f"{pod['spec'].get('nodeName')} job {(meta.get('annotations') or {}).get(SLURM_JOB)} "
                     f"exit {exit_code(pod)} conditions {conditions}")
        events = run.sandbox.kubectl_json("get", "events", "-n", spec.namespace, "--field-selector",
                                          f"involvedObject.uid={meta['uid']}")["items"]
        parts += [f"    event {e.get('lastTimestamp') or e.get('eventTime')} {e.get('reason')}: "
                  f"{e.get('message')}" for e in events]
    return "\n".join(parts)


# -- waiting, then every check ------------------------------------------------------------------------

def settle(run: Run, timeout: float) -> tuple[dict[str, dict[str, Any]], list[dict[str, str]], float]:
    """Wait until every Job has ended in Kubernetes and every Slurm job of the run (each Job's, each
    sbatch job) has a final state in sacct, none still open; then the Jobs, the run's sacct rows and
    the seconds it took. On timeout, fail with what is still open and why."""
    deadline = time.monotonic() + timeout
    while True:
        jobs = run_jobs(run)
        rows = [r for r in sacct_rows(run.sandbox, run.created_at)
                if r["JobName"] in run.specs or (r["JobID"].isdigit() and int(r["JobID"]) in run.sbatch)]
        unended = sorted(k for k in run.specs if k8s_end(jobs.get(k, {})) is None)
        still_open = sorted({r["JobName"] for r in rows if r["State"].split()[0] in OPEN_STATES})
        seen = {r["JobName"] for r in rows} | {r["JobID"] for r in rows}
        unseen = [*sorted(k for k in run.specs if k not in seen),
                  *(str(j) for j in run.sbatch if str(j) not in seen)]
        if not unended and not still_open and not unseen:
            return jobs, rows, (datetime.now(UTC) - run.created_at).total_seconds()
        entries = daemon_log(run.log_offset)
        # Nothing of the run is refused (it would wait 5 minutes before another try): no use waiting.
        gangs = {run.gang(k): k for k in run.specs}
        refused = sorted({gangs[e["gang"]] for e in entries
                          if e.get("event") == "gang.refused" and e.get("gang") in gangs})
        if refused:
            raise AssertionError(f"{len(refused)} Jobs refused: {refused[:10]}\n"
                                 + "\n".join(explain(run, k, entries, set()) for k in refused[:2]))
        if time.monotonic() > deadline:
            stuck = [k for k in [*unended, *still_open, *unseen] if k in run.specs][:3]
            raise AssertionError(
                f"after {timeout:.0f}s: {len(unended)} Jobs not Complete/Failed {unended[:10]}; Slurm jobs "
                f"still open {still_open[:10]}; no Slurm job in sacct for {unseen[:10]}\n"
                + "\n".join(explain(run, k, entries, {int(r['JobID']) for r in rows if r['JobName'] == k})
                            for k in stuck))
        time.sleep(1)


@dataclass
class Outcome:
    seconds_to_end: float
    bound_after_s: list[float]
    """Per pod: seconds from the Jobs' creation to its binding."""


def check(run: Run, timeout: float, title: str) -> None:
    """Every check of the module docstring, once the run has settled; the times are printed first,
    pass or fail."""
    jobs, rows, seconds = settle(run, timeout)
    entries = daemon_log(run.log_offset)
    pods_by_job = run_pods(run)
    queue = squeue_rows(run.sandbox)
    bound_lines: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        if entry.get("event") == "pod.bound":
            bound_lines.setdefault(str(entry.get("pod")), []).append(entry)
    # Every job a gang got: as the daemon logged it (a submit whose line the kill lost is still in
    # slurmctld's queue with the gang in its comment).
    of_gang: dict[str, set[int]] = {}
    for entry in entries:
        if entry.get("event") in ("gang.submitted", "gang.adopted") and isinstance(entry.get("job_id"), int):
            of_gang.setdefault(str(entry.get("gang")), set()).add(entry["job_id"])
    for queued in queue:
        gang = gang_of(queued["Comment"])
        submitted = utc(queued["Submit"])
        if gang is not None and submitted is not None and submitted >= run.created_at - SLACK:
            of_gang.setdefault(gang, set()).add(int(queued["JobID"]))

    problems: list[tuple[str, str, set[int]]] = []
    """(Job key or "", what is wrong, Slurm job ids it concerns)."""
    hostnames: dict[str, set[str]] = {}
    bound_after: list[float] = []
    for key, spec in run.specs.items():
        gang = run.gang(key)
        its = [r for r in rows if r["JobName"] == key]
        ids = {int(r["JobID"]) for r in its} | of_gang.get(gang, set())

        def problem(what: str, key: str = key, ids: set[int] = ids) -> None:
            problems.append((key, what, set(ids)))

        if len(ids) != 1:
            problem(f"{len(ids)} Slurm jobs {sorted(ids)} for one Job (sacct: "
                    f"{[(r['JobID'], r['State'], r['ExitCode']) for r in its]})")
        pods = pods_by_job.get(key, [])
        marked = {(p["metadata"].get("annotations") or {}).get(SLURM_JOB, "") for p in pods}
        # Of several (a duplicate), the one the pods carry.
        row: dict[str, str] | None = next(iter([*(r for r in its if r["JobID"] in marked), *its]), None)
        if row is None:
            problem("no Slurm job in sacct")
            continue
        user, account = TEAMS[spec.namespace]
        if (row["User"], row["Account"], row["Partition"]) != (user, account, "sim"):
            problem(f"Slurm job {row['JobID']} is {row['User']}/{row['Account']} in {row['Partition']}, "
                    f"not {user}/{account} in sim")
        if (row["State"], row["ExitCode"]) != spec.expected:
            problem(f"Slurm job {row['JobID']} ended {row['State']} {row['ExitCode']}, not "
                    f"{' '.join(spec.expected)}")
        want_end = "Complete" if spec.exit_code == 0 else "Failed"
        if k8s_end(jobs.get(key, {})) != want_end:
            problem(f"the Job is {k8s_end(jobs.get(key, {}))}, not {want_end}")
        # backoffLimit 0: the Job controller never replaces a pod. A Job that succeeded keeps all its
        # pods; one that failed keeps its failed ones (the controller deletes those still running
        # once one has failed, and kwok removes a deleted pod at once).
        if len(pods) > spec.pods or (spec.exit_code == 0 and len(pods) != spec.pods) or not pods:
            problem(f"{len(pods)} pods, for the Job's {spec.pods}: "
                    f"{[(p['metadata']['name'], p['metadata']['uid']) for p in pods]}")
        for pod in pods:
            name = f"{spec.namespace}/{pod['metadata']['name']}"
            node = pod["spec"].get("nodeName")
            marked_id = (pod["metadata"].get("annotations") or {}).get(SLURM_JOB)
            lines = bound_lines.get(name, [])
            if marked_id != row["JobID"]:
                problem(f"pod {name} is marked with Slurm job {marked_id}, not {row['JobID']} as its gang")
            # Its own job (of several, when the gang was split): the one it is marked with.
            own = next((r for r in its if r["JobID"] == marked_id), row)
            if not node:
                problem(f"pod {name} was never bound")
                continue
            if own["NodeList"] not in hostnames:
                out = run.sandbox.slurm("scontrol", "show", "hostnames", own["NodeList"], check=False).stdout
                hostnames[own["NodeList"]] = set(out.split())
            if node not in hostnames[own["NodeList"]]:
                problem(f"pod {name} is bound to {node}, outside job {own['JobID']}'s {own['NodeList']}")
            if len(lines) > 1:
                problem(f"pod {name} bound {len(lines)} times: {lines}")
            if lines and (lines[0].get("node"), lines[0].get("job_id")) != (node, int(own["JobID"])):
                problem(f"pod {name} is on {node} for {own['JobID']}, but the daemon bound it as {lines[0]}")
            condition_at = scheduled_at(pod)
            # The daemon's line is precise; a bind whose line the kill -9 cut has the API server's time.
            logged = utc(lines[0].get("timestamp")) if lines else None
            when = logged or condition_at
            start = utc(own["Start"])
            if when is None or start is None:
                problem(f"pod {name}: no binding time ({lines}, PodScheduled {condition_at}) or no Start "
                        f"({own['Start']})")
                continue
            for what, at in (("daemon's pod.bound", logged), ("PodScheduled", condition_at)):
                if at is not None and at < start - SLACK:
                    problem(f"pod {name} bound at {at.isoformat()} ({what}), before job {own['JobID']} "
                            f"started at {own['Start']}")
            bound_after.append((when - run.created_at).total_seconds())
            if exit_code(pod) != spec.exit_code:
                problem(f"pod {name} exited {exit_code(pod)}, not {spec.exit_code}")

    # Every gang's job belongs to a Job that exists: for the run's namespaces, any submitted since.
    uids = {job["metadata"]["uid"] for namespace in TEAMS
            for job in run.sandbox.kubectl_json("get", "jobs", "-n", namespace)["items"]}
    for gang, ids in sorted(of_gang.items()):
        namespace, kind, uid = [*gang.split("/", 2), "", ""][:3]
        if namespace in TEAMS and kind == "job" and uid not in uids:
            problems.append(("", f"orphans: Slurm jobs {sorted(ids)} of gang {gang}, whose Job does not "
                             "exist", set(ids)))
    ours = {run.gang(k) for k in run.specs}
    for queued in queue:
        if queued["State"] in OPEN_STATES and (queued["JobName"] in run.specs
                                               or gang_of(queued["Comment"]) in ours):
            problems.append(("", f"Slurm job {queued['JobID']} ({queued['JobName']}) still "
                             f"{queued['State']}", {int(queued["JobID"])}))
    for job_id, (user, code) in run.sbatch.items():
        found: dict[str, str] | None = next((r for r in rows if r["JobID"] == str(job_id)), None)
        want = ("COMPLETED", "0:0") if code == 0 else ("FAILED", f"{code}:0")
        if found is None or (found["User"], found["State"], found["ExitCode"]) != (user, *want):
            problems.append(("", f"sbatch job {job_id}: {found}, not {user} {want}", {job_id}))

    print(f"\n{report(title, Outcome(seconds, bound_after))}")
    if problems:
        explained: list[str] = []
        for key, _, ids in problems:
            if len(explained) >= 3:
                break
            if key and not any(part.startswith(f"=== {key} ") for part in explained):
                explained.append(explain(run, key, entries, set(ids)))
            elif not key:
                explained.extend(job_trail(i, lines_per_log=8) for i in sorted(ids)[:2])
        listed = "\n".join(f"{key or '-'}: {what}" for key, what, _ in problems[:40])
        raise AssertionError(f"{len(problems)} problems:\n{listed}\n\n" + "\n".join(explained))


def report(title: str, outcome: Outcome) -> str:
    times = outcome.bound_after_s
    last = max(times, default=float("nan"))
    return (f"{title}: pods bound {percentile(times, 0.5):.1f}s p50, {percentile(times, 0.99):.1f}s p99, "
            f"all {last:.1f}s after the Jobs' creation; all ended in {outcome.seconds_to_end:.1f}s")


# -- the tests ----------------------------------------------------------------------------------------

def kill_daemon() -> None:
    """kill -9, as a crash or an OOM kill would: no shutdown of any kind."""
    pid = int(DAEMON_PID.read_text())
    os.kill(pid, signal.SIGKILL)

    def dead() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(f"the daemon (pid {pid}) gone", dead, timeout=30, interval=0.05)


def test_50_jobs_of_4_pods_with_the_daemon_killed_9_are_each_one_slurm_job(load_run: Run) -> None:
    specs = specs_of(load_run.run, 50, 4, bob_every=5)
    create_jobs(load_run, specs)
    gangs = {load_run.gang(k) for k in load_run.specs}

    # The kill while the daemon is mid-way: some gangs submitted (some perhaps not yet marked or
    # bound), others not yet seen. What it had logged at that moment is printed below.
    def submitted_some() -> list[dict[str, Any]] | None:
        entries = daemon_log(load_run.log_offset)
        done = [e for e in entries if e.get("event") == "gang.submitted" and e.get("gang") in gangs]
        return entries if len(done) >= 12 else None

    wait_until("12 of the run's gangs submitted", submitted_some, timeout=120, interval=0.05)
    kill_daemon()
    killed_s = (datetime.now(UTC) - load_run.created_at).total_seconds()
    entries = daemon_log(load_run.log_offset)
    at_kill = (sum(e.get("event") == "gang.submitted" and e.get("gang") in gangs for e in entries),
               sum(e.get("event") == "pod.bound" and f"/load-{load_run.run}-" in str(e.get("pod"))
                   for e in entries))
    # Gangs end (and new ones appear) while nobody watches.
    time.sleep(5)
    assert not bridge_ready()
    subprocess.run([str(BRIDGE_UP)], check=True, capture_output=True)
    back_s = (datetime.now(UTC) - load_run.created_at).total_seconds()

    print(f"\ndaemon killed -9 {killed_s:.1f}s after the Jobs' creation ({at_kill[0]} gangs submitted, "
          f"{at_kill[1]} pods bound), ready again at {back_s:.1f}s")
    # Only a kill in the middle tests anything: gangs left to submit or pods left to bind.
    assert at_kill[0] < len(specs) or at_kill[1] < 4 * len(specs), f"the kill came after the work: {at_kill}"
    check(load_run, timeout=240, title="50 Jobs x 4 pods in sim (40 alice, 10 bob), daemon killed -9")


def test_10_jobs_of_2_pods_beside_10_sbatch_jobs_are_each_one_slurm_job(load_run: Run) -> None:
    scripts = {user: write_script(load_run.sandbox, user, "load-sim.sh", "#!/bin/sh\ntrue\n")
               for user in ("alice", "bob")}
    create_jobs(load_run, specs_of(load_run.run, 10, 2, bob_every=4))
    for i in range(10):
        user, code = ("alice", "bob")[i % 2], (0, 0, 2)[i % 3]
        job_id = load_run.sandbox.sbatch("-p", "sim", "-o", "/dev/null",
                                         f"--export=ALL,SIM_RUN_TIME={2 + i % 3}s,SIM_EXIT_CODE={code}",
                                         str(scripts[user]), user=user)
        load_run.sbatch[job_id] = (user, code)
    check(load_run, timeout=180, title="10 Jobs x 2 pods beside 10 sbatch jobs in sim")
