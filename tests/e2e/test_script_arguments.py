"""`sbatch job.sh a 'b c' ''`: the script gets its arguments in a bridged partition as natively
(they were dropped before: the wrapper exec'd the waiter with "$0" only). Several jobs at once, in
both partitions, each with its own arguments; the output files compared byte for byte."""

from __future__ import annotations

import functools

import pytest

from tests.e2e.sandbox import Sandbox, wait_until, write_script

pytestmark = pytest.mark.shares_the_cluster

SCRIPT = ('#!/bin/sh\n#K8S image=sandbox.local/busybox:1\necho "$#"\n'
          'for a in "$@"; do printf "[%s]\\n" "$a"; done\n')
ARGUMENTS = [("a", "b c", ""), ("--flag=1", "$(HOME)", "*"), (), ("x" * 3000,)]


def test_a_scripts_arguments_reach_it_as_natively(bridge: Sandbox) -> None:
    script = write_script(bridge, "alice", "args.sh", SCRIPT)
    jobs = {}
    for partition in ("native", "k8s"):
        for n, arguments in enumerate(ARGUMENTS):
            out = bridge.home("alice") / f"args-{partition}-{n}.out"
            out.unlink(missing_ok=True)
            job_id = bridge.sbatch("-p", partition, "-o", str(out), str(script), *arguments)
            jobs[(partition, n)] = (job_id, out)
    for job_id, _ in jobs.values():
        wait_until(f"job {job_id} done", functools.partial(bridge.sacct_line, job_id), timeout=180)
    for n, arguments in enumerate(ARGUMENTS):
        native = jobs[("native", n)][1].read_bytes()
        bridged = jobs[("k8s", n)][1].read_bytes()
        expected = f"{len(arguments)}\n" + "".join(f"[{a}]\n" for a in arguments)
        assert native.decode() == expected, native
        assert bridged == native, (arguments, bridged, native)
