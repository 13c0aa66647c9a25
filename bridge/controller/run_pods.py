"""The pods of a job's current run: which run is current (the job store's newest Slurm view) and
which cached pod serves a node of it. Owns no state; read by the steps, batch signals and tasks
subsystems and by the reconciler's API facade.
"""

from __future__ import annotations

from bridge.clients.kube.cache import PodCache
from bridge.controller.jobstore import JobStore
from bridge.core.pod_view import PodView, pod_view


class RunPods:
    def __init__(self, jobs: JobStore, cache: PodCache) -> None:
        self._jobs = jobs
        self._cache = cache

    def current_run(self, job_id: int) -> int | None:
        """Slurm's restart count of the job's current run, as the store last read it."""
        view = self._jobs.get(job_id)
        return view.alloc.run if view is not None and view.alloc is not None else None

    def of_index(self, job_id: int, index: int, run: int | None = None) -> PodView | None:
        """Run `run`'s pod for node `index` (0: the batch script's); by default the current run's."""
        if run is None:
            run = self.current_run(job_id)
        for pod in map(pod_view, self._cache.pods_of(job_id)):
            if pod.run == run and pod.index == index:
                return pod
        return None

    def on_slurm_node(self, job_id: int, slurm_node: str) -> PodView | None:
        """The current run's pod on Slurm node `slurm_node`."""
        run = self.current_run(job_id)
        for pod in map(pod_view, self._cache.pods_of(job_id)):
            if pod.run == run and pod.slurm_node == slurm_node:
                return pod
        return None

    def spools_tasks(self, job_id: int, pod_name: str) -> bool:
        """The job's pod `pod_name` runs an agent that spools its step tasks' output."""
        pods = map(pod_view, self._cache.pods_of(job_id))
        return any(pod.name == pod_name and pod.spools_tasks for pod in pods)
