"""A bridged batch script's usage is measured in its pod and handed to Slurm's accounting in the
waiter's place: the agent samples the script's process tree ("u" frames, agent/usage.go), the
daemon passes them on as "usage" events, and the waiter writes each into the usage file the step
guard made for its task (agent/internal/waiter/usage.go), which jobacct_gather/linux_k8s_bridge reads."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.controller.log_relay import output_event

from .test_agent_keeps_output_byte_exact_and_passes_signals_on import agent, frame_lines  # noqa: F401
from .waiter_runs import ROOT, go_constants, go_test

FIGURES = "1500000 20000 67108864 70000000 100000000 120000000 4096 8192 3"

# Burns about 1.5 s of CPU while it holds 64 MiB it has written to (so they are resident).
BURN_AND_HOLD = (
    "import time\n"
    "held = b'x' * (64 << 20)\n"
    "start = time.process_time()\n"
    "while time.process_time() - start < 1.5:\n"
    "    pass\n"
    "time.sleep(1.2)\n"
)


EVERY_SECOND = {**os.environ, "SLURM_K8S_BRIDGE_USAGE_INTERVAL": "1"}


def usage_frames(stdout: bytes) -> list[list[int]]:
    samples = []
    for line in frame_lines(stdout):
        tag, _, data = line.partition(b" ")
        if tag == b"u":
            samples.append([int(part) for part in base64.b64decode(data).split()])
    return samples


def test_the_agent_samples_the_script_and_ends_with_its_rusage(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    script = tmp_path / "burn.py"
    script.write_text(BURN_AND_HOLD)

    result = subprocess.run(
        [str(agent), "run", str(tmp_path / "pid"), "merged", "--", sys.executable, str(script)],
        capture_output=True, timeout=60, check=False)

    assert result.returncode == 0, result.stderr
    samples = usage_frames(result.stdout)
    assert len(samples) >= 2, "a sample while it runs, and the final one"
    assert all(len(sample) == 9 for sample in samples)
    user_us, sys_us, _rss, max_rss = samples[-1][:4]
    assert user_us + sys_us >= 1_400_000, "the final figures carry the script's CPU"
    assert max_rss >= 64 << 20, "and the memory it held"
    assert samples[0][3] <= samples[-1][3], "the maximum only grows"


def test_a_child_the_script_started_counts_while_it_runs(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    script = tmp_path / "burn.py"
    script.write_text(BURN_AND_HOLD)

    # The shell waits on python: samples taken meanwhile sum the tree, the shell's child included.
    result = subprocess.run(
        [str(agent), "run", str(tmp_path / "pid"), "merged", "--", "/bin/sh", "-c",
         f"{sys.executable} {script}; true"],
        capture_output=True, timeout=60, check=False)

    assert result.returncode == 0, result.stderr
    running = usage_frames(result.stdout)[:-1]
    assert running and max(sample[3] for sample in running) >= 64 << 20


def test_a_child_that_ended_still_counts_while_the_script_runs(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    script = tmp_path / "burn.py"
    script.write_text(BURN_AND_HOLD.replace("time.sleep(1.2)", "pass"))

    # python ends and the shell reaps it, then sleeps: the samples meanwhile keep python's CPU.
    result = subprocess.run(
        [str(agent), "run", str(tmp_path / "pid"), "merged", "--", "/bin/sh", "-c",
         f"{sys.executable} {script}; sleep 3"],
        capture_output=True, timeout=60, check=False, env=EVERY_SECOND)

    assert result.returncode == 0, result.stderr
    running = usage_frames(result.stdout)[:-1]
    cpu = [sample[0] + sample[1] for sample in running]
    assert cpu[-1] >= 1_400_000, cpu
    assert cpu == sorted(cpu), "never less than before"


def test_the_interval_setting_never_reaches_the_script(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    result = subprocess.run(
        [str(agent), "run", str(tmp_path / "pid"), "merged", "--", "/bin/sh", "-c",
         "echo \"[${SLURM_K8S_BRIDGE_USAGE_INTERVAL-unset}]\""],
        capture_output=True, timeout=60, check=False, env=EVERY_SECOND)

    assert b"".join(base64.b64decode(line[2:]) for line in frame_lines(result.stdout)
                    if line.startswith(b"o ")) == b"[unset]\n"


# -- the waiter's side: the compiled waiter's usage file (agent/internal/waiter/usage_test.go) ----


def test_a_record_carries_the_figures_and_their_sum() -> None:
    go_test("TestARecordCarriesTheFiguresAndTheirSum")


def test_a_figure_the_pod_could_not_read_stays_unknown() -> None:
    go_test("TestAFigureThePodCouldNotReadStaysUnknown")


@pytest.mark.parametrize("figures", [
    "1 2 3",                                   # too few
    FIGURES + " 5",                            # too many
    FIGURES.replace("4096", "-4096"),          # not a count
    FIGURES.replace("4096", "--"),
    FIGURES.replace("4096", "0x10"),
    FIGURES.replace("4096", "\uff14\uff10\uff19\uff16"),  # digits, but not ASCII ones
    FIGURES.replace("4096", str(1 << 64)),     # beyond Slurm's 64 bits
    "",
])
def test_a_frame_that_is_not_nine_counts_makes_no_record(figures: str) -> None:
    go_test("TestAFrameThatIsNotNineCountsMakesNoRecord", {"WAITER_USAGE_FIGURES": figures})


def test_the_waiter_writes_into_the_guards_file_and_replaces_the_last_record() -> None:
    go_test("TestTheWaiterWritesIntoTheGuardsFileAndReplacesTheLastRecord")


def test_the_waiter_never_makes_a_usage_file() -> None:
    go_test("TestTheWaiterNeverMakesAUsageFile")


def test_the_waiter_does_not_write_through_a_link() -> None:
    go_test("TestTheWaiterDoesNotWriteThroughALink")


NOT_ASCII_FIGURES = base64.b64encode("\uff11 \uff12".encode()).decode()


@pytest.mark.parametrize("data", ["not base64 !!", "MTIz\ufffd", NOT_ASCII_FIGURES])
def test_a_frame_that_is_not_base64_of_ascii_is_dropped(data: str) -> None:
    go_test("TestAFrameThatIsNotBase64OfASCIIIsDropped", {"WAITER_USAGE_FRAME": data})
    go_test("TestAFrameThatIsBase64OfNineCountsIsWritten")


def test_the_waiter_finds_its_file_under_its_slurmstepd(tmp_path: Path) -> None:
    """Where, and in what form, the accounting plugin reads it."""
    go_test("TestTheWaiterFindsItsFileUnderItsSlurmstepd")
    constants = go_constants(tmp_path, "TestUsageConstantsDump", "WAITER_USAGE_CONSTANTS_OUT")
    plugin = (ROOT / "deploy/slurm/jobacct/jobacct_gather_linux_k8s_bridge.c").read_text()
    assert f'#define USAGE_DIR "{constants["usage_dir"]}"' in plugin
    assert f'#define USAGE_MAGIC "{constants["usage_magic"]}"' in plugin
    assert constants["record_size"] == 256, "the Python waiter's records, which the plugin reads whole"


def test_the_daemon_passes_the_first_pods_samples_on_as_usage() -> None:
    data = base64.b64encode(FIGURES.encode()).decode()

    event = output_event(0, "2026-12-05T12:00:00Z", f"u {data}")

    assert event == {"type": "usage", "pod": 0, "ts": "2026-12-05T12:00:00Z", "data": data}
    assert output_event(1, "t", f"u {data}")["type"] == "out", "only the batch host's agent samples"
