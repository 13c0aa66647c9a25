#!/usr/bin/env bash
# Start the Slurm half of the sandbox: munge, MariaDB, slurmdbd, slurmctld,
# slurmrestd (JWT, loopback) and the native partition's slurmds, all chrooted
# into a Debian sid rootfs (Slurm 26.05) inside one private mount namespace.
set -euo pipefail
. "$(dirname "$0")/common.sh"

cached_rootfs=$("$SLURM_DIR/rootfs.sh")
ensure_dirs
mkdir -p "$ROOTFS"
# A mount left by an earlier sandbox may show another (older) rootfs: replace it.
mounted_from=$(awk -v m="$ROOTFS" '$5 == m {print $4}' /proc/self/mountinfo | tail -1)
if [ -n "$mounted_from" ] && [ "$mounted_from" != "$cached_rootfs" ] && ! is_running slurm-ns; then
  while mountpoint -q "$ROOTFS"; do umount "$ROOTFS" || break; done
fi
if ! mountpoint -q "$ROOTFS"; then mount --bind "$cached_rootfs" "$ROOTFS"; fi
mkdir -p "$SLURM_ETC" "$SLURM_STATE/ctld" "$SLURM_STATE/slurmd" "$SBX_STATE/munge" "$SBX_STATE/gpus" \
  "$SBX_STATE/mysql" "$SBX_STATE/bin"

# --- users: same uid/gid on the host and in the rootfs ----------------------
ensure_user() { # ROOT NAME UID: create NAME in the passwd of ROOT ("" = host)
  local root=$1 name=$2 id=$3
  if ! chroot "${root:-/}" getent passwd "$name" >/dev/null; then
    chroot "${root:-/}" groupadd -g "$id" "$name" 2>/dev/null || true
    chroot "${root:-/}" useradd -u "$id" -g "$id" -d "$SBX_SHARED_HOME/$name" -s /bin/bash -M "$name"
  fi
}
for entry in $SBX_USERS; do
  name=${entry%%:*} id=${entry##*:}
  ensure_user "" "$name" "$id"
  ensure_user "$ROOTFS" "$name" "$id"
  install -d -o "$id" -g "$id" -m 755 "$SBX_SHARED_HOME/$name"
done
# One shared project group beyond each user's own (same gid everywhere): jobs, native or bridged,
# see it among their supplementary groups.
ensure_member() { # ROOT GROUP GID USER
  local root=$1 group=$2 gid=$3 user=$4
  chroot "${root:-/}" getent group "$group" >/dev/null || chroot "${root:-/}" groupadd -g "$gid" "$group"
  if ! chroot "${root:-/}" id -nG "$user" | tr ' ' '\n' | grep -qx "$group"; then
    chroot "${root:-/}" usermod -aG "$group" "$user"
    groups_changed=1
  fi
}
groups_changed=0
for entry in $SBX_USERS; do
  ensure_member "" "$SBX_SHARED_GROUP" "$SBX_SHARED_GID" "${entry%%:*}"
  ensure_member "$ROOTFS" "$SBX_SHARED_GROUP" "$SBX_SHARED_GID" "${entry%%:*}"
done
# Host-side clients resolve SlurmUser by name: mirror the rootfs's uid.
ensure_user "" slurm "$(chroot "$ROOTFS" id -u slurm)"
# slurmrestd refuses root and SlurmUser: it gets a user of its own.
ensure_user "$ROOTFS" slurmrest 2100

# --- config files -----------------------------------------------------------
ports_of() { # first-last port for a list of node names
  local first last
  first=$(node_port "$1"); last=$(node_port "${@: -1}")
  [ "$first" = "$last" ] && echo "$first" || echo "$first-$last"
}
render() { # TEMPLATE > OUT
  sed -e "s|@STATE@|$SBX_STATE|g" -e "s|@HOSTNAME@|$(hostname)|g" \
    -e "s|@SLURMCTLD_PORT@|$SBX_SLURMCTLD_PORT|g" -e "s|@SLURMDBD_PORT@|$SBX_SLURMDBD_PORT|g" \
    -e "s|@NATIVE_NODES@|$(native_hostlist)|g" \
    -e "s|@NATIVE_PORTS@|$(ports_of $(native_nodes))|g" \
    -e "s|@GPUS@|$SBX_GPUS_PER_NODE|g" -e "s|@LASTGPU@|$((SBX_GPUS_PER_NODE - 1))|g" "$1"
}
# bridged FILE PARTITION NODES PORTS CPUS MEMORY_MB FEATURES: one of deploy/slurm's bridged
# snippets, filled in for the sandbox (all slurmds listen on loopback, one port per node).
bridged() {
  sed -e "s|@PARTITION@|$2|g" -e "s|@NODES@|$3|g" -e "s|@PORTS@|${4:-}|g" -e "s|@CPUS@|${5:-}|g" \
    -e "s|@MEMORY_MB@|${6:-}|g" -e "s|@FEATURES@|${7:-}|g" -e "s|@SLURMD_HOST@|localhost|g" \
    -e "s|@SLURMD_ADDR@|127.0.0.1|g" -e "s|@GPUS@|$SBX_GPUS_PER_NODE|g" \
    -e "s|@GPU_DIR@|$SBX_STATE/gpus|g" -e "s|@LAST_GPU@|$((SBX_GPUS_PER_NODE - 1))|g" \
    "$SBX_REPO/deploy/slurm/$1" | grep -v '^#'
}
# k8s = the real kubelets, sim = the kwok nodes. The real nodes share a 2-core VM; Slurm is told
# 8 CPUs each so that a dozen jobs can run at once, and the bridge's sandbox config requests a
# tenth of each allocation (cpu_request_fraction) so the kubelets admit them.
# What the running slurmctld (if any) read: a slurm.conf changed since is applied below.
previous_conf=$(cat "$SLURM_ETC/slurm.conf" 2>/dev/null || true)
{
  render "$SLURM_DIR/etc/slurm.conf.in"
  bridged slurm.conf.bridged k8s "$(real_hostlist)" "$(ports_of $SBX_REAL_NODES)" 8 8192 k8s
  # dra = the same real nodes, whose pods get their GPUs by DRA claims (gpu_mode = "dra"): the
  # sandbox's DRA driver publishes the gres.conf's GPUs there, index N = Slurm's index N.
  # PriorityTier=2, as urgent's: a `high` job here suspends a `suspendable` one of k8s on the same
  # nodes (the gang scheduler suspends only under a higher tier's jobs).
  echo "PartitionName=dra Nodes=$(real_hostlist) MaxTime=INFINITE State=UP PriorityTier=2"
  # simdra = the kwok nodes with GPUs by DRA claims, for make bench-scale's count of the claims'
  # API writes (containers/kube/up.sh publishes their mock devices as ResourceSlices).
  echo "PartitionName=simdra Nodes=$(sim_hostlist) MaxTime=INFINITE State=UP"
  bridged slurm.conf.bridged sim "$(sim_hostlist)" "$(ports_of $(sim_node_names))" 64 262144 k8s,kwok
} >"$SLURM_ETC/slurm.conf"
render "$SLURM_DIR/etc/slurmdbd.conf.in" >"$SLURM_ETC/slurmdbd.conf"
{
  render "$SLURM_DIR/etc/gres.conf.in"
  bridged gres.conf.bridged - "$(real_hostlist),$(sim_hostlist)"
} >"$SLURM_ETC/gres.conf"
cp "$SLURM_DIR/etc/cgroup.conf" "$SLURM_ETC/cgroup.conf"
# Host-side clients (cli.sh) load plugins from the rootfs through its bind
# mount; the same path resolves inside the rootfs too, so jobs that inherit
# this SLURM_CONF from a host-side sbatch still find their plugins.
mkdir -p "$SLURM_ETC/host"
{
  echo "PluginDir=$ROOTFS/usr/lib/x86_64-linux-gnu/slurm-wlm:$SLURM_STATE/plugins"
  grep -v '^PluginDir=' "$SLURM_ETC/slurm.conf"
} >"$SLURM_ETC/host/slurm.conf"
cp "$SLURM_DIR/etc/cgroup.conf" "$SLURM_ETC/host/cgroup.conf"
# The bridge's job_submit.lua and SPANK step guard fail closed without their settings: the
# sandbox's bridged partitions are bridged from the start (bridge-up rewrites them from its config).
[ -f "$SLURM_ETC/job_submit.lua" ] || cp "$SBX_REPO/deploy/slurm/job_submit.lua" "$SLURM_ETC/job_submit.lua"
"$SBX_REPO/containers/bridge/settings.sh"
# plugstack.conf beside both slurm.confs (rootfs daemons, host-side clients): the same plugin path
# resolves in both, $SBX_STATE being the same path inside the rootfs.
for dir in "$SLURM_ETC" "$SLURM_ETC/host"; do
  printf 'required %s settings=%s\n' "$STEP_GUARD" "$SLURM_ETC/job_submit_bridge.conf" >"$dir/plugstack.conf.new"
  mv "$dir/plugstack.conf.new" "$dir/plugstack.conf"
done
for ((g = 0; g < SBX_GPUS_PER_NODE; g++)); do
  [ -c "$SBX_STATE/gpus/gpu$g" ] || mknod "$SBX_STATE/gpus/gpu$g" c 1 3
done

# --- the mount namespace holder ---------------------------------------------
if ! is_running slurm-ns; then
  start_bg slurm-ns unshare --mount --propagation private -- sleep infinity
  own_ns=$(readlink /proc/self/ns/mnt)
  ns_ready() { [ "$(readlink "/proc/$(cat "$SBX_RUN/slurm-ns.pid")/ns/mnt")" != "$own_ns" ]; }
  wait_for "the Slurm mount namespace" 5 ns_ready
  mkdir -p "$ROOTFS$SBX_STATE" "$ROOTFS$SBX_SHARED_HOME"
  nsenter -t "$(cat "$SBX_RUN/slurm-ns.pid")" -m -- sh -ec "
    mount -t proc proc '$ROOTFS/proc'
    mount -t sysfs sysfs '$ROOTFS/sys'
    mount --rbind /dev '$ROOTFS/dev'
    mount -t tmpfs -o mode=755 tmpfs '$ROOTFS/run'
    mount -t tmpfs -o mode=1777 tmpfs '$ROOTFS/tmp'
    mount --bind '$SBX_SHARED_HOME' '$ROOTFS$SBX_SHARED_HOME'
    # rbind: host clients' rootfs path must resolve in here too (PluginDir).
    mount --rbind '$SBX_STATE' '$ROOTFS$SBX_STATE'"
fi

# --- the bridge's SPANK step guard (deploy/slurm/spank), built against this Slurm ------------
# Before any slurmd starts (plugstack.conf says `required`); rebuilt only when its source changed.
guard_src="$SBX_REPO/deploy/slurm/spank/slurm_k8s_bridge_guard.c"
guard_key=$(cat "$guard_src" | sha256sum | cut -c1-12)
if [ "$(cat "$STEP_GUARD.key" 2>/dev/null)" != "$guard_key" ]; then
  mkdir -p "$(dirname "$STEP_GUARD")"
  cp "$guard_src" "$SLURM_STATE/spank/guard.c"
  in_ns gcc -O2 -Wall -Werror -fPIC -shared -o "$STEP_GUARD.new" "$SLURM_STATE/spank/guard.c"
  mv "$STEP_GUARD.new" "$STEP_GUARD" && echo "$guard_key" >"$STEP_GUARD.key"
fi

# --- jobacct_gather/linux_k8s_bridge (deploy/slurm/jobacct): pods' usage in Slurm's accounting ------
# Before slurmctld and the slurmds start (slurm.conf names it); rebuilt only when its source changed.
jobacct_src="$SBX_REPO/deploy/slurm/jobacct/jobacct_gather_linux_k8s_bridge.c"
jobacct_plugin="$SLURM_STATE/plugins/jobacct_gather_linux_k8s_bridge.so"
jobacct_key=$(cat "$jobacct_src" | sha256sum | cut -c1-12)
if [ "$(cat "$jobacct_plugin.key" 2>/dev/null)" != "$jobacct_key" ]; then
  mkdir -p "$SLURM_STATE/plugins"
  cp "$jobacct_src" "$SLURM_STATE/plugins/jobacct.c"
  in_ns gcc -O2 -Wall -Werror -fPIC -shared -o "$jobacct_plugin.new" "$SLURM_STATE/plugins/jobacct.c" -ldl
  mv "$jobacct_plugin.new" "$jobacct_plugin" && echo "$jobacct_key" >"$jobacct_plugin.key"
fi

# --- munge ------------------------------------------------------------------
if [ ! -f "$SBX_STATE/munge/munge.key" ]; then
  head -c 1024 /dev/urandom >"$SBX_STATE/munge/munge.key"
fi
in_ns chown -R munge:munge "$SBX_STATE/munge"
chmod 700 "$SBX_STATE/munge"; chmod 400 "$SBX_STATE/munge/munge.key"
# The socket dir must be reachable by every user (host clients included).
chmod 711 "$SBX_STATE/munge"
start_bg munged "$SLURM_DIR/in-ns.sh" runuser -u munge -- munged --foreground --force \
  --socket="$SBX_STATE/munge/munge.socket.2" --key-file="$SBX_STATE/munge/munge.key" \
  --pid-file="$SBX_STATE/munge/munged.pid" --seed-file="$SBX_STATE/munge/munged.seed"
wait_for munged 10 test -S "$SBX_STATE/munge/munge.socket.2"
# Some client paths (the slurmdbd connection of sacctmgr/sacct) ignore
# AuthInfo and use munge's default socket; point it at ours, in the rootfs and
# on the host (which has no munge of its own).
in_ns ln -sfn "$SBX_STATE/munge" /run/munge
if [ ! -e /run/munge ] || [ -L /run/munge ]; then ln -sfn "$SBX_STATE/munge" /run/munge; fi

# --- MariaDB for slurmdbd ---------------------------------------------------
in_ns install -d -o mysql -g mysql /run/mariadbd
# bookworm's libmariadb (see rootfs.sh) looks for the socket under /run/mysqld.
in_ns ln -sfn /run/mariadbd /run/mysqld
if [ ! -d "$SBX_STATE/mysql/mysql" ]; then
  in_ns chown mysql:mysql "$SBX_STATE/mysql"
  in_ns mariadb-install-db --user=mysql --datadir="$SBX_STATE/mysql" --skip-test-db >>"$SBX_LOG/mariadb-init.log" 2>&1
fi
start_bg mariadb "$SLURM_DIR/in-ns.sh" mariadbd --user=mysql --datadir="$SBX_STATE/mysql" --socket=/run/mariadbd/mysqld.sock \
  --pid-file=/run/mariadbd/mysqld.pid --skip-networking --innodb-buffer-pool-size=128M \
  --innodb-snapshot-isolation=OFF --innodb-lock-wait-timeout=900
wait_for mariadb 30 in_ns mariadb-admin --socket=/run/mariadbd/mysqld.sock ping
in_ns mariadb --socket=/run/mariadbd/mysqld.sock -e "
  CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED VIA unix_socket;
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"

# --- slurmdbd, slurmctld ----------------------------------------------------
if [ ! -f "$SLURM_STATE/jwt.key" ]; then
  head -c 32 /dev/urandom | base64 >"$SLURM_STATE/jwt.key"
fi
in_ns chown slurm:slurm "$SLURM_STATE/jwt.key" "$SLURM_STATE/ctld" "$SLURM_ETC/slurmdbd.conf"
chmod 600 "$SLURM_STATE/jwt.key" "$SLURM_ETC/slurmdbd.conf"
chmod 755 "$SLURM_STATE" "$SLURM_ETC"

start_bg slurmdbd "$SLURM_DIR/in-ns.sh" slurmdbd -D
wait_for slurmdbd 30 in_ns sacctmgr -i show cluster
if ! in_ns sacctmgr -n -P show cluster format=cluster | grep -qx sandbox; then
  in_ns sacctmgr -i add cluster sandbox >/dev/null
fi
start_bg slurmctld "$SLURM_DIR/in-ns.sh" slurmctld -D -i
wait_for slurmctld 30 in_ns scontrol ping
# A running slurmctld caches users' groups: a membership added above reaches jobs after this.
# So does a slurm.conf changed under a running one (a checkout with new settings).
conf_changed=0
if [ -n "$previous_conf" ] && [ "$previous_conf" != "$(cat "$SLURM_ETC/slurm.conf")" ]; then conf_changed=1; fi
if [ "$groups_changed" = 1 ] || [ "$conf_changed" = 1 ]; then
  in_ns scontrol reconfigure
fi

# Accounts: each test user in an account of its own.
for entry in $SBX_USERS; do
  name=${entry%%:*}
  if ! in_ns sacctmgr -n -P show assoc user="$name" format=user | grep -qx "$name"; then
    in_ns sacctmgr -i add account "lab_$name" cluster=sandbox description="$name's lab" >/dev/null
    in_ns sacctmgr -i add user "$name" account="lab_$name" cluster=sandbox >/dev/null
  fi
done

# The QOSes for preemption (slurm.conf's PreemptType=preempt/qos): `high` preempts `normal` (its
# jobs are requeued) and `suspendable` (its jobs are suspended until the preemptor ends). Every
# test user may use them.
if ! in_ns sacctmgr -n -P show qos format=name | grep -qx suspendable; then
  in_ns sacctmgr -i add qos suspendable preemptmode=suspend >/dev/null
fi
if ! in_ns sacctmgr -n -P show qos format=name | grep -qx high; then
  in_ns sacctmgr -i add qos high priority=1000 preempt=normal,suspendable >/dev/null
elif ! in_ns sacctmgr -n -P show qos high format=preempt | tr ',' '\n' | grep -qx suspendable; then
  in_ns sacctmgr -i modify qos high set preempt=normal,suspendable >/dev/null
fi
# A QOS with a GPU limit per user: `gpu2` lets a user hold 2 GPUs at once; more pend with reason
# QOSMaxGRESPerUser (sbatch --qos=gpu2, or a managed namespace's pod annotated with it).
if ! in_ns sacctmgr -n -P show qos format=name | grep -qx gpu2; then
  in_ns sacctmgr -i add qos gpu2 maxtresperuser=gres/gpu=2 >/dev/null
fi
for entry in $SBX_USERS; do
  name=${entry%%:*}
  for qos in high suspendable gpu2; do
    if ! in_ns sacctmgr -n -P show assoc user="$name" format=qos | tr ',' '\n' | grep -qx "$qos"; then
      in_ns sacctmgr -i modify user "$name" set qos+="$qos" >/dev/null
    fi
  done
done

# --- slurmd for the native partition ----------------------------------------
# Jobs reach a node by the name Slurm gives it (MASTER_ADDR=$(scontrol show hostnames ... | head
# -n1)): the native nodes' names resolve in the rootfs, to 127.0.0.1 as their NodeAddr says.
for node in $(native_nodes); do
  grep -qw "$node" "$ROOTFS/etc/hosts" || echo "127.0.0.1 $node" >>"$ROOTFS/etc/hosts"
done
# A changed slurm.conf (a plugin type, say) reaches a running slurmd only by its restart; the
# bridged slurmds restart at bridge-up. Running jobs keep their slurmstepds.
if [ "$conf_changed" = 1 ]; then
  for node in $(native_nodes); do stop_bg "slurmd-$node"; done
fi
for node in $(native_nodes); do start_slurmd "$node"; done

# --- slurmrestd (JWT; loopback, and the control address for pods) -----------
ensure_control_ip
start_bg slurmrestd "$SLURM_DIR/in-ns.sh" env SLURM_JWT=daemon runuser -u slurmrest -- \
  slurmrestd -a rest_auth/jwt -s openapi/slurmctld,openapi/slurmdbd \
  "127.0.0.1:$SBX_SLURMRESTD_PORT" "$SBX_CONTROL_IP:$SBX_SLURMRESTD_PORT"

for node in $(native_nodes); do
  wait_for "slurmd $node" 30 sh -c "'$SLURM_DIR/cli.sh' sinfo -h -n $node -o %T | grep -qE '^(idle|mixed|allocated|drain|drained|draining)'"
done
say "Slurm is up: slurmctld :$SBX_SLURMCTLD_PORT, slurmdbd :$SBX_SLURMDBD_PORT, slurmrestd http://127.0.0.1:$SBX_SLURMRESTD_PORT"

# --- host-side wrappers (see `make sandbox-env`) ----------------------------
for cmd in sbatch srun salloc squeue scancel sacct sacctmgr scontrol sinfo sprio sshare sstat sattach munge unmunge; do
  # A job of the native partition inherits this PATH but runs inside the Slurm rootfs, where the
  # host's cli.sh does not exist and the rootfs's own client is the right one.
  cat >"$SBX_STATE/bin/$cmd" <<WRAP
#!/bin/sh
[ -x '$SLURM_DIR/cli.sh' ] || exec /usr/bin/$cmd "\$@"
exec '$SLURM_DIR/cli.sh' $cmd "\$@"
WRAP
  chmod 755 "$SBX_STATE/bin/$cmd"
done
