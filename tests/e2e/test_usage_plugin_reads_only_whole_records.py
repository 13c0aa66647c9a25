"""jobacct_gather/linux_k8s_bridge runs as root in slurmstepd and reads files a user's waiter wrote:
its reader and its CPU split, built against the sandbox's Slurm headers into a small harness (the
plugin's own source, included), given what a hostile or broken writer could leave. Only a whole
record of plain counts, in directories only root writes, a regular file reached without a link, is
taken; anything else leaves Slurm's own figures (the harness prints "none")."""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.sandbox import REPO, Sandbox

pytestmark = pytest.mark.shares_the_cluster

IN_SLURM_ROOTFS = REPO / "containers" / "slurm" / "in-ns.sh"
PLUGIN = REPO / "deploy" / "slurm" / "jobacct" / "jobacct_gather_linux_k8s_bridge.c"
SCRATCH = Path("/var/lib/slurm-k8s-sandbox/scratch")  # the same path in the Slurm rootfs
FIGURES = [20_300_000, 1_200_000, 300 << 20, 310 << 20, 400 << 20, 410 << 20, 4096, 8192, 3, 41_000, 7_000]

HARNESS = r"""
#include PLUGIN_SOURCE
#include <sys/wait.h>

/* harness read FILE [link|fifo|group-writable|users]: put FILE (or what the mode says) where this
 * slurmstepd's task 4242 keeps its usage, read it as a poll would; print the figures or "none". */
int main(int argc, char **argv)
{
	char step[512], task[600];
	struct pod_usage usage;

	if (argc >= 4 && !strcmp(argv[1], "split")) {
		uint64_t sec;
		uint32_t usec;
		split_cpu(strtoull(argv[2], NULL, 10), true, strtoull(argv[3], NULL, 10), &sec, &usec);
		printf("%llu %u\n", (unsigned long long) sec, usec);
		return 0;
	}
	const char *mode = argc > 3 ? argv[3] : "";
	snprintf(step, sizeof(step), "%s/%d", USAGE_DIR, (int) getpid());
	snprintf(task, sizeof(task), "%s/4242", step);
	if (mkdir(step, 0755) != 0)
		return 2;
	if (!strcmp(mode, "link")) {
		if (symlink(argv[2], task) != 0)
			return 2;
	} else if (!strcmp(mode, "fifo")) {
		if (mkfifo(task, 0600) != 0)
			return 2;
	} else {
		char copy[1024];
		snprintf(copy, sizeof(copy), "cp '%s' '%s'", argv[2], task);
		if (system(copy) != 0)
			return 2;
	}
	if (!strcmp(mode, "group-writable"))
		chmod(step, 0775);
	if (!strcmp(mode, "users"))
		chown(step, 2001, 2001);
	if (!read_pod_usage(4242, &usage)) {
		printf("none\n");
		return 0;
	}
	printf("ok");
	for (int i = 0; i < F_COUNT; i++)
		usage.known[i] ? printf(" %llu", (unsigned long long) usage.value[i]) : printf(" -");
	printf("\n");
	return 0;
}
"""


@pytest.fixture(scope="module")
def harness(sandbox: Sandbox) -> Iterator[tuple[Path, Path]]:
    # `make bridge-up` makes the scratch directory; this module may run before any daemon did.
    SCRATCH.mkdir(exist_ok=True)
    SCRATCH.chmod(0o1777)
    work = Path(tempfile.mkdtemp(dir=SCRATCH, prefix="usage-harness-"))
    usage_dir = work / "usage"
    usage_dir.mkdir(mode=0o755)
    os.chmod(work, 0o755)
    source = work / "harness.c"
    source.write_text(HARNESS)
    plugin = work / PLUGIN.name  # the rootfs sees the sandbox's state, not the checkout
    plugin.write_bytes(PLUGIN.read_bytes())
    binary = work / "harness"
    built = subprocess.run([str(IN_SLURM_ROOTFS), "gcc", "-O2", "-Wall", "-Werror", "-Wno-unused-result",
                            f'-DPLUGIN_SOURCE="{plugin}"', f'-DUSAGE_DIR="{usage_dir}"', "-o", str(binary),
                            str(source), "-ldl", "-lslurm"], capture_output=True, text=True, timeout=300,
                           check=False)
    assert built.returncode == 0, built.stderr
    yield binary, work
    subprocess.run(["rm", "-rf", str(work)], check=False)


def record(values: list[str], checksum: int | None = None, pad: bool = True) -> bytes:
    total = checksum if checksum is not None else sum(int(v) for v in values if v != "-") % (1 << 64)
    line = " ".join(["k8s-bridge-usage-v1", *values, str(total)])
    return ((line + " " * (255 - len(line))) if pad else line).encode() + b"\n"


def read(harness: tuple[Path, Path], content: bytes | None, mode: str = "", name: str = "record") -> str:
    binary, work = harness
    fixture = work / name
    if content is not None:
        fixture.write_bytes(content)
    argv = [str(IN_SLURM_ROOTFS), str(binary), "read", str(fixture), *([mode] if mode else [])]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, result
    return result.stdout.strip()


def test_a_whole_record_is_read(harness: tuple[Path, Path]) -> None:
    assert read(harness, record([str(v) for v in FIGURES])) == "ok " + " ".join(map(str, FIGURES))


def test_unknown_figures_stay_unknown(harness: tuple[Path, Path]) -> None:
    values = [str(v) for v in FIGURES]
    values[6:8] = ["-", "-"]
    assert read(harness, record(values)).split()[7:9] == ["-", "-"]


@pytest.mark.parametrize(("what", "content"), [
    ("a wrong sum", record([str(v) for v in FIGURES], checksum=1)),
    ("no end of line (half written)", record([str(v) for v in FIGURES], pad=False)[:-1]),
    ("a figure too few", record([str(v) for v in FIGURES[:-1]])),
    ("a figure too many", record([*map(str, FIGURES), "1"])),
    ("a signed figure", record(["-5", *map(str, FIGURES[1:])])),
    ("a plus sign", record(["+5", *map(str, FIGURES[1:])])),
    ("Slurm's no-value marker", record([str((1 << 64) - 2), *map(str, FIGURES[1:])])),
    ("beyond 64 bits", record([str(1 << 64), *map(str, FIGURES[1:])])),
    ("another magic", record([str(v) for v in FIGURES]).replace(b"-v1", b"-v9")),
    ("longer than a record", b"k8s-bridge-usage-v1 " + b"1 " * 400 + b"\n"),
    ("empty", b""),
])
def test_anything_but_a_whole_record_is_not_read(
    harness: tuple[Path, Path], what: str, content: bytes
) -> None:
    assert read(harness, content) == "none", what


@pytest.mark.parametrize("mode", ["link", "fifo", "group-writable", "users"])
def test_a_file_reached_another_way_is_not_read(harness: tuple[Path, Path], mode: str) -> None:
    # A link to a whole record, a FIFO (never blocks the poll), a directory others may write.
    assert read(harness, record([str(v) for v in FIGURES]), mode=mode, name=f"record-{mode}") == "none"
    assert stat.S_ISDIR(os.stat(harness[1] / "usage").st_mode)


@pytest.mark.parametrize(("pod_us", "waiter_us"), [(20_300_000, 41_000), (20_900_000, 990_000), (500, 41_000),
                                                   (7_000_000, 0)])
def test_the_cpu_split_leaves_the_pods_time_once_slurmstepd_writes_the_waiters_microseconds(
    harness: tuple[Path, Path], pod_us: int, waiter_us: int
) -> None:
    result = subprocess.run([str(IN_SLURM_ROOTFS), str(harness[0]), "split", str(pod_us), str(waiter_us)],
                            capture_output=True, text=True, timeout=30, check=True).stdout.split()
    sec, usec = int(result[0]), int(result[1])
    assert usec == waiter_us % 1_000_000, "what slurmstepd will write anyway"
    assert abs(sec * 1_000_000 + usec - pod_us) <= 500_000 or (pod_us < waiter_us and sec == 0)
