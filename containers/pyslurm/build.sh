#!/usr/bin/env bash
# Build (once) pyslurm for the sandbox's Slurm 26.05 into a venv inside the Slurm rootfs,
# at /opt/pyslurm-venv (on the host: $SBX_STATE/rootfs/opt/pyslurm-venv). Prints that
# in-rootfs path. Needs the sandbox's Slurm half up (it builds through in-ns.sh).
#
# PyPI has pyslurm only for Slurm 25.11 (sdist); its setup.py refuses any other Slurm.
# We patch that one check in the unpacked sdist and compile with three defines that map the
# symbols 26.05 renamed or dropped. The venv also gets the bridge's own dependencies and
# pytest, so the bridge package and its tests can run inside the rootfs (PYTHONPATH).
#
# The stamp file holds a hash of this script (versions, flags, patch): edit any of them and
# the next run rebuilds; otherwise this is a no-op.
set -euo pipefail
. "$(dirname "$0")/../slurm/common.sh"

PYSLURM_VERSION=25.11.2
CYTHON_VERSION=3.2.9
BUILD_REQS=(setuptools==84.2.1 wheel==0.48.0 packaging==26.4 "Cython==$CYTHON_VERSION")
# The same versions as the host's .venv, so both sides run the same libraries.
RUN_REQS=(
  aiohttp==3.14.5 structlog==26.1.0 tenacity==9.2.1 kubernetes_asyncio==36.1.0
  pytest==9.2.0 pytest-asyncio==1.5.0
)
SLURM_CFLAGS="-DSLURM_BACKWARD_COMPAT -Dslurm_free_ctl_conf=slurm_free_conf -DESLURM_ERROR_ON_DESC_TO_RECORD_COPY=2999"

VENV=/opt/pyslurm-venv                      # path inside the rootfs
HOST_VENV="$ROOTFS$VENV"                    # the same directory seen from the host
STAMP="$HOST_VENV/.built"
key=$(sha256sum "$0" | cut -c1-16)

[ -f "$SBX_RUN/slurm-ns.pid" ] && is_running slurm-ns && mountpoint -q "$ROOTFS" \
  || die "the Slurm sandbox is not up (run: make sandbox-up)"

exec 9>"$ROOTFS/opt/.pyslurm-venv.lock"
flock 9   # one build at a time; a second caller waits, then finds the stamp

if [ "$(cat "$STAMP" 2>/dev/null)" = "$key" ]; then
  echo "$VENV"
  exit 0
fi

t0=$SECONDS
say "building pyslurm $PYSLURM_VERSION (Cython $CYTHON_VERSION) for Slurm 26.05 into $HOST_VENV (~1-2 min)"
rm -rf "$HOST_VENV"
# The venv is built in place (a venv cannot be moved); the stamp, written last, marks it done.
in_ns env -u PIP_FIND_LINKS \
  SLURM_INCLUDE_DIR=/usr/include SLURM_LIB_DIR=/usr/lib/x86_64-linux-gnu \
  SSL_CERT_FILE=/etc/host-ca-bundle.crt PIP_CERT=/etc/host-ca-bundle.crt \
  PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_PROGRESS_BAR=off \
  VENV="$VENV" PYSLURM_VERSION="$PYSLURM_VERSION" CFLAGS="$SLURM_CFLAGS" PYSLURM_BUILD_JOBS="$(nproc)" \
  BUILD_REQS="${BUILD_REQS[*]}" RUN_REQS="${RUN_REQS[*]}" \
  bash -euo pipefail -c '
    python3 -m venv "$VENV"
    pip="$VENV/bin/pip"
    "$pip" install -q $BUILD_REQS
    src=$(mktemp -d)
    trap "rm -rf $src" EXIT
    "$pip" download -q --no-deps --no-binary :all: "pyslurm==$PYSLURM_VERSION" -d "$src"
    tar -xzf "$src/pyslurm-$PYSLURM_VERSION.tar.gz" -C "$src"
    cd "$src/pyslurm-$PYSLURM_VERSION"
    # The only patch: accept any Slurm version (setup.py compares major.minor for equality).
    sed -i "s/if Version(self.version) != Version(SLURM_VERSION):/if False:  # bridge: any Slurm/" setup.py
    grep -q "if False:  # bridge: any Slurm" setup.py || { echo "setup.py version check not found: patch is stale" >&2; exit 1; }
    "$pip" install -q --no-build-isolation .
    "$pip" install -q $RUN_REQS
    cd /
    "$VENV/bin/python" -c "import pyslurm; print(\"pyslurm\", pyslurm.__version__, \"imports\")"
  ' >&2
echo "$key" >"$STAMP"
say "pyslurm venv ready in $((SECONDS - t0)) s"
echo "$VENV"
