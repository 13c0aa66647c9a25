"""Reading the configuration file, and checking the files it names that the daemon itself opens.

bridge.core.config validates the text (pure); this is the I/O around it: the TOML file, and the
TLS certificate and key, which must exist and whose key nobody else may read. The CLI calls
load_config for every command that takes --config; the doctor reuses secret_file_exposure.
"""

from __future__ import annotations

import os
from pathlib import Path

from bridge.core.config import BridgeConfig, ConfigError, parse_config


def load_config(path: str | Path) -> BridgeConfig:
    """Read, validate and check the TOML file at `path`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return config_from_text(text, source=str(path))


def config_from_text(text: str, source: str = "<config>") -> BridgeConfig:
    """Validate TOML `text` and check the files it names; `source` names it in error messages."""
    cfg = parse_config(text, source)
    check_files(cfg, source)
    return cfg


def check_files(cfg: BridgeConfig, source: str = "<config>") -> None:
    """The TLS certificate and key exist, and the key is the daemon's alone."""
    cert, key = cfg.api.tls_cert_file, cfg.api.tls_key_file
    if cert is None or key is None:
        return
    for name, path in (("tls_cert_file", cert), ("tls_key_file", key)):
        if not path.is_file():
            raise ConfigError(f"{source}: api.{name}: {path} does not exist (or is not a file)")
    # Checked like the JWT file (doctor): whoever reads the key can impersonate the daemon to the
    # waiters, which hand it their jobs' scripts and environments.
    info = key.stat()
    exposed_to = secret_file_exposure(info.st_mode & 0o777, info.st_gid, {os.getegid(), *os.getgroups()})
    if exposed_to:
        raise ConfigError(f"{source}: api.tls_key_file: {key} is readable by {exposed_to} "
                          f"(mode {info.st_mode & 0o777:o}); chmod 600 {key}")


def secret_file_exposure(mode: int, gid: int, own_gids: set[int]) -> str | None:
    """Who besides the daemon may read a secret file, or None when nobody may. A group bit is
    fine when the group is one of the daemon's own (a Kubernetes Secret volume with fsGroup is
    mode 0440, group = the pod's own group)."""
    if mode & 0o007:
        return "every user"
    if mode & 0o070 and gid not in own_gids:
        return f"group {gid}"
    return None
