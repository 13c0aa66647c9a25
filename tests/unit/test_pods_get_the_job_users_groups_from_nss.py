"""Pods get the job user's supplementary groups, resolved by the daemon through NSS from the user
name Slurm reports (never from the waiter's payload), cached for a bounded time and number of
users; supplementalGroupsPolicy only when configured."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from bridge.clients import identity
from bridge.clients.identity import Resolution, SupplementalGroups, nss_groups
from bridge.clients.kube.cache import PodCache
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.core import wellknown
from bridge.core.config import ConfigError, PartitionConfig, PodsConfig, parse_config
from bridge.core.directives import parse_directives
from bridge.core.pod_user import UserAccount
from bridge.core.translate import desired_pods

from .builders import SCRIPT, allocation, config, payload

MINIMAL = 'cluster = "c1"\n[slurm]\nurl = "http://127.0.0.1:6820"\n[partitions.k8s]\n'


# -- config ----------------------------------------------------------------------------------------

def test_pods_default_to_nss_groups_and_strict_where_the_node_enforces_it() -> None:
    expected = PodsConfig(supplemental_groups="nss", supplemental_groups_policy="auto")
    assert parse_config(MINIMAL).pods == expected


@pytest.mark.parametrize(("mode", "policy"), [("none", "Strict"), ("nss", "Merge"), ("nss", "")])
def test_pods_settings_are_read(mode: str, policy: str) -> None:
    text = MINIMAL + f'[pods]\nsupplemental_groups = "{mode}"\nsupplemental_groups_policy = "{policy}"\n'
    assert parse_config(text).pods == PodsConfig(mode, policy)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ('supplemental_groups = "ldap"', "pods.supplemental_groups: must be one of 'nss', 'none'"),
        ('supplemental_groups = ""', "pods.supplemental_groups: must not be empty"),
        ('supplemental_groups_policy = "strict"',
         "pods.supplemental_groups_policy: must be one of 'auto', 'Strict'"),
        ('supplementalGroups = "nss"', "pods.supplementalGroups: unknown key"),
    ],
)
def test_bad_pods_settings_name_the_key(keys: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(MINIMAL + f"[pods]\n{keys}\n")


# -- translate (pure) ----------------------------------------------------------------------------------

def _pods(groups: tuple[int, ...] = (), policy: str = "") -> list[dict[str, Any]]:
    cfg = config(pods=PodsConfig(supplemental_groups_policy=policy))
    return desired_pods(allocation(), payload(), parse_directives(SCRIPT), PartitionConfig(), cfg,
                        supplemental_groups=groups)


def test_every_pod_gets_the_groups_sorted_without_the_primary_gid_and_never_0() -> None:
    pods = _pods((3000, 100, 0, 27, 3000))  # 100 is the job's gid

    assert [p["spec"]["securityContext"]["supplementalGroups"] for p in pods] == [[27, 3000], [27, 3000]]
    assert pods[0]["spec"]["securityContext"]["runAsGroup"] == 100


def test_without_groups_and_policy_the_fields_are_absent() -> None:
    security = _pods((100, 0))[0]["spec"]["securityContext"]
    assert "supplementalGroups" not in security
    assert "supplementalGroupsPolicy" not in security


def test_the_configured_policy_is_set_even_without_groups() -> None:
    # Strict matters most then: the image's /etc/group must not add any.
    assert _pods((), "Strict")[0]["spec"]["securityContext"]["supplementalGroupsPolicy"] == "Strict"
    assert _pods((27,), "Merge")[1]["spec"]["securityContext"]["supplementalGroupsPolicy"] == "Merge"


# -- NSS -----------------------------------------------------------------------------------------------

class _Passwd:
    def __init__(self, uid: int) -> None:
        self.pw_uid = uid


def test_nss_groups_of_a_known_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(identity.pwd, "getpwnam", lambda name: _Passwd(1000))
    monkeypatch.setattr(identity.os, "getgrouplist", lambda name, gid: [gid, 3000, 27, 0])
    names = {100: "users", 27: "sudo"}  # 3000 has no name here

    def getgrgid(gid: int) -> SimpleNamespace:
        if gid not in names:
            raise KeyError(gid)
        return SimpleNamespace(gr_name=names[gid])

    monkeypatch.setattr(identity.grp, "getgrgid", getgrgid)

    resolved = nss_groups("alice", 1000, 100)

    assert resolved.groups == (27, 3000) and resolved.problem is None
    assert resolved.account == UserAccount("alice", 1000, 100, group_names={100: "users", 27: "sudo"})


def test_the_account_has_the_users_own_primary_gid_and_names_the_jobs_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entry = SimpleNamespace(pw_uid=1000, pw_gid=100, pw_dir="/home/alice", pw_shell="/bin/bash", pw_gecos="")
    monkeypatch.setattr(identity.pwd, "getpwnam", lambda name: entry)
    monkeypatch.setattr(identity.os, "getgrouplist", lambda name, gid: [gid, 100])
    names = {100: "users", 3000: "proj"}
    monkeypatch.setattr(identity.grp, "getgrgid", lambda gid: SimpleNamespace(gr_name=names[gid]))

    account = nss_groups("alice", 1000, 3000).account  # a job of group proj (sg proj -c sbatch)

    assert account is not None and account.gid == 100 and account.group_names == {3000: "proj", 100: "users"}


def test_an_unknown_user_or_another_uid_gets_no_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    def getpwnam(name: str) -> _Passwd:
        if name == "ghost":
            raise KeyError(name)
        return _Passwd(1234)

    monkeypatch.setattr(identity.pwd, "getpwnam", getpwnam)
    monkeypatch.setattr(identity.os, "getgrouplist", lambda name, gid: [gid, 3000])

    assert nss_groups("ghost", 1000, 100) == Resolution((), "user 'ghost' is unknown to this host's NSS")
    assert nss_groups("alice", 1000, 100) == Resolution(
        (), "user 'alice' is uid 1234 here, but uid 1000 in Slurm"
    )


def test_the_real_nss_answers_for_this_process_user() -> None:
    import grp
    import os
    import pwd

    me = pwd.getpwuid(os.getuid())
    expected = tuple(sorted(set(os.getgrouplist(me.pw_name, me.pw_gid)) - {me.pw_gid, 0}))
    resolved = nss_groups(me.pw_name, me.pw_uid, me.pw_gid)
    assert (resolved.groups, resolved.problem, resolved.home) == (expected, None, me.pw_dir)
    assert resolved.account is not None
    assert (resolved.account.name, resolved.account.shell) == (me.pw_name, me.pw_shell)
    assert resolved.account.group_names.get(me.pw_gid) == grp.getgrgid(me.pw_gid).gr_name


# -- the cache -------------------------------------------------------------------------------------------

class FakeNss:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.fail = False

    def __call__(self, user: str, uid: int, gid: int) -> Resolution:
        self.calls.append((user, uid, gid))
        if self.fail:
            raise OSError("sssd is down")
        if user == "ghost":
            return Resolution(problem="user 'ghost' is unknown to this host's NSS")
        return Resolution((uid + 1, uid + 2))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_answers_are_cached_for_the_ttl() -> None:
    nss, clock = FakeNss(), Clock()
    groups = SupplementalGroups(lookup=nss, ttl_s=60, clock=clock)

    assert await groups.of(allocation()) == (1001, 1002)
    assert await groups.of(allocation(job_id=43)) == (1001, 1002)
    clock.now += 59
    await groups.of(allocation(job_id=44))
    assert nss.calls == [("alice", 1000, 100)]
    clock.now += 2
    await groups.of(allocation(job_id=45))
    assert len(nss.calls) == 2


async def test_jobs_of_one_user_starting_together_share_one_lookup() -> None:
    nss = FakeNss()
    groups = SupplementalGroups(lookup=nss)

    answers = await asyncio.gather(*(groups.of(allocation(job_id=i)) for i in range(50)))

    assert set(answers) == {(1001, 1002)}
    assert len(nss.calls) == 1


async def test_the_cache_holds_at_most_max_entries_least_recent_out_first() -> None:
    nss = FakeNss()
    groups = SupplementalGroups(lookup=nss, max_entries=2)
    alice, bob, carol = (allocation(user=u, uid=uid) for u, uid in (("alice", 1), ("bob", 2), ("carol", 3)))

    await groups.of(alice)
    await groups.of(bob)
    await groups.of(alice)  # alice is now the most recent
    await groups.of(carol)  # bob goes
    assert len(groups) == 2
    await groups.of(alice)
    await groups.of(bob)
    assert [c[0] for c in nss.calls] == ["alice", "bob", "carol", "bob"]


async def test_an_unresolved_user_gets_no_groups_and_one_warning() -> None:
    groups = SupplementalGroups(lookup=FakeNss(), ttl_s=0)  # every job asks again

    with capture_logs() as logs:
        answers = [await groups.of(allocation(job_id=i, user="ghost")) for i in (1, 2, 3)]

    assert answers == [(), (), ()]
    warnings = [entry for entry in logs if entry["event"] == "groups.unresolved"]
    assert [(w["job_id"], w["user"], w["log_level"]) for w in warnings] == [(1, "ghost", "warning")]


async def test_a_failed_lookup_gives_no_groups_and_is_not_remembered() -> None:
    nss = FakeNss()
    nss.fail = True
    groups = SupplementalGroups(lookup=nss)

    with capture_logs() as logs:
        assert await groups.of(allocation()) == ()
    assert [e["event"] for e in logs] == ["groups.lookup_failed"]
    nss.fail = False
    assert await groups.of(allocation()) == (1001, 1002)
    assert len(nss.calls) == 2


async def test_mode_none_or_no_user_name_looks_nothing_up() -> None:
    nss = FakeNss()
    assert await SupplementalGroups("none", lookup=nss).of(allocation()) == ()
    assert await SupplementalGroups(lookup=nss).of(allocation(user="")) == ()
    assert nss.calls == []


# -- the reconciler passes them in -----------------------------------------------------------------------

def _reconciler(nss: FakeNss, *, resolve_first_node: bool, policy: str, ttl_s: float = 60.0,
                ) -> tuple[Reconciler, Any, PodCache]:
    """A reconciler over in-memory Slurm and Kubernetes whose NSS is `nss`, with job 42 seen."""
    from .test_reconcile_acts_on_both_views import FakeKube, FakeSlurm, _see

    cache = PodCache()
    kube = FakeKube(cache)
    part = PartitionConfig(default_image="img:1", resolve_first_node=resolve_first_node)
    cfg = config(partitions={"k8s": part}, pods=PodsConfig(supplemental_groups_policy=policy))
    reconciler = Reconciler(cfg, FakeSlurm(), kube, cache, Metrics(), lambda _: None)  # type: ignore[arg-type]
    reconciler.creation.groups = SupplementalGroups(lookup=nss, ttl_s=ttl_s)
    _see(reconciler, allocation())
    return reconciler, kube, cache


async def test_created_pods_carry_the_groups_of_slurms_user_not_the_payloads() -> None:
    from .test_reconcile_acts_on_both_views import _attach

    nss = FakeNss()
    reconciler, kube, _ = _reconciler(nss, resolve_first_node=False, policy="Strict")
    queue = _attach(reconciler)
    # Whatever the waiter claims about its user (it writes the payload) does not matter.
    reconciler.sessions.of_job(42)[-1].payload = replace(payload(), environment={"USER": "root"})

    await reconciler.reconcile(42)

    assert nss.calls == [("alice", 1000, 100)]
    assert [m["spec"]["securityContext"]["supplementalGroups"] for m in kube.created] == [[1001, 1002]] * 2
    assert {m["spec"]["securityContext"]["supplementalGroupsPolicy"] for m in kube.created} == {"Strict"}
    assert queue.empty()  # nothing failed


async def test_the_pods_made_after_the_first_ones_address_get_the_same_nss_answer() -> None:
    """A multi-node run's later pods are made once the first has its address: NSS failing (or
    answering otherwise) by then must not give them other groups, or no passwd entry."""
    from .test_reconcile_acts_on_both_views import _attach, _pod

    nss = FakeNss()
    reconciler, kube, cache = _reconciler(nss, resolve_first_node=True, policy="", ttl_s=0)
    _attach(reconciler)

    await reconciler.reconcile(42)
    first = kube.created[0]
    nss.fail = True  # sssd went down meanwhile
    cache.apply("ADDED", _pod(first, phase="Pending", podIP="10.244.1.7"))
    await reconciler.reconcile(42)

    assert [m["metadata"]["name"] for m in kube.created] == ["slurm-42-0", "slurm-42-1"]
    assert [m["spec"]["securityContext"]["supplementalGroups"] for m in kube.created] == [[1001, 1002]] * 2
    secrets = {m["metadata"]["annotations"][wellknown.ANNOTATION_PAYLOAD_SECRET] for m in kube.created}
    assert len(secrets) == 1 and len(nss.calls) == 1
