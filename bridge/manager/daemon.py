"""The daemon: wires clients, sources, the work queue and the API; owns start-up and shutdown.

Start-up order matters: nothing is reconciled before both the pod cache and the
first Slurm snapshot are in, otherwise "no pods" or "no job" would be believed
while it only means "not read yet" (and pods would be deleted or duplicated).
The reconciler's state owners (job store, sessions, create expectations) are made
by the Reconciler itself; the leader elector gets its own API client.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_fixed

from bridge.clients.kube.actions import KubeActions
from bridge.clients.kube.cache import PodCache
from bridge.clients.kube.client import REQUESTS_SENT, make_api_client
from bridge.clients.kube.dra import CLAIMS_PATH, SLICES_PATH
from bridge.clients.kube.leader_pod import LeaderPodLabel, OwnPod
from bridge.clients.kube.nodes import NodeCache
from bridge.clients.kube.watch import ListWatcher, PodWatcher
from bridge.clients.kube.workload_pods import FIELD_SELECTOR as WORKLOAD_FIELD_SELECTOR
from bridge.clients.kube.workload_pods import PODS_PATH as WORKLOAD_PODS_PATH
from bridge.clients.kube.workload_pods import WorkloadPodCache, WorkloadVerbs
from bridge.clients.slurm import SlurmClient
from bridge.clients.slurm.rest import RestSlurmClient
from bridge.controller.kube_workloads import KubeWorkloads
from bridge.controller.metrics import Metrics
from bridge.controller.nodesync import NodeHealthSync
from bridge.controller.reconcile import Reconciler
from bridge.controller.sources import SlurmPoller
from bridge.controller.workqueue import WorkQueue
from bridge.core import wellknown
from bridge.core.config import ApiConfig, BridgeConfig, ConfigError
from bridge.core.errors import BridgeError
from bridge.manager.api import Api
from bridge.manager.leader import LeaderElector, LeaseSettings
from bridge.manager.process_health import raise_open_files_limit, watch_loop_lag

log = structlog.get_logger(__name__)

WORKERS = 16
GANG_WORKERS = 4
"""Gangs submitted at once (each waits on slurmrestd; slurmctld takes submissions one by one)."""
LEADER_CONNECTIONS = 2
CONTROL_CONNECTIONS = 64
"""The main client's pool: the pod and node watches, creates, deletes, patches and short reads.
Followed logs have a client of their own (no cap); the Lease has its own too."""
SECRET_SWEEP_S = 300.0
"""How often the leader looks for payload Secrets that no run needs."""
SECRET_SWEEP_FIRST_S = 60.0
"""The first look, after acting starts (a daemon restarted more often than SECRET_SWEEP_S still
sweeps)."""


def make_slurm_client(cfg: BridgeConfig) -> SlurmClient:
    if cfg.slurm.backend == "rest":
        if cfg.slurm.rest_url is None or cfg.slurm.token_file is None:
            raise ValueError("slurm.rest_url and slurm.token_file are required for the rest backend")
        return RestSlurmClient(cfg.slurm.rest_url, cfg.slurm.rest_user or "slurm", Path(cfg.slurm.token_file))
    if cfg.slurm.backend == "pyslurm":
        from bridge.clients.slurm.pyslurm_backend import (
            PyslurmSlurmClient,  # needs pyslurm: imported only here
        )

        return PyslurmSlurmClient(cfg.slurm.slurm_conf)
    raise ValueError(f"unknown slurm backend {cfg.slurm.backend!r}")


def lease_settings(cfg: BridgeConfig) -> LeaseSettings:
    lead = cfg.leader
    return LeaseSettings(
        namespace=lead.namespace or cfg.namespace,
        name=lead.lease_name or f"slurm-k8s-bridge-{cfg.cluster}",
        identity=lead.identity or f"{socket.gethostname()}:{cfg.api.port}",
        lease_duration_s=lead.lease_duration_s,
        renew_deadline_s=lead.renew_deadline_s,
        retry_period_s=lead.retry_period_s,
    )


async def make_elector(cfg: BridgeConfig) -> LeaderElector:
    """The elector with an API client of its own: its few small requests must never wait behind
    the pod watch, the log streams and the creates of the main client's connection pool (a renew
    stuck there would cost the Lease, or worse, outlive the renew deadline)."""
    client = await make_api_client(
        str(cfg.kube.kubeconfig) if cfg.kube.kubeconfig else None, context=cfg.kube.context,
        max_connections=LEADER_CONNECTIONS,
    )
    return LeaderElector(client, lease_settings(cfg), owns_client=True)


def server_ssl_context(api: ApiConfig) -> ssl.SSLContext | None:
    """The API's TLS context, None for plain HTTP. Read once at start: a renewed certificate
    needs a restart (the waiters reconnect and resume)."""
    if api.tls_cert_file is None or api.tls_key_file is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(api.tls_cert_file, api.tls_key_file)
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(
            f"api.tls_cert_file, api.tls_key_file: cannot load {api.tls_cert_file} with its key "
            f"{api.tls_key_file}: {error}"
        ) from None
    return context


def pod_selector(cfg: BridgeConfig) -> str:
    return f"{wellknown.LABEL_MANAGED_BY}={wellknown.MANAGER},{wellknown.LABEL_CLUSTER}={cfg.cluster}"


async def sweep_now_and_then(sweep: Callable[[], Awaitable[int]], what: str,
                             interval_s: float = SECRET_SWEEP_S) -> None:
    """While acting: run `sweep` (it removes what no run needs any more and says how many: payload
    Secrets or GPU claims left by a daemon that stopped between a run's end and their deletion)
    soon, then every `interval_s`. No error ends it: what it removes would pile up in etcd."""
    await asyncio.sleep(min(SECRET_SWEEP_FIRST_S, interval_s))
    while True:
        try:
            removed = await sweep()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the API server is away, or a bug: never the end of sweeping
            log.warning(f"{what}.sweep_failed", error=repr(error))
        else:
            if removed:
                log.info(f"{what}.sweep_done", removed=removed)
        await asyncio.sleep(interval_s)


async def run(cfg: BridgeConfig) -> int:
    """Run until SIGTERM/SIGINT (exit code 0) or until leadership is lost (exit code 1: the
    supervisor restarts us as a standby, with fresh state)."""
    tls = server_ssl_context(cfg.api)  # first: a bad certificate or key is a config error
    soft, hard = raise_open_files_limit()
    log.info("daemon.open_files_limit", soft=soft, hard=hard)
    metrics = Metrics()
    slurm = make_slurm_client(cfg)
    api_client = await make_api_client(
        str(cfg.kube.kubeconfig) if cfg.kube.kubeconfig else None, context=cfg.kube.context,
        max_connections=CONTROL_CONNECTIONS,
    )
    # Followed logs (one per running pod, for as long as it runs) get a client of their own with
    # no pool cap: past the control pool's size they would wait for a slot, time out and lose the
    # job's output, and the watch and the creates would wait behind them.
    stream_client = await make_api_client(
        str(cfg.kube.kubeconfig) if cfg.kube.kubeconfig else None, context=cfg.kube.context,
        max_connections=0,
    )
    kube = KubeActions(api_client, cfg.namespace, streams=stream_client)
    await kube.ensure_namespace()
    cache = PodCache()
    node_cache = NodeCache(p.node_label for p in cfg.partitions.values() if p.node_label)
    queue: WorkQueue[int] = WorkQueue()
    elector = await make_elector(cfg) if cfg.leader.enabled else None

    def leading() -> bool:
        return elector is None or elector.is_leader.is_set()

    reconciler = Reconciler(cfg, slurm, kube, cache, metrics, queue.add, nodes=node_cache)
    node_sync = NodeHealthSync(
        cfg, slurm, kube, node_cache, metrics, leading=leading,
        announce=lambda node, text: announce_to_jobs_on(reconciler, node, text),
    )
    reconciler.node_is_dead = node_sync.node_is_dead
    watcher = PodWatcher(api_client, cfg.namespace, pod_selector(cfg), cache, queue.add)
    # One watch of every node, trimmed on arrival: health, cordon, taints and the mapping labels.
    node_watcher = ListWatcher(api_client, "/api/v1/nodes", "nodes", "", node_cache,
                               node_sync.on_kube_node_changed)
    poller = SlurmPoller(reconciler, queue.add, metrics, cfg.slurm.poll_interval_s, leading=leading)
    # `dra` partitions: one watch of the cluster's ResourceSlices (which device is which) and one of
    # its ResourceClaims (who holds a device). Not started otherwise: a cluster may serve no DRA.
    claims = reconciler.device_claims
    dra_watchers: list[ListWatcher[Any]] = [
        ListWatcher(api_client, SLICES_PATH, "resourceslices", "", claims.slices, lambda _node: None),
        ListWatcher(api_client, CLAIMS_PATH, "resourceclaims", "", claims.claims, queue.add),
    ] if any(p.gpu_mode == "dra" for p in cfg.partitions.values()) else []
    if dra_watchers:
        claims.claim_watch_failing = lambda: dra_watchers[1].failing
    # Managed namespaces: one cluster-wide watch of the pods handed to the bridge (by schedulerName),
    # and a work queue of their gangs. Not started without [workloads.namespaces].
    gang_queue: WorkQueue[str] = WorkQueue()
    workload_watchers: list[ListWatcher[Any]] = []
    if cfg.workloads.namespaces:
        workloads = KubeWorkloads(
            cfg, slurm, reconciler.jobs, reconciler.sessions,
            WorkloadPodCache(cfg.workloads.namespaces, cfg.namespace), WorkloadVerbs(api_client), metrics,
            reconciler.creation.kubernetes_nodes_of, reconciler.device_claims, reconciler.early_endings)
        reconciler.workloads = workloads

        def workload_changed(key: str | int) -> None:
            if isinstance(key, int):
                queue.add(key)
            else:
                gang_queue.add(key)

        workload_watchers.append(ListWatcher(
            api_client, WORKLOAD_PODS_PATH, "pods of managed namespaces", "", workloads.cache,
            workload_changed, field_selector=WORKLOAD_FIELD_SELECTOR))
    own_pod = OwnPod.from_environment()
    leader_pod = LeaderPodLabel(api_client, own_pod) if elector is not None and own_pod else None
    if leader_pod is not None:
        # Restarted in the same pod after losing the Lease: the label must not outlive that.
        await leader_pod.unmark()

    def synced() -> bool:
        workload_pods_listed = all(w.listed.is_set() for w in workload_watchers)
        return cache.synced.is_set() and poller.synced.is_set() and workload_pods_listed

    def ready() -> bool:
        return synced() and leading()

    metrics.gauge("queue_depth", "Job ids waiting to be reconciled.", lambda: float(len(queue)))
    metrics.gauge("cached_pods", "Pods in the watch cache.", lambda: float(len(cache)))
    metrics.gauge("slurm_jobs", "Jobs in bridged partitions known from Slurm.",
                  lambda: float(len(reconciler.jobs)))
    metrics.gauge("sessions", "Waiter sessions (one per job run) not ended yet.",
                  lambda: float(len(reconciler.sessions)))
    metrics.gauge("attached_waiters", "Waiters attached right now.",
                  lambda: float(sum(s.attached for s in reconciler.sessions)))
    metrics.gauge("create_expectations", "Pods created and not yet seen in the watch cache.",
                  lambda: float(len(reconciler.expectations)))
    metrics.gauge("cached_nodes", "Kubernetes nodes in the node watch cache.", lambda: float(len(node_cache)))
    metrics.gauge("node_queue_depth", "Slurm nodes waiting for a health sync.",
                  lambda: float(len(node_sync.queue)))
    metrics.gauge("node_watch_events", "Node watch events applied.", lambda: float(node_watcher.events))
    metrics.gauge("watch_events", "Pod watch events applied.", lambda: float(watcher.events))
    metrics.gauge("watch_relists", "Pod watch relists.", lambda: float(watcher.relists))
    metrics.counters_from("kube_requests_total", "Requests sent to the Kubernetes API server, by verb.",
                          "verb", lambda: dict(REQUESTS_SENT))
    metrics.gauge("leader", "1 while this replica holds the Lease and acts.", lambda: float(leading()))
    metrics.gauge("ready", "1 when caches are synced and this replica acts.", lambda: float(ready()))

    api = Api(reconciler, metrics, queue.add, ready, cfg.waiter.unmunge_command, synced=synced)
    runner = api_runner(api.app())
    await runner.setup()
    await web.TCPSite(runner, cfg.api.host, cfg.api.port, ssl_context=tls).start()
    log.info("daemon.listening", host=cfg.api.host, port=cfg.api.port, tls=tls is not None,
             cluster=cfg.cluster)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    # Standbys keep their caches warm too, so a takeover needs no initial list.
    background = [
        asyncio.create_task(watcher.run(), name="pod-watch"),
        asyncio.create_task(poller.run(), name="slurm-poll"),
        asyncio.create_task(node_watcher.run(), name="node-watch"),
        asyncio.create_task(node_sync.run(), name="node-health"),
        asyncio.create_task(watch_loop_lag(metrics), name="loop-lag"),
        *(asyncio.create_task(w.run(), name=f"{w.resource}-watch") for w in dra_watchers),
        *(asyncio.create_task(w.run(), name="workload-pod-watch") for w in workload_watchers),
    ]
    if elector is not None:
        background.append(asyncio.create_task(elector.run(), name="leader-election"))
    workers: list[asyncio.Task[None]] = []
    exit_code = 0
    try:
        can_act = asyncio.ensure_future(_all_set(
            cache.synced, poller.synced, *(w.listed for w in workload_watchers),
            *([elector.is_leader] if elector else [])
        ))
        stopped = asyncio.ensure_future(stop.wait())
        # Whatever ends the daemon while it acts may also come before it acts: a Lease lost while
        # the caches still sync (under load) left a replica that neither acted nor exited.
        ends: set[asyncio.Future[Any]] = {stopped, *background}
        if elector is not None:
            ends.add(asyncio.ensure_future(elector.lost.wait()))

        def start_acting() -> None:
            nonlocal workers
            log.info("daemon.acting", pods=len(cache), jobs=len(reconciler.jobs))
            # Level-triggered: look at everything once, whatever happened before we led.
            for job_id in reconciler.jobs.job_ids() | cache.job_ids():
                queue.add(job_id)
            node_sync.queue_all()
            workers = [asyncio.create_task(queue.run_worker(reconciler.reconcile), name=f"worker-{i}")
                       for i in range(WORKERS)]
            if reconciler.workloads is not None:
                for key in reconciler.workloads.cache.gangs():
                    gang_queue.add(key)
                for job_id in reconciler.workloads.cache.job_ids():
                    queue.add(job_id)
                workers += [asyncio.create_task(gang_queue.run_worker(reconciler.workloads.reconcile_gang),
                                                name=f"gang-worker-{i}") for i in range(GANG_WORKERS)]
            selector = pod_selector(cfg)
            workers.append(asyncio.create_task(sweep_now_and_then(
                lambda: reconciler.sweep_payload_secrets(selector), "secret"), name="secret-sweep"))
            if dra_watchers:
                workers.append(asyncio.create_task(
                    sweep_now_and_then(reconciler.device_claims.sweep, "claim"), name="claim-sweep"))
            if leader_pod is not None:
                workers.append(asyncio.create_task(_until_done(leader_pod.mark, "leader_pod.mark"),
                                                   name="leader-pod-label"))

        done = await act_until_an_end(can_act, ends, start_acting)
        can_act.cancel()
        if elector is not None and elector.lost.is_set():
            exit_code = 1
        for task in done & set(background):
            # A watch or a poll only ends by a permanent error (RBAC, a config the server
            # refuses): its cache would freeze while the daemon looked ready. Exit; the
            # supervisor restarts us and the error is in the log.
            error = task.exception() if not task.cancelled() else None
            name = task.get_name() if isinstance(task, asyncio.Task) else repr(task)
            log.error("daemon.source_died", task=name, error=repr(error))
            exit_code = 1
    finally:
        log.info("daemon.stopping", exit_code=exit_code)
        for task in [*workers, *background]:
            task.cancel()
        await asyncio.gather(*workers, *background, return_exceptions=True)
        if leader_pod is not None:
            # Before the Lease goes: no waiter should reach us once somebody else may act.
            await _best_effort(leader_pod.unmark(), "leader_pod.unmark")
        if elector is not None and exit_code == 0:
            await elector.release()
        for session in reconciler.sessions:
            session.detach()
        api.tasks.hand_over()
        await runner.cleanup()
        # Work the handlers handed to the background (signals for tasks) needs the Kubernetes
        # clients, closed just below.
        left = await api.finish_background(BACKGROUND_FINISH_S)
        if left:
            log.warning("daemon.background_cancelled", left=left)
        await slurm.close()
        await api_client.close()
        await stream_client.close()
        if elector is not None:
            await elector.close()
        log.info("daemon.stopped")
    return exit_code


BACKGROUND_FINISH_S = 10.0
API_SHUTDOWN_S = 3.0
"""How long a stopping daemon lets its open requests (attached waiters' streams) end on their own
before it cancels them. aiohttp's default (60 s, spent twice) kept a daemon that had lost its
Lease alive for two minutes, and its supervisor from starting a fresh one; the waiters reattach
to whichever replica acts."""


def api_runner(app: web.Application) -> web.AppRunner:
    return web.AppRunner(app, access_log=None, shutdown_timeout=API_SHUTDOWN_S)


def announce_to_jobs_on(reconciler: Reconciler, node: str, text: str) -> int:
    """Tell the attached waiters of the jobs running on Slurm node `node` (they print it on the
    job's stderr); returns how many were told."""
    told = 0
    for session in reconciler.sessions:
        view = reconciler.jobs.get(session.job_id)
        alloc = view.alloc if view is not None else None
        if alloc is not None and alloc.run == session.run and node in alloc.node_names:
            session.publish({"type": "message", "text": text})
            told += 1
    return told


async def act_until_an_end(
    can_act: asyncio.Future[None], ends: set[asyncio.Future[Any]], start_acting: Callable[[], None]
) -> set[asyncio.Future[Any]]:
    """Wait until the daemon may act (caches synced, Lease held), start acting, and return the
    ends that came (a stop, a lost Lease, a source that died), whether before or after it acted."""
    done, _ = await asyncio.wait({can_act, *ends}, return_when=asyncio.FIRST_COMPLETED)
    if done & ends:
        return done & ends
    start_acting()
    done, _ = await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
    return done


async def _until_done(step: Callable[[], Awaitable[None]], what: str, delay_s: float = 1.0) -> None:
    """Retry `step` until it succeeds (a Kubernetes blip must not leave the leader unlabelled)."""

    def note(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        log.warning(f"{what}.failed", error=str(error))

    async for attempt in AsyncRetrying(retry=retry_if_exception_type(BridgeError), wait=wait_fixed(delay_s),
                                       before_sleep=note, sleep=_sleep):
        with attempt:
            await step()


async def _sleep(seconds: float) -> None:
    # Looked up at call time: tests replace asyncio.sleep.
    await asyncio.sleep(seconds)


async def _best_effort(step: Awaitable[None], what: str) -> None:
    try:
        await asyncio.wait_for(step, timeout=5)
    except (BridgeError, TimeoutError) as error:
        log.warning(f"{what}.failed", error=str(error))


async def _all_set(*events: asyncio.Event) -> None:
    for event in events:
        await event.wait()
