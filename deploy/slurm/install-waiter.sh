#!/usr/bin/env bash
# install-waiter.sh DEST: build the compiled waiter (agent/cmd/waiter) of this checkout and install
# it as DEST, the program `[waiter] attach_command` names (default
# /usr/libexec/slurm-k8s-bridge/waiter). Run as root on every host of a bridged slurmd.
#
# The waiter runs as the job's user, so nobody but root may replace it: DEST ends up root-owned,
# mode 755, in a directory only root writes, and takes the place of the old one by one rename (a
# job starting meanwhile runs the old or the new program, never half of one). It is static: cgo for
# its early constructors (the pending signals; the job's GO* variables, kept from its runtime), Go's
# own resolver and user lookup (nothing of the C library's NSS, which the host's or the job's
# settings would steer), no program interpreter (ld.so) that the job's environment could steer
# either.
set -euo pipefail
umask 022  # the directories it makes: root's to write alone

die() { echo "install-waiter.sh: $*" >&2; exit 1; }

[ $# -eq 1 ] || die "usage: install-waiter.sh DEST (e.g. /usr/libexec/slurm-k8s-bridge/waiter)"
dest=$1
case $dest in
  /*) ;;
  *) die "DEST must be an absolute path, not '$dest' (attach_command names it so)" ;;
esac
[ "$(id -u)" = 0 ] || die "run it as root: the waiter must be root-owned"
dir=$(dirname "$dest")
[ -d "$dest" ] && die "$dest is a directory; DEST is the waiter's file"
if [ ! -d "$dir" ]; then
  install -d -m 755 -o root -g root "$dir"
fi
# Whoever may write the directory may put another program in the waiter's place; whoever may
# write one above it may rename the directory away and put their own there (a sticky one, as
# /tmp, lets them rename only their own entries).
above=$dir
while :; do
  owner=$(stat -c %u "$above")
  [ "$owner" = 0 ] || die "$above is owned by uid $owner, not root: anyone it belongs to could replace the waiter"
  mode=$(stat -c %a "$above")
  if [ "$above" = "$dir" ] || (( (8#$mode & 8#1000) == 0 )); then
    (( (8#$mode & 8#022) == 0 )) || die "$above is writable by group or others (mode $mode): anyone could replace the waiter"
  fi
  [ "$above" = / ] && break
  above=$(dirname "$above")
done

agent=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../agent" && pwd) || die "no agent/ beside deploy/: run it from a checkout"
export PATH="$PATH:/usr/local/go/bin"  # the PATH's Go first, else Go's own install place
# Built as root: nothing of the caller's environment chooses the compiler, its flags or a
# toolchain to download.
unset CC CXX CGO_CFLAGS CGO_CPPFLAGS CGO_CXXFLAGS CGO_LDFLAGS GOFLAGS GOENV GOROOT
export GOTOOLCHAIN=local
command -v go >/dev/null || die "no Go toolchain (looked on the PATH and in /usr/local/go/bin)"
command -v gcc >/dev/null || die "no gcc: the waiter's early constructors are C (cgo)"

# Built beside DEST, so that the rename that installs it stays within one file system.
new=$(mktemp "$dir/.waiter.XXXXXX")
trap 'rm -f "$new"' EXIT
(cd "$agent" && CGO_ENABLED=1 GOFLAGS=-buildvcs=false go build -trimpath -tags netgo,osusergo \
  -ldflags '-s -w -linkmode external -extldflags -static' -o "$new" ./cmd/waiter) \
  || die "cannot build the waiter (agent/cmd/waiter); is the C library's static archive (libc.a) installed?"
# gcc comes with binutils' readelf. A program interpreter would mean a dynamic program.
headers=$(readelf -l "$new") || die "cannot read the build's program headers (readelf)"
case $headers in
  *INTERP*) die "the build is not static (it asks for a program interpreter)" ;;
esac
chown root:root "$new"
chmod 755 "$new"
mv -f "$new" "$dest"
trap - EXIT
echo "$dest"
