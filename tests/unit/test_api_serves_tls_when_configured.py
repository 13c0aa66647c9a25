"""[api] tls_cert_file/tls_key_file serve the API over TLS; the waiter then needs an https:// URL and
verifies the certificate (with waiter.ca_file, passed to it as --ca). The round trip is real: the
daemon's Api app with a real Reconciler behind a TLS socket, the waiter's own client in front."""

from __future__ import annotations

import asyncio
import json
import ssl
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
from bridge.waiter import http_client, munge

from .builders import allocation, config

MINIMAL = 'cluster = "c1"\n[slurm]\nurl = "http://127.0.0.1:6820"\n[partitions.k8s]\n'

# Prints what `unmunge --keys=uid,gid` prints for alice's credential; the payload is the credential
# itself (the waiter's munge_credential is replaced by one that returns its payload).
FAKE_UNMUNGE = (
    "import sys\nsys.stdout.write('UID: alice (1000)\\nGID: users (100)\\n\\n' + sys.stdin.read())\n"
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
        "attach_command=/usr/bin/python3 -I -S /usr/libexec/slurm-k8s-bridge/waiter.py "
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
        return allocation(job_id=job_id)


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


def _attach(port: int, ca_file: str | None) -> list[dict[str, Any]]:
    body = {"script": "#!/bin/sh\necho hi\n", "environment": {"SLURM_JOB_ID": "42"}, "work_dir": "/tmp",
            "uid": 1000, "gid": 100, "last_log": {}, "cancel": False}
    url = ("https", "127.0.0.1", port)
    with http_client.post(url, "/v1/jobs/42/attach", 42, body, 10, ca_file) as stream:
        return [json.loads(line) for line in stream]


async def test_the_waiter_attaches_over_tls_and_the_answer_streams(
    tls_api: int, cert: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(munge, "munge_credential", lambda payload: payload)

    events = await asyncio.to_thread(_attach, tls_api, str(cert[0]))

    assert events == [
        {"type": "log", "pod": 0, "ts": "t1", "line": "hello over TLS"},
        {"type": "exit", "code": 3, "signal": None},
    ]


async def test_without_the_ca_file_the_waiter_refuses_the_certificate(
    tls_api: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(munge, "munge_credential", lambda payload: payload)

    with pytest.raises(ssl.SSLCertVerificationError, match=r"self[- ]signed"):
        await asyncio.to_thread(_attach, tls_api, None)


async def test_plain_http_is_not_answered_by_the_tls_port(
    tls_api: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(munge, "munge_credential", lambda payload: payload)

    def plain() -> None:
        body = {"script": "", "environment": {}, "work_dir": "/", "uid": 1000, "gid": 100}
        http_client.post(("http", "127.0.0.1", tls_api), "/v1/jobs/42/attach", 42, body, 10).close()

    with pytest.raises(OSError):
        await asyncio.to_thread(plain)
