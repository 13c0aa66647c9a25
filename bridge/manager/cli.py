"""Command line: `slurm-k8s-bridge run|doctor|job-submit-conf|version`.

The waiter the slurmds run is not among them: it is the compiled agent/cmd/waiter
(deploy/slurm/install-waiter.sh)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bridge import __version__

if TYPE_CHECKING:
    from bridge.core.config import BridgeConfig

DEFAULT_CONFIG = "/etc/slurm-k8s-bridge/config.toml"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one subcommand per role."""
    parser = argparse.ArgumentParser(
        prog="slurm-k8s-bridge", description="Real Slurm schedules, Kubernetes runs."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("version", help="print the version and exit")
    run = sub.add_parser("run", help="run the bridge daemon")
    run.add_argument("-c", "--config", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG})")
    run.add_argument("--log-format", choices=("json", "console"), default="json")
    doctor = sub.add_parser(
        "doctor", help="check config, Slurm, Kubernetes, RBAC, node mapping, job_submit.lua"
    )
    doctor.add_argument("-c", "--config", default=DEFAULT_CONFIG)
    doctor.add_argument("--slurm-conf", help="slurm.conf of the cluster (default $SLURM_CONF or /etc/slurm)")
    conf = sub.add_parser("job-submit-conf", help="print job_submit_bridge.conf for job_submit.lua")
    conf.add_argument("-c", "--config", default=DEFAULT_CONFIG)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command named in `argv` and return the process exit code."""
    args = build_parser().parse_args(argv)
    if args.command == "version":
        print(__version__)
        return 0
    if args.command == "job-submit-conf":
        return _job_submit_conf(args.config)
    if args.command == "doctor":
        from bridge.manager.doctor import run_doctor

        return run_doctor(_load(args.config), args.slurm_conf)
    if args.command == "run":
        return _run(args.config, args.log_format)
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse restricts the choices


def _load(path: str) -> BridgeConfig:
    from bridge.core.config import ConfigError
    from bridge.manager.config_file import load_config

    try:
        return load_config(path)
    except (ConfigError, OSError) as error:
        print(f"slurm-k8s-bridge: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def _job_submit_conf(path: str) -> int:
    from bridge.core.directives import KEYS

    cfg = _load(path)
    print("# Written from the bridge config by `slurm-k8s-bridge job-submit-conf`; read by job_submit.lua "
          "and the step guard.")
    # The waiter takes --ca before the script path, which the step guard appends.
    ca = f" --ca {cfg.waiter.ca_file}" if cfg.waiter.ca_file else ""
    print(f"attach_command={cfg.waiter.attach_command} --api {cfg.waiter.api_url}{ca}")
    print(f"directive_keys={','.join(KEYS)}")
    if cfg.waiter.step_key_file:
        print(f"step_key_file={cfg.waiter.step_key_file}")
    for name, part in sorted(cfg.partitions.items()):
        default = f" default_image={part.default_image}" if part.default_image else ""
        print(f"partition={name}{default}")
    return 0


def _run(path: str, log_format: str) -> int:
    import asyncio

    from bridge.manager import daemon, logs, process_health

    cfg = _load(path)
    logs.configure(cfg.log_level, json=log_format == "json")
    process_health.watch_children_without_threads()
    return asyncio.run(daemon.run(cfg))


if __name__ == "__main__":
    sys.exit(main())
