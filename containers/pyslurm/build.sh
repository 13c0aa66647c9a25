#!/usr/bin/env bash
# Build (once) pyslurm for the sandbox's Slurm 26.05 into a venv inside the Slurm rootfs, at
# /opt/pyslurm-venv (on the host: $SBX_STATE/rootfs/opt/pyslurm-venv), plus the bridge's small
# extension to it. Prints the in-rootfs venv path on stdout. Needs the Slurm half of the sandbox
# up: it builds through in-ns.sh. Timing: ~1.5-2 min for the venv, ~10 s for the extension.
#
# PyPI has pyslurm only for Slurm 25.11 (an sdist). Two patches make it right for 26.05, both
# applied to the unpacked sdist and checked to have applied:
#   1. setup.py refuses any Slurm but 25.11 ("Slurm version mismatch"): accept any.
#   2. pyslurm declares Slurm's internal `struct job_resources` itself (extra.pxi). 26.05 has one
#      more pointer-sized member between nhosts and node_req (measured: its records carry two
#      NULL words where 25.11 has node_bitmap alone), so every later member was read one slot
#      off and Job.get_resource_layout_per_node() segfaulted. We add that slot.
# It compiles with three defines for symbols 26.05 renamed or dropped. The venv also gets the
# bridge's dependencies and pytest, so the bridge and its tests run in the rootfs (PYTHONPATH).
#
# Then bridge_pyslurm_ext.pyx (next to this script) is compiled against the installed pyslurm.
#
# Stamps: the venv's holds a hash of this script (versions, flags, patches); the extension's a
# hash of that plus its source. Edit either and the next run rebuilds that part; else a no-op.
set -euo pipefail
. "$(dirname "$0")/../slurm/common.sh"
HERE="$SBX_REPO/containers/pyslurm"

PYSLURM_VERSION=25.11.2
CYTHON_VERSION=3.2.9
BUILD_REQS=(setuptools==84.2.1 wheel==0.48.0 packaging==26.4 "Cython==$CYTHON_VERSION")
# The versions of the host's .venv, so both sides run the same libraries.
RUN_REQS=(
  aiohttp==3.14.5 structlog==26.1.0 tenacity==9.2.1 kubernetes_asyncio==36.1.0 prometheus_client==0.26.0
  pydantic==2.14.4 typing_extensions==4.16.0 orjson==3.13.0
  pytest==9.2.0 pytest-asyncio==1.5.0
)
SLURM_CFLAGS="-DSLURM_BACKWARD_COMPAT -Dslurm_free_ctl_conf=slurm_free_conf -DESLURM_ERROR_ON_DESC_TO_RECORD_COPY=2999"
# pyslurm links libslurmfull (Slurm's internal library); the extension must link the same one,
# or it would get a second, uninitialised copy of libslurm's state.
SLURM_LIBDIR=/usr/lib/x86_64-linux-gnu/slurm-wlm

VENV=/opt/pyslurm-venv                      # path inside the rootfs
HOST_VENV="$ROOTFS$VENV"                    # the same directory seen from the host
venv_key=$(sha256sum "$0" | cut -c1-16)
ext_key=$(cat "$0" "$HERE/bridge_pyslurm_ext.pyx" | sha256sum | cut -c1-16)

{ is_running slurm-ns && mountpoint -q "$ROOTFS"; } || die "the Slurm sandbox is not up (run: make sandbox-up)"

exec 9>"$ROOTFS/opt/.pyslurm-venv.lock"
flock 9   # one build at a time; a second caller waits, then finds the stamps

stamp_is() { [ "$(cat "$HOST_VENV/.built-$1" 2>/dev/null)" = "$2" ]; }
if stamp_is pyslurm "$venv_key" && stamp_is ext "$ext_key"; then
  echo "$VENV"
  exit 0
fi

# Scratch space the chroot sees (not /tmp: the Slurm namespace mounts its own /tmp there).
work=$(mktemp -d -p "$ROOTFS/opt" pyslurm-build.XXXXXX)
trap 'rm -rf "$work"' EXIT

# in_rootfs SCRIPT: run a bash script in the rootfs with the build environment. PIP_FIND_LINKS may
# name a host directory, meaningless there.
in_rootfs() {
  in_ns env -u PIP_FIND_LINKS \
    SSL_CERT_FILE=/etc/host-ca-bundle.crt PIP_CERT=/etc/host-ca-bundle.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_PROGRESS_BAR=off \
    SLURM_INCLUDE_DIR=/usr/include SLURM_LIB_DIR=/usr/lib/x86_64-linux-gnu SLURM_LIBDIR="$SLURM_LIBDIR" \
    CFLAGS="$SLURM_CFLAGS" PYSLURM_BUILD_JOBS="$(nproc)" \
    VENV="$VENV" WORK="${work#"$ROOTFS"}" PYSLURM_VERSION="$PYSLURM_VERSION" \
    BUILD_REQS="${BUILD_REQS[*]}" RUN_REQS="${RUN_REQS[*]}" \
    bash -euo pipefail -c "$1" >&2
}

if ! stamp_is pyslurm "$venv_key"; then
  t0=$SECONDS
  say "building pyslurm $PYSLURM_VERSION (Cython $CYTHON_VERSION) for Slurm 26.05 into $HOST_VENV (~2 min)"
  rm -rf "$HOST_VENV"
  # The venv is built in place (a venv cannot be moved); the stamp, written last, marks it done.
  # shellcheck disable=SC2016  # expanded in the rootfs, from in_rootfs's environment
  in_rootfs '
    python3 -m venv "$VENV"
    pip="$VENV/bin/pip"
    "$pip" install -q $BUILD_REQS
    "$pip" download -q --no-deps --no-binary :all: "pyslurm==$PYSLURM_VERSION" -d "$WORK"
    tar -xzf "$WORK/pyslurm-$PYSLURM_VERSION.tar.gz" -C "$WORK"
    cd "$WORK/pyslurm-$PYSLURM_VERSION"

    sed -i "s/if Version(self.version) != Version(SLURM_VERSION):/if False:  # bridge: any Slurm/" setup.py
    grep -q "if False:  # bridge: any Slurm" setup.py || { echo "patch 1 (version check) did not apply" >&2; exit 1; }
    sed -i "s/^    bitstr_t \*node_bitmap$/&\n    void *added_in_26_05  # bridge: one more member in 26.05/" pyslurm/slurm/extra.pxi
    grep -q "added_in_26_05" pyslurm/slurm/extra.pxi || { echo "patch 2 (job_resources) did not apply" >&2; exit 1; }

    "$pip" install -q --no-build-isolation .
    "$pip" install -q $RUN_REQS
    cd /
    "$VENV/bin/python" -c "import pyslurm; print(\"pyslurm\", pyslurm.__version__, \"imports\")"
  '
  echo "$venv_key" >"$HOST_VENV/.built-pyslurm"
  say "pyslurm venv ready in $((SECONDS - t0)) s"
fi

if ! stamp_is ext "$ext_key"; then
  t0=$SECONDS
  rm -f "$HOST_VENV/.built-ext"
  cp "$HERE/bridge_pyslurm_ext.pyx" "$work/"
  # It cimports pyslurm, whose .pxd files (and the headers they name) are in site-packages.
  # shellcheck disable=SC2016
  in_rootfs '
    cd "$WORK"
    site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_path(\"purelib\"))")
    "$VENV/bin/python" - "$site" <<PY
import os, sys
from Cython.Build import cythonize
from setuptools import Extension, setup
site, libdir = sys.argv[1], os.environ["SLURM_LIBDIR"]
ext = Extension("bridge_pyslurm_ext", ["bridge_pyslurm_ext.pyx"], include_dirs=[site],
                libraries=["slurmfull"], library_dirs=[libdir], runtime_library_dirs=[libdir])
setup(name="bridge-pyslurm-ext", ext_modules=cythonize([ext], include_path=[site], quiet=True),
      script_args=["-q", "build_ext", "--build-lib", site])
PY
    cd /
    "$VENV/bin/python" -c "import pyslurm, bridge_pyslurm_ext; print(\"bridge_pyslurm_ext imports\")"
  '
  echo "$ext_key" >"$HOST_VENV/.built-ext"
  say "bridge_pyslurm_ext built in $((SECONDS - t0)) s"
fi
echo "$VENV"
