#!/usr/bin/env bash
# Starts or stops N real runc containers in kubelet-style cgroups, each with 1 MiB written to
# its runtime-default 64 MiB /dev/shm. Sourced by the benchmark scripts; needs root, runc and
# busybox-static.
#
#   bench/containers.sh start N     # prints nothing; containers are named shmlink-bench-<i>-<hex>
#   bench/containers.sh stop
set -euo pipefail

RUNC_ROOT=/run/shmlink-bench
WORK=${SHMLINK_BENCH_DIR:-/tmp/shmlink-bench}

start() {
  local n=$1
  mkdir -p "$WORK/rootfs/bin" "$WORK/rootfs/dev" "$WORK/rootfs/proc" "$WORK/rootfs/sys" "$WORK/rootfs/tmp"
  cp /bin/busybox "$WORK/rootfs/bin/busybox"
  for a in sh sleep dd; do ln -sf busybox "$WORK/rootfs/bin/$a"; done
  for i in $(seq 1 "$n"); do
    local uid id bundle
    uid=$(cat /proc/sys/kernel/random/uuid)
    id=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
    bundle="$WORK/bundles/$i"
    mkdir -p "$bundle"
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
 "linux": {"cgroupsPath": "/kubepods/burstable/pod$uid/$id",
   "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}]}}
JSON
    runc --root "$RUNC_ROOT" run -d --bundle "$bundle" "shmlink-bench-$i-${id:0:8}" </dev/null >/dev/null 2>&1
  done
}

stop() {
  local ids
  ids=$(runc --root "$RUNC_ROOT" list -q 2>/dev/null || true)
  for id in $ids; do runc --root "$RUNC_ROOT" delete --force "$id" >/dev/null 2>&1 || true; done
  # runc leaves the pod-level cgroups behind.
  for h in /sys/fs/cgroup/*/kubepods/burstable /sys/fs/cgroup/kubepods/burstable; do
    [ -d "$h" ] && find "$h" -mindepth 1 -depth -type d -name 'pod*' -exec rmdir {} \; 2>/dev/null || true
    rmdir "$h" "$(dirname "$h")" 2>/dev/null || true
  done
  rm -rf "$WORK"
}

case "${1:-}" in
  start) start "${2:?N}" ;;
  stop) stop ;;
  *) echo "usage: $0 start N | stop" >&2; exit 2 ;;
esac
