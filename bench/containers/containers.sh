#!/usr/bin/env bash
# Starts or stops N real runc containers in kubelet-style cgroups
# (/kubepods/burstable/pod<uid>/<64 hex>, 256 MiB memory limit), each with 1 MiB written to its
# runtime-default 64 MiB /dev/shm. Needs root, runc and busybox-static.
#
#   bench/containers/containers.sh start N [PARALLEL]
#       starts them PARALLEL at a time (default 8) and returns once every one has written its data
#   bench/containers/containers.sh pids    # "<pid>" of each running bench container, one a line
#   bench/containers/containers.sh stop    # removes them and only the cgroups they made
#
# Containers are named shmlink-bench-<i>-<hex>; runc's state lives in its own root, apart from
# the end-to-end tests' containers. With SHMLINK_BENCH_CGROUP_PARENT=/NAME their cgroups are
# under /NAME/kubepods/... instead, apart from whatever else runs on the machine (run.sh
# --isolated scans only that subtree).
set -euo pipefail

RUNC_ROOT=/run/shmlink-bench
WORK=${SHMLINK_BENCH_DIR:-/tmp/shmlink-bench}
PARENT=${SHMLINK_BENCH_CGROUP_PARENT:-}
MEMORY_LIMIT=$((256 << 20))

die() { echo "containers.sh: $*" >&2; exit 2; }

# Fails early, with the reason, when N containers cannot fit on this machine.
check_limits() {
  local n=$1 pid_max threads procs avail_kib need_kib nofile
  [ "$(id -u)" = 0 ] || die "needs root"
  command -v runc >/dev/null || die "runc is not installed (apt-get install runc)"
  [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 ||
    die "a static /bin/busybox is needed (apt-get install busybox-static)"
  pid_max=$(cat /proc/sys/kernel/pid_max)
  threads=$(cat /proc/sys/kernel/threads-max)
  procs=$(ls /proc | grep -c '^[0-9]')
  # One sleep per container; runc's own processes come and go while starting.
  [ $((procs + n + 64)) -lt "$pid_max" ] || die "$n containers exceed kernel.pid_max=$pid_max"
  [ $((procs + n + 64)) -lt "$threads" ] || die "$n containers exceed kernel.threads-max=$threads"
  if [ "$(ulimit -u)" != unlimited ] && [ $((procs + n + 64)) -ge "$(ulimit -u)" ]; then
    die "$n containers exceed ulimit -u=$(ulimit -u)"
  fi
  local pids_max=/sys/fs/cgroup/pids/pids.max
  [ -f "$pids_max" ] || pids_max=/sys/fs/cgroup/pids.max
  if [ -f "$pids_max" ] && [ "$(cat "$pids_max")" != max ] && [ $((n + 64)) -ge "$(cat "$pids_max")" ]; then
    die "$n containers exceed the pids cgroup limit $(cat "$pids_max")"
  fi
  for f in /proc/sys/user/max_mnt_namespaces /proc/sys/user/max_pid_namespaces /proc/sys/user/max_ipc_namespaces; do
    [ ! -f "$f" ] || [ "$(cat "$f")" -gt $((n + 64)) ] || die "$n containers exceed $f=$(cat "$f")"
  done
  # Per container: 1 MiB of /dev/shm data, the sleep (~0.3 MiB), kernel objects (~1 MiB).
  avail_kib=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)
  need_kib=$((n * 3 * 1024 + 512 * 1024))
  [ "$avail_kib" -gt "$need_kib" ] || die "$n containers need ~$((need_kib / 1024)) MiB, $((avail_kib / 1024)) MiB available"
  nofile=$(ulimit -n)
  [ "$nofile" = unlimited ] || [ "$nofile" -ge 1024 ] || die "ulimit -n=$nofile is too low"
}

start() {
  local n=$1 parallel=${2:-8}
  check_limits "$n"
  mkdir -p "$WORK/rootfs/bin" "$WORK/rootfs/dev" "$WORK/rootfs/proc" "$WORK/rootfs/sys" "$WORK/rootfs/tmp" "$WORK/bundles"
  [ -x "$WORK/rootfs/bin/busybox" ] || cp /bin/busybox "$WORK/rootfs/bin/busybox"
  for a in sh sleep dd df; do ln -sf busybox "$WORK/rootfs/bin/$a"; done
  local first=$(( $(ls "$WORK/bundles" | wc -l) + 1 ))
  for i in $(seq "$first" $((first + n - 1))); do
    local uid id bundle
    uid=$(cat /proc/sys/kernel/random/uuid)
    id=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
    bundle="$WORK/bundles/$i"
    mkdir -p "$bundle"
    echo "$PARENT/kubepods/burstable/pod$uid" >>"$WORK/pod-cgroups"
    echo "shmlink-bench-$i-${id:0:8}" >"$bundle/name"
    cat >"$bundle/config.json" <<JSON
{"ociVersion": "1.0.2",
 "process": {"terminal": false, "user": {"uid": 0, "gid": 0}, "cwd": "/", "env": ["PATH=/bin"],
   "args": ["sh", "-c", "dd if=/dev/zero of=/dev/shm/data bs=1M count=1 2>/dev/null; exec sleep 1000000"],
   "noNewPrivileges": true},
 "root": {"path": "$WORK/rootfs", "readonly": true},
 "mounts": [
   {"destination": "/proc", "type": "proc", "source": "proc"},
   {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755", "size=1024k"]},
   {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}],
 "linux": {"cgroupsPath": "$PARENT/kubepods/burstable/pod$uid/$id",
   "resources": {"memory": {"limit": $MEMORY_LIMIT}},
   "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}]}}
JSON
  done
  seq "$first" $((first + n - 1)) | xargs -P "$parallel" -I{} sh -c '
    b='"$WORK"'/bundles/{}
    runc --root '"$RUNC_ROOT"' run -d --bundle "$b" "$(cat "$b/name")" </dev/null >/dev/null 2>"$b/err" ||
      { echo "runc run $(cat "$b/name") failed: $(cat "$b/err")" >&2; exit 255; }'
  # Ready once each container's shell has written its data and exec'd sleep.
  local deadline=$((SECONDS + 120)) running ready
  while :; do
    running=0 ready=0
    for pid in $(pids); do
      running=$((running + 1))
      [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = sleep ] && ready=$((ready + 1))
    done
    [ "$ready" -ge $((first + n - 1)) ] && break
    [ $SECONDS -lt $deadline ] || die "only $ready of $((first + n - 1)) containers ready ($running running)"
    sleep 0.2
  done
}

# The init PID of every running bench container.
pids() {
  runc --root "$RUNC_ROOT" list -f json 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin) or []; print("\n".join(str(c["pid"]) for c in d if c["status"]=="running"))'
}

stop() {
  local ids
  ids=$(runc --root "$RUNC_ROOT" list -q 2>/dev/null || true)
  [ -z "$ids" ] || xargs -P 8 -n 16 sh -c 'for id; do runc --root '"$RUNC_ROOT"' delete --force "$id" >/dev/null 2>&1 || true; done' _ <<<"$ids"
  # runc leaves the pod-level cgroups behind: remove the ones made here, in every hierarchy.
  if [ -f "$WORK/pod-cgroups" ]; then
    while read -r pod; do
      for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
        [ -d "$h$pod" ] && rmdir "$h$pod" 2>/dev/null || true
      done
    done <"$WORK/pod-cgroups"
    for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
      rmdir "$h${PARENT#/}${PARENT:+/}kubepods/burstable" "$h${PARENT#/}${PARENT:+/}kubepods" 2>/dev/null || true
      [ -z "$PARENT" ] || rmdir "$h${PARENT#/}" 2>/dev/null || true
    done
  fi
  rm -rf "$WORK"
}

case "${1:-}" in
  start) start "${2:?N}" "${3:-8}" ;;
  pids) pids ;;
  stop) stop ;;
  *) echo "usage: $0 start N [PARALLEL] | pids | stop" >&2; exit 2 ;;
esac
