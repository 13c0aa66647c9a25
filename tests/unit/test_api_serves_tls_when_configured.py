"""[api] tls_cert_file/tls_key_file serve the API over TLS; the waiter then needs an https:// URL and
verifies the certificate (with waiter.ca_file, passed to it as --ca). The round trip is real: the
daemon's Api app with a real Reconciler behind a TLS socket, the compiled waiter in front (run as a
slurmd starts it, with a stand-in munge bound over /opt: waiter_runs.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bridge.clients.kube.cache import PodCache
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.core.config import ApiConfig, ConfigError, parse_config
from bridge.core.model import JobAllocation
from bridge.manager import cli
from bridge.manager.api import Api
from bridge.manager.config_file import config_from_text
from bridge.manager.daemon import server_ssl_context

from .builders import allocation, config
from .waiter_runs import fakes, go_waiter, namespaced, require_namespaces

require_namespaces()

MINIMAL = 'cluster = "c1"\n[slurm]\nurl = "http://127.0.0.1:6820"\n[partitions.k8s]\n'

# Prints what `unmunge --keys=uid,gid` prints for a credential of the user these tests run as; the
# payload is what the waiter's stand-in munge was given (it writes `MUNGE:` and its input). Each
# run is recorded in `checked` beside it: a request reached the daemon's credential check.
FAKE_UNMUNGE = (
    "import os, sys\nopen(os.path.join(os.path.dirname(__file__), 'checked'), 'a').write('x')\n"
    f"sys.stdout.write('UID: u ({os.getuid()})\\nGID: g ({os.getgid()})\\n\\n'"
    " + sys.stdin.read().removeprefix('MUNGE:'))\n"
)


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (mode 600, as openssl writes it)."""
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "2", "-subj", "/CN=bridge-test", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=30,
    )
    key.chmod(0o600)
    return cert, key


def _tls_config(cert: Path, key: Path, waiter: str = "") -> str:
    return MINIMAL + f"[api]\ntls_cert_file = '{cert}'\ntls_key_file = '{key}'\n[waiter]\n{waiter}"


# -- config --------------------------------------------------------------------------------------------

def test_tls_files_are_read_and_the_default_url_becomes_https(cert: tuple[Path, Path]) -> None:
    cfg = parse_config(_tls_config(*cert))
    assert (cfg.api.tls_cert_file, cfg.api.tls_key_file, cfg.api.tls) == (*cert, True)
    assert cfg.waiter.api_url == "https://127.0.0.1:8470"
    assert not parse_config(MINIMAL).api.tls


@pytest.mark.parametrize(
    ("waiter_keys", "message"),
    [
        ("api_url = 'http://10.0.0.5:8470'", "waiter.api_url: 'http://10.0.0.5:8470' must be https://"),
        ("ca_file = 'ca.pem'", "waiter.ca_file: 'ca.pem' is not an absolute path"),
        ("ca_file = '/etc/my ca.pem'", "waiter.ca_file: '/etc/my ca.pem' is not an absolute path without"),
        ("ca_file = '/etc/$CA'", "waiter.ca_file"),
    ],
)
def test_bad_waiter_settings_with_tls_name_the_key(
    cert: tuple[Path, Path], waiter_keys: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("$", r"\$")):
        parse_config(_tls_config(*cert, waiter_keys + "\n"))


def test_a_ca_file_without_https_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"waiter\.ca_file: only used with an https:// api_url"):
        parse_config(MINIMAL + "[waiter]\nca_file = '/etc/ca.pem'\n")


def test_tls_needs_both_files_existing_and_a_private_key(cert: tuple[Path, Path], tmp_path: Path) -> None:
    certificate, key = cert
    with pytest.raises(ConfigError, match=r"api\.tls_key_file: set both tls_cert_file and tls_key_file"):
        parse_config(MINIMAL + f"[api]\ntls_cert_file = '{certificate}'\n")
    with pytest.raises(ConfigError, match=r"api\.tls_cert_file: set both"):
        parse_config(MINIMAL + f"[api]\ntls_key_file = '{key}'\n")
    with pytest.raises(ConfigError, match=f"api.tls_cert_file: {tmp_path}/missing.pem does not exist"):
        config_from_text(_tls_config(tmp_path / "missing.pem", key))
    exposed = tmp_path / "key.pem"
    exposed.write_bytes(key.read_bytes())
    exposed.chmod(0o644)
    readable = r"api\.tls_key_file: .*key\.pem is readable by every user \(mode 644\)"
    with pytest.raises(ConfigError, match=readable):
        config_from_text(_tls_config(certificate, exposed))


def test_job_submit_conf_passes_the_ca_file_to_the_waiter(
    cert: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bridge.toml"
    keys = "api_url = 'https://bridge.example:8470'\nca_file = '/etc/b/ca.pem'\n"
    path.write_text(_tls_config(*cert, keys))

    assert cli.main(["job-submit-conf", "-c", str(path)]) == 0

    assert (
        "attach_command=/usr/libexec/slurm-k8s-bridge/waiter "
        "--api https://bridge.example:8470 --ca /etc/b/ca.pem"
    ) in capsys.readouterr().out.splitlines()


def test_a_key_that_does_not_match_is_a_config_error_at_start(
    cert: tuple[Path, Path], tmp_path: Path
) -> None:
    other = tmp_path / "other.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-out", str(other)], check=True, capture_output=True, timeout=30)
    assert server_ssl_context(ApiConfig()) is None
    with pytest.raises(ConfigError, match=r"api\.tls_cert_file, api\.tls_key_file: cannot load"):
        server_ssl_context(ApiConfig(tls_cert_file=cert[0], tls_key_file=other))


# -- the round trip --------------------------------------------------------------------------------------

class FakeSlurm:
    async def job(self, job_id: int) -> JobAllocation | None:
        return allocation(job_id=job_id, uid=os.getuid(), gid=os.getgid())


@pytest.fixture
async def tls_api(cert: tuple[Path, Path], tmp_path: Path) -> Any:
    """The daemon's Api over TLS on a free port; every attach gets one log line, then exit 3."""
    unmunge = tmp_path / "unmunge.py"
    unmunge.write_text(FAKE_UNMUNGE)
    reconciler = Reconciler(config(), FakeSlurm(), None, PodCache(), Metrics(), lambda _: None)  # type: ignore[arg-type]

    def enqueue(job_id: int) -> None:
        # Stands in for the reconciler's work: the pod's log, then its exit.
        session = reconciler.sessions.of_job(job_id)[-1]
        session.publish({"type": "log", "pod": 0, "ts": "t1", "line": "hello over TLS"})
        session.finish({"type": "exit", "code": 3, "signal": None})

    api = Api(reconciler, Metrics(), enqueue, lambda: True, (sys.executable, str(unmunge)))
    runner = web.AppRunner(api.app(), access_log=None)
    await runner.setup()
    context = server_ssl_context(ApiConfig(tls_cert_file=cert[0], tls_key_file=cert[1]))
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    yield port
    await runner.cleanup()


@pytest.fixture(scope="module")
def waiter(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return go_waiter(tmp_path_factory.mktemp("waiter"))


async def run_waiter(
    waiter: list[str], tmp_path: Path, api: str, *options: str, ends: bool = True,
) -> tuple[int | None, bytes, bytes]:
    """The waiter's job (`echo hi`) attached through `api`: its exit code, output and error. One
    that does not end (`ends` False) is given 3 s, then a SIGTERM (a cancel it cannot send either)
    and 5 s more; None if it still runs."""
    script = tmp_path / "slurm_script"
    script.write_text("#!/bin/sh\necho hi\n")
    # Files, not pipes: what a waiter that had to be killed wrote is kept.
    with open(tmp_path / "stdout", "wb+") as stdout, open(tmp_path / "stderr", "wb+") as stderr:
        proc = await asyncio.create_subprocess_exec(
            *namespaced(fakes(tmp_path), [*waiter, "--api", api, *options, str(script)]), cwd=tmp_path,
            env={"SLURM_JOB_ID": "42", "PATH": "/usr/bin:/bin"}, stdout=stdout, stderr=stderr,
            stdin=asyncio.subprocess.DEVNULL)
        code: int | None = None
        try:
            if not ends:
                await asyncio.sleep(3)
                assert proc.returncode is None, "it gave up instead of waiting the outage out"
                proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), 30 if ends else 5)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        stdout.seek(0)
        stderr.seek(0)
        return code, stdout.read(), stderr.read()


async def test_the_waiter_attaches_over_tls_and_the_answer_streams(
    tls_api: int, cert: tuple[Path, Path], waiter: list[str], tmp_path: Path,
) -> None:
    code, stdout, stderr = await run_waiter(waiter, tmp_path, f"https://127.0.0.1:{tls_api}", "--ca",
                                            str(cert[0]))
    assert (code, stdout, stderr) == (3, b"hello over TLS\n", b"")
    assert (tmp_path / "checked").read_text() == "x", "one request, its credential checked"


async def test_without_the_ca_file_the_waiter_refuses_the_certificate(
    tls_api: int, waiter: list[str], tmp_path: Path,
) -> None:
    """The handshake fails, as in an outage: the waiter keeps trying (a cancel cannot be sent
    either, and it says why), and no request, no credential, ever reaches the daemon."""
    code, stdout, stderr = await run_waiter(waiter, tmp_path, f"https://127.0.0.1:{tls_api}", ends=False)
    assert (code, stdout) == (None, b"")
    assert stderr == (b"slurm-k8s-bridge: could not reach the bridge to cancel: tls: failed to verify "
                      b"certificate: x509: certificate signed by unknown authority\n")
    assert not (tmp_path / "checked").exists()


async def test_plain_http_is_not_answered_by_the_tls_port(
    tls_api: int, waiter: list[str], tmp_path: Path,
) -> None:
    code, stdout, stderr = await run_waiter(waiter, tmp_path, f"http://127.0.0.1:{tls_api}", ends=False)
    assert (code, stdout) == (None, b"")
    assert stderr == (b"slurm-k8s-bridge: could not reach the bridge to cancel: "
                      b"bad HTTP answer from the bridge: []\n")
    assert not (tmp_path / "checked").exists()
