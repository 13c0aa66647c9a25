"""The job's user has a name in its pods as on a native host (bridge/core/pod_user.py): `id`,
`whoami`, `groups`, `ls -l`, `getent`, `~alice` and Python's pwd give the same answers in `native`
and `k8s`, for an array's tasks at once; and a job cannot change the files that say so."""

from __future__ import annotations

import functools
import os
import pwd

import pytest

from tests.e2e.sandbox import Sandbox, at_once, wait_until, write_script

pytestmark = pytest.mark.shares_the_cluster

SCRIPT = """#!/bin/bash
#SBATCH --time=5
id; whoami; id -gn; groups
getent passwd "$(id -un)" | cut -d: -f1,3,4,6
echo ~alice
ls -ln --time-style=+ ~/names/owned | cut -d' ' -f3,4
ls -l --time-style=+ ~/names/owned | cut -d' ' -f3,4
python3 -c 'import os, pwd, grp; print(pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name)'
"""
TASKS = 4


def test_id_whoami_groups_ls_and_pwd_name_the_user_as_natively(bridge: Sandbox) -> None:
    alice = pwd.getpwnam("alice")
    directory = bridge.home("alice") / "names"
    directory.mkdir(exist_ok=True)
    (directory / "owned").write_text("mine\n")
    for path in (directory, directory / "owned"):
        os.chown(path, alice.pw_uid, alice.pw_gid)
    script = str(write_script(bridge, "alice", "names.sh", SCRIPT))

    def submit(partition: str) -> int:
        output = f"{directory}/{partition}-%a.out"
        return bridge.sbatch("-p", partition, f"--array=0-{TASKS - 1}", "-o", output, script)

    jobs = at_once({p: functools.partial(submit, p) for p in ("native", "k8s")})
    for partition, job_id in jobs.items():
        done = functools.partial(bridge.array_rows, job_id, TASKS)
        rows = wait_until(f"{partition} array", done, timeout=240)
        assert rows == ["COMPLETED|0:0"] * TASKS, (partition, rows)

    native = (directory / "native-0.out").read_text()
    assert native.splitlines()[1:3] == ["alice", "alice"] and "uid=" in native, native
    for task in range(TASKS):
        bridged = (directory / f"k8s-{task}.out").read_text()
        assert bridged == (directory / f"native-{task}.out").read_text(), (task, bridged, native)


def test_a_job_cannot_rewrite_its_pods_passwd_or_group(bridge: Sandbox) -> None:
    """The hostile user's try: write, replace or bind over the files that name accounts; each
    fails and the files still say what the daemon wrote."""
    probe = write_script(bridge, "alice", "passwd-probe.sh", """#!/bin/bash
for f in /etc/passwd /etc/group; do
  if { echo 'root2:x:0:0::/:/bin/sh' >> "$f"; } 2>/dev/null; then echo "APPENDED $f"; fi
  if cp /dev/null "$f" 2>/dev/null; then echo "TRUNCATED $f"; fi
  if mv "$f" "$f.old" 2>/dev/null; then echo "MOVED $f"; fi
done
grep -c . /etc/passwd; grep '^alice:' /etc/passwd | cut -d: -f1,3; grep -c ':x:0:' /etc/passwd
""")
    out = bridge.home("alice") / "passwd-probe.out"
    out.unlink(missing_ok=True)
    job_id = bridge.sbatch("-p", "k8s", "-o", str(out), str(probe))

    assert bridge.wait_job_final(job_id, timeout=120)["State"] == "COMPLETED"
    assert out.read_text() == f"3\nalice:{pwd.getpwnam('alice').pw_uid}\n1\n", out.read_text()
