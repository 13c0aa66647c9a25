# cython: language_level=3
"""The few job reads the bridge needs that pyslurm's Python API lacks, on pyslurm's own Job objects.

pyslurm 25.11 (the only release near Slurm 26.05):
- `Jobs.load()` always asks slurmctld for everything: slurm_load_jobs's `update_time` is not
  exposed, so an idle poll is never cheap;
- `Job.state` is slurm_job_state_string(), which names a flag such as COMPLETING *instead of*
  the base state (slurmrestd reports both);
- `Job.get_resource_layout_per_node()` gives CPU ids counted with one thread per core (a TODO
  there), not slurmctld's CPU count, and re-parses each node's GRES string into a dict; the bridge
  reads the raw string with the same parser as for slurmrestd (bridge.gres);
- `Job.array_task_id` reads task 0 as "unset".

This module fills exactly those gaps and returns pyslurm.Job objects, so everything else is read
through pyslurm's own properties. It is compiled against pyslurm's declarations of the Slurm headers
(`cimport`), by containers/pyslurm/build.sh, into the same venv. RPCs run without the GIL.
"""

from libc.stdint cimport uint16_t, uint32_t
from libc.string cimport memset
from libc.time cimport time_t
from libc cimport errno as c_errno

from pyslurm cimport slurm
from pyslurm.slurm cimport job_info_msg_t, slurm_job_info_t, slurm_free_job_info_msg
from pyslurm.core.job.job cimport Job

from pyslurm.core.error import RPCError

cdef extern from "slurm/slurm.h" nogil:
    int _load_jobs "slurm_load_jobs" (time_t update_time, job_info_msg_t **resp, uint16_t show_flags)
    int _load_job "slurm_load_job" (job_info_msg_t **resp, uint32_t job_id, uint16_t show_flags)
    const char *_state_string "slurm_job_state_string" (uint32_t state)
    uint32_t JOB_STATE_BASE
    uint32_t JOB_STATE_FLAGS
    int JOB_END

cdef extern from "slurm/slurm_errno.h" nogil:
    int SLURM_NO_CHANGE_IN_DATA
    int ESLURM_INVALID_JOB_ID

cdef uint16_t SHOW_FLAGS = slurm.SHOW_ALL | slurm.SHOW_DETAIL


cdef list _take_jobs(job_info_msg_t *msg):
    """Move every record of msg into a pyslurm.Job (as pyslurm's Jobs.load does), then free msg."""
    cdef slurm_job_info_t empty
    cdef uint32_t i
    cdef list jobs = []
    memset(&empty, 0, sizeof(empty))
    try:
        for i in range(msg.record_count):
            jobs.append(Job.from_ptr(&msg.job_array[i]))
            # The Job owns the record's pointers now; leave nothing for the free below.
            msg.job_array[i] = empty
        msg.record_count = 0
    finally:
        slurm_free_job_info_msg(msg)
    return jobs


def load_jobs(time_t update_time):
    """All jobs as (slurmctld's time of the answer, [pyslurm.Job]), or None if none changed.

    slurmctld compares with one-second resolution and answers "no change" only when nothing
    changed since the second before update_time, so passing the time of the previous answer
    never misses a change (at worst a change is reported twice).
    """
    cdef job_info_msg_t *msg = NULL
    cdef int rc
    cdef int err = 0
    with nogil:
        rc = _load_jobs(update_time, &msg, SHOW_FLAGS)
        if rc != 0:
            err = c_errno.errno
    if rc != 0:
        if err == SLURM_NO_CHANGE_IN_DATA:
            return None
        raise RPCError(errno=err)
    last_update = msg.last_update
    return last_update, _take_jobs(msg)


def load_job(uint32_t job_id):
    """One job as a pyslurm.Job, or None when slurmctld does not know the id (any more)."""
    cdef job_info_msg_t *msg = NULL
    cdef int rc
    cdef int err = 0
    with nogil:
        rc = _load_job(&msg, job_id, SHOW_FLAGS)
        if rc != 0:
            err = c_errno.errno
    if rc != 0:
        if err == ESLURM_INVALID_JOB_ID:
            return None
        raise RPCError(errno=err)
    jobs = _take_jobs(msg)
    for job in jobs:
        if job.id == job_id:
            return job
    return None


def job_state(Job job):
    """(base state, [flag names]) as slurmrestd reports them, e.g. ("COMPLETED", ["COMPLETING"])."""
    cdef uint32_t state = job.ptr.job_state
    cdef uint32_t base = state & JOB_STATE_BASE
    cdef uint32_t bit
    cdef int i
    flags = []
    for i in range(8, 32):
        bit = (<uint32_t>1) << i
        if state & JOB_STATE_FLAGS & bit:
            # slurm_job_state_string names a lone flag bit by the flag (its base part is 0).
            flags.append(_state_string(bit).decode())
    name = _state_string(base).decode() if base < <uint32_t>JOB_END else ""
    return name, flags


def gres_detail(Job job):
    """The per-node GRES strings (`gpu:2(IDX:1-2)`) in node order; empty for jobs without GRES."""
    cdef slurm_job_info_t *info = job.ptr
    cdef uint32_t i
    if info.gres_detail_str == NULL:
        return []
    return [
        info.gres_detail_str[i].decode() if info.gres_detail_str[i] != NULL else ""
        for i in range(info.gres_detail_cnt)
    ]


def node_resources(Job job):
    """[(cpus, memory MiB)] per allocated node in node order; empty before the job has nodes.

    Reads slurmctld's job_resources record (Slurm-internal; pyslurm declares its layout). Only
    fields in its unchanged leading part are used: cpus, memory_allocated and nhosts.
    """
    cdef slurm.job_resources *res = <slurm.job_resources *> job.ptr.job_resrcs
    cdef uint32_t i
    if res == NULL or res.cpus == NULL:
        return []
    return [
        (res.cpus[i], res.memory_allocated[i] if res.memory_allocated != NULL else 0)
        for i in range(res.nhosts)
    ]


def array_task_id(Job job):
    """The array task id (0 included), or None when unset."""
    cdef uint32_t task = job.ptr.array_task_id
    return None if task == slurm.NO_VAL else task


def clear_errno():
    """Reset this thread's errno: pyslurm's Job.send_signal() reads errno even after a success."""
    c_errno.errno = 0
