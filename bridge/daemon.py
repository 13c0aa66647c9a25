"""The daemon: wires clients, sources, the work queue and the API; owns start-up and shutdown.

Start-up order matters: nothing is reconciled before both the pod cache and the
first Slurm snapshot are in, otherwise "no pods" or "no job" would be believed
while it only means "not read yet" (and pods would be deleted or duplicated).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import structlog
from aiohttp import web

from bridge import wellknown
from bridge.api import Api
from bridge.config import BridgeConfig
from bridge.kube.actions import KubeActions
from bridge.kube.cache import PodCache
from bridge.kube.client import make_api_client
from bridge.kube.watch import PodWatcher
from bridge.metrics import Metrics
from bridge.reconcile import Reconciler
from bridge.slurm import SlurmClient
from bridge.slurm.rest import RestSlurmClient
from bridge.sources import SlurmPoller
from bridge.workqueue import WorkQueue

log = structlog.get_logger(__name__)

WORKERS = 16


def make_slurm_client(cfg: BridgeConfig) -> SlurmClient:
    if cfg.slurm.backend == "rest":
        if cfg.slurm.rest_url is None or cfg.slurm.token_file is None:
            raise ValueError("slurm.rest_url and slurm.token_file are required for the rest backend")
        return RestSlurmClient(cfg.slurm.rest_url, cfg.slurm.rest_user or "slurm", Path(cfg.slurm.token_file))
    raise ValueError(f"slurm backend {cfg.slurm.backend!r} is not available in this build")


def pod_selector(cfg: BridgeConfig) -> str:
    return f"{wellknown.LABEL_MANAGED_BY}={wellknown.MANAGER},{wellknown.LABEL_CLUSTER}={cfg.cluster}"


async def run(cfg: BridgeConfig) -> None:
    metrics = Metrics()
    slurm = make_slurm_client(cfg)
    api_client = await make_api_client(
        str(cfg.kube.kubeconfig) if cfg.kube.kubeconfig else None, context=cfg.kube.context
    )
    kube = KubeActions(api_client, cfg.namespace)
    await kube.ensure_namespace()
    cache = PodCache()
    queue = WorkQueue()
    reconciler = Reconciler(cfg, slurm, kube, cache, metrics, queue.add, queue.add_after)
    watcher = PodWatcher(api_client, cfg.namespace, pod_selector(cfg), cache, queue.add)
    poller = SlurmPoller(reconciler, queue.add, metrics, cfg.slurm.poll_interval_s)

    def ready() -> bool:
        return cache.synced.is_set() and poller.synced.is_set()

    metrics.gauge("queue_depth", "Job ids waiting to be reconciled.", lambda: float(len(queue)))
    metrics.gauge("cached_pods", "Pods in the watch cache.", lambda: float(len(cache)))
    metrics.gauge("slurm_jobs", "Jobs in bridged partitions known from Slurm.",
                  lambda: float(len(reconciler.slurm_jobs)))
    metrics.gauge("attached_waiters", "Waiters attached right now.",
                  lambda: float(sum(s.attached for s in reconciler.sessions.values())))
    metrics.gauge("watch_events", "Pod watch events applied.", lambda: float(watcher.events))
    metrics.gauge("watch_relists", "Pod watch relists.", lambda: float(watcher.relists))
    metrics.gauge("ready", "1 when caches are synced and this replica acts.", lambda: float(ready()))

    api = Api(reconciler, metrics, queue.add, ready, cfg.waiter.unmunge_command)
    runner = web.AppRunner(api.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, cfg.api.host, cfg.api.port).start()
    log.info("daemon.listening", host=cfg.api.host, port=cfg.api.port, cluster=cfg.cluster)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    sources = [
        asyncio.create_task(watcher.run(), name="pod-watch"),
        asyncio.create_task(poller.run(), name="slurm-poll"),
    ]
    workers: list[asyncio.Task[None]] = []
    try:
        synced = asyncio.gather(cache.synced.wait(), poller.synced.wait())
        await asyncio.wait({asyncio.ensure_future(synced), asyncio.ensure_future(stop.wait())},
                                     return_when=asyncio.FIRST_COMPLETED)
        if not stop.is_set():
            log.info("daemon.synced", pods=len(cache), jobs=len(reconciler.slurm_jobs))
            workers = [asyncio.create_task(queue.run_worker(reconciler.reconcile), name=f"worker-{i}")
                       for i in range(WORKERS)]
            await stop.wait()
    finally:
        log.info("daemon.stopping")
        for task in [*workers, *sources]:
            task.cancel()
        await asyncio.gather(*workers, *sources, return_exceptions=True)
        for session in reconciler.sessions.values():
            session.detach()
        await runner.cleanup()
        await slurm.close()
        await api_client.close()
        log.info("daemon.stopped")
