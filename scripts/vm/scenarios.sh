#!/bin/sh
# Runs inside the test VM (busybox sh, cgroup v2 only). Makes runc containers in kubelet's
# systemd-driver layout, runs `shmlink check --json` and `shmlink serve`, and prints what it
# made and what shmlink said between @@ markers on the serial console; the host
# (scripts/vm/verify.py) checks one against the other. Nothing here decides pass or fail.
set -u
MIB=1048576
RUNC="runc --root /run/runc"
CG=/sys/fs/cgroup
BURSTABLE=kubepods.slice/kubepods-burstable.slice

hex() { od -An -tx1 -N"$1" /dev/urandom | tr -d ' \n'; }
# A v4 UUID, as the API server makes pod UIDs.
pod_uid() {
  h=$(hex 16)
  echo "$(echo "$h" | cut -c1-8)-$(echo "$h" | cut -c9-12)-4$(echo "$h" | cut -c14-16)-a$(echo "$h" | cut -c18-20)-$(echo "$h" | cut -c21-32)"
}
# kubelet's systemd driver spells a pod UID with underscores in the slice name.
underscored() { echo "$1" | tr '-' '_'; }

# Every controller the root offers, enabled down to (not including) the cgroup $1, as systemd
# does for the slices kubelet creates; the pod slice gets a memory.max of its own later.
enable_controllers_to() {
  local dir=$CG ctrls="" c part
  for c in $(cat $CG/cgroup.controllers); do
    case $c in memory|pids|cpu|io) ctrls="$ctrls +$c" ;; esac
  done
  for part in $(echo "$1" | tr '/' ' '); do
    for c in $ctrls; do echo "$c" > "$dir/cgroup.subtree_control" 2>/dev/null || true; done
    dir=$dir/$part
    mkdir -p "$dir"
  done
}

# bundle DIR CGROUP SHM MEMLIMIT CMD
#   SHM: default (a private 64 MiB tmpfs), bind:<path> (an emptyDir), hostipc, none
#   MEMLIMIT: bytes for the container's memory.max, or 0 for none
bundle() {
  local dir=$1 cgroup=$2 shm=$3 limit=$4 cmd=$5 ipc shm_mount mem a
  mkdir -p "$dir/rootfs/bin" "$dir/rootfs/dev" "$dir/rootfs/proc" "$dir/rootfs/sys" \
    "$dir/rootfs/tmp" "$dir/rootfs/etc" "$dir/rootfs/nccl"
  ln /bin/busybox "$dir/rootfs/bin/busybox" 2>/dev/null || cp /bin/busybox "$dir/rootfs/bin/busybox"
  for a in sh sleep dd touch rm ln ls test cat head true; do ln -s busybox "$dir/rootfs/bin/$a"; done
  # The program that crashes in libnccl.so.2 (its loader and library beside it).
  cp /nccl/* "$dir/rootfs/nccl/"
  ipc='{"type": "ipc"},'
  case $shm in
    default) shm_mount=', {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}' ;;
    bind:*) shm_mount=", {\"destination\": \"/dev/shm\", \"type\": \"bind\", \"source\": \"${shm#bind:}\", \"options\": [\"rbind\", \"rw\"]}" ;;
    hostipc) ipc=''; shm_mount=', {"destination": "/dev/shm", "type": "bind", "source": "/dev/shm", "options": ["rbind", "rw"]}' ;;
    none) shm_mount='' ;;
  esac
  mem=''
  [ "$limit" != 0 ] && mem="\"memory\": {\"limit\": $limit},"
  cat > "$dir/config.json" <<JSON
{
  "ociVersion": "1.0.2",
  "process": {
    "terminal": false, "user": {"uid": 0, "gid": 0},
    "args": ["sh", "-c", "$cmd"],
    "env": ["PATH=/bin"], "cwd": "/",
    "capabilities": {"bounding": ["CAP_KILL"], "effective": ["CAP_KILL"], "permitted": ["CAP_KILL"]},
    "noNewPrivileges": true
  },
  "root": {"path": "rootfs", "readonly": false},
  "hostname": "vm-e2e",
  "mounts": [
    {"destination": "/proc", "type": "proc", "source": "proc"},
    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
    {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}
    $shm_mount
  ],
  "linux": {
    "cgroupsPath": "/$cgroup",
    "resources": {$mem "devices": [{"allow": false, "access": "rwm"}]},
    "namespaces": [$ipc {"type": "pid"}, {"type": "network"}, {"type": "uts"}, {"type": "mount"}],
    "maskedPaths": ["/proc/kcore", "/proc/keys", "/sys/firmware"],
    "readonlyPaths": ["/proc/sys", "/proc/sysrq-trigger"]
  }
}
JSON
}

# start NAME CGROUP SHM MEMLIMIT CMD: a detached runc container; prints nothing, says on failure.
start() {
  local name=$1 cgroup=$2 id dir
  id=${cgroup##*/}
  id=${id#cri-containerd-}; id=${id#crio-}; id=${id%.scope}
  dir=/bundles/$name
  bundle "$dir" "$cgroup" "$3" "$4" "$5"
  echo "$id" > "$dir/id"
  enable_controllers_to "$(dirname "$cgroup")"
  # --no-pivot: the VM's root is the initramfs, which pivot_root cannot leave.
  if ! $RUNC run -d --no-pivot --bundle "$dir" "$id" > "$dir/console.log" 2>&1 < /dev/null; then
    echo "@@ERROR runc run $name failed: $(cat "$dir/console.log" | tr '\n' ' ')"
    return 1
  fi
}

# wait_ready NAME: until the container's script touched /tmp/ready (its rootfs is ours to look at).
wait_ready() {
  local i=0
  while [ ! -e "/bundles/$1/rootfs/tmp/ready" ]; do
    i=$((i + 1))
    if [ $i -gt 600 ]; then
      echo "@@ERROR $1 never got ready: $(cat "/bundles/$1/console.log" | tr '\n' ' ')"
      return 1
    fi
    sleep 0.1
  done
}

# scenario NAME key=value...: what the scenario made, for the host to check against.
scenario() {
  local name=$1 kv
  shift
  printf '@@SCENARIO %s' "$name"
  for kv in "$@"; do printf ' %s' "$kv"; done
  printf '\n'
}

# scrape_until PORT FILE PATTERN: /metrics into FILE until it holds PATTERN (at most 60 s).
scrape_until() {
  local i=0
  until grep -q "$3" "$2" 2>/dev/null; do
    i=$((i + 1)); [ $i -gt 120 ] && break
    sleep 0.5
    wget -q -O "$2" "http://127.0.0.1:$1/metrics"
  done
}

write() { echo "dd if=/dev/zero of=/dev/shm/data bs=1M count=$1 2>/dev/null; touch /tmp/ready; exec sleep 3600"; }

echo "@@VM-CONTROLLERS $(cat $CG/cgroup.controllers)"
mkdir -p /bundles

# 1. The runtime's default 64 MiB /dev/shm, 20 MiB written: containerd in a burstable pod.
u=$(pod_uid); c=$(hex 32)
cg=$BURSTABLE/kubepods-burstable-pod$(underscored "$u").slice/cri-containerd-$c.scope
start default64 "$cg" default 0 "$(write 20)" && scenario default64 pod_uid=$u container_id=$c cgroup=/$cg written_mib=20

# 2. The same, 62 MiB written: critical, and check exits 1.
u=$(pod_uid); c=$(hex 32)
cg=$BURSTABLE/kubepods-burstable-pod$(underscored "$u").slice/cri-containerd-$c.scope
start full64 "$cg" default 0 "$(write 62)" && scenario full64 pod_uid=$u container_id=$c cgroup=/$cg written_mib=62

# 3. A 1 GiB memory-backed emptyDir bind-mounted at /dev/shm, 100 MiB written.
mkdir -p /mnt/emptydir; mount -t tmpfs -o size=1g,mode=1777 tmpfs /mnt/emptydir
u=$(pod_uid); c=$(hex 32)
cg=$BURSTABLE/kubepods-burstable-pod$(underscored "$u").slice/cri-containerd-$c.scope
start emptydir "$cg" bind:/mnt/emptydir 0 "$(write 100)" && scenario emptydir pod_uid=$u container_id=$c cgroup=/$cg written_mib=100 size_mib=1024

# 4. Host IPC: the VM's own 32 MiB /dev/shm.
u=$(pod_uid); c=$(hex 32)
cg=$BURSTABLE/kubepods-burstable-pod$(underscored "$u").slice/cri-containerd-$c.scope
start hostipc "$cg" hostipc 0 "touch /tmp/ready; exec sleep 3600" && scenario hostipc pod_uid=$u container_id=$c cgroup=/$cg size_mib=32

# 5. CRI-O's naming: crio-<id>.scope in the pod slice, 10 MiB written.
u=$(pod_uid); c=$(hex 32)
cg=$BURSTABLE/kubepods-burstable-pod$(underscored "$u").slice/crio-$c.scope
start crio "$cg" default 0 "$(write 10)" && scenario crio pod_uid=$u container_id=$c cgroup=/$cg written_mib=10

# 6. A guaranteed pod (no QoS slice): kubepods.slice/kubepods-pod<uid>.slice.
u=$(pod_uid); c=$(hex 32)
cg=kubepods.slice/kubepods-pod$(underscored "$u").slice/cri-containerd-$c.scope
start guaranteed "$cg" default 0 "$(write 5)" && scenario guaranteed pod_uid=$u container_id=$c cgroup=/$cg written_mib=5

# 7. The pod slice's memory.max (48 MiB) below the container's (256 MiB) and the emptyDir's
#    size (512 MiB): the effective limit is the pod slice's. 24 MiB written.
mkdir -p /mnt/emptydir2; mount -t tmpfs -o size=512m,mode=1777 tmpfs /mnt/emptydir2
u=$(pod_uid); c=$(hex 32)
pod=$BURSTABLE/kubepods-burstable-pod$(underscored "$u").slice
cg=$pod/cri-containerd-$c.scope
enable_controllers_to "$pod/x"
echo $((48 * MIB)) > "$CG/$pod/memory.max"
start podlimit "$cg" bind:/mnt/emptydir2 $((256 * MIB)) "$(write 24)" && \
  scenario podlimit pod_uid=$u container_id=$c cgroup=/$cg written_mib=24 size_mib=512 \
    pod_limit_mib=48 container_limit_mib=256 \
    "pod_memory_max=$(cat "$CG/$pod/memory.max")" "container_memory_max=$(cat "$CG/$cg/memory.max")"

# 8. Hostile: nothing mounted at /dev/shm, and a symlink there to a 7 MiB tmpfs of the VM's
#    (a size nothing else has): the agent must not follow it.
mkdir -p /mnt/hostile; mount -t tmpfs -o size=7m,mode=1777 tmpfs /mnt/hostile
u=$(pod_uid); c=$(hex 32)
cg=$BURSTABLE/kubepods-burstable-pod$(underscored "$u").slice/cri-containerd-$c.scope
start symlink "$cg" none 0 "ln -s /mnt/hostile /dev/shm; touch /tmp/ready; exec sleep 3600" && \
  scenario symlink pod_uid=$u container_id=$c cgroup=/$cg

# 9. What PyTorch and NCCL do: create, open, unlink, keep using. 16 MiB no ls can see.
u=$(pod_uid); c=$(hex 32)
cg=$BURSTABLE/kubepods-burstable-pod$(underscored "$u").slice/cri-containerd-$c.scope
start unlinked "$cg" default 0 "dd if=/dev/zero of=/dev/shm/torch_1 bs=1M count=16 2>/dev/null; exec 3</dev/shm/torch_1; rm /dev/shm/torch_1; touch /tmp/ready; exec sleep 3600" && \
  scenario unlinked pod_uid=$u container_id=$c cgroup=/$cg written_mib=16

# 10. Two containers of one pod sharing a 256 MiB emptyDir: one writes 30 MiB, both show it.
mkdir -p /mnt/emptydir3; mount -t tmpfs -o size=256m,mode=1777 tmpfs /mnt/emptydir3
u=$(pod_uid); c=$(hex 32); c2=$(hex 32)
pod=$BURSTABLE/kubepods-burstable-pod$(underscored "$u").slice
start sharedw "$pod/cri-containerd-$c.scope" bind:/mnt/emptydir3 0 "$(write 30)" && \
  scenario sharedw pod_uid=$u container_id=$c cgroup=/$pod/cri-containerd-$c.scope written_mib=30 size_mib=256
start sharedr "$pod/cri-containerd-$c2.scope" bind:/mnt/emptydir3 0 "touch /tmp/ready; exec sleep 3600" && \
  scenario sharedr pod_uid=$u container_id=$c2 cgroup=/$pod/cri-containerd-$c2.scope written_mib=30 size_mib=256

# 11. The other way round from 7: the container's memory.max (96 MiB) below its pod slice's
#     (512 MiB): the container's is the effective limit. 40 MiB written to a 1 GiB emptyDir.
mkdir -p /mnt/emptydir4; mount -t tmpfs -o size=1g,mode=1777 tmpfs /mnt/emptydir4
u=$(pod_uid); c=$(hex 32)
pod=$BURSTABLE/kubepods-burstable-pod$(underscored "$u").slice
enable_controllers_to "$pod/x"
echo $((512 * MIB)) > "$CG/$pod/memory.max"
start ctrlimit "$pod/cri-containerd-$c.scope" bind:/mnt/emptydir4 $((96 * MIB)) "$(write 40)" && \
  scenario ctrlimit pod_uid=$u container_id=$c cgroup=/$pod/cri-containerd-$c.scope written_mib=40 \
    "pod_memory_max=$(cat "$CG/$pod/memory.max")" "container_memory_max=$(cat "$CG/$pod/cri-containerd-$c.scope/memory.max")"

for n in default64 full64 emptydir hostipc crio guaranteed podlimit symlink unlinked sharedw sharedr ctrlimit; do
  [ -d /bundles/$n ] && wait_ready $n
done
echo "@@RUNC-LIST"; $RUNC list
# What ls sees of the unlinked file inside the container: nothing (rc=0 proves ls ran).
[ -d /bundles/unlinked ] && \
  echo "@@UNLINKED-LS [$($RUNC exec "$(cat /bundles/unlinked/id)" sh -c 'ls -A /dev/shm; echo rc=$?' 2>&1 | tr '\n' ' ')]"

# check --json, once: every container above in one report.
t0=$(cut -d' ' -f1 /proc/uptime)
shmlink check --json --no-gpu --kmsg off --pod-log-root /nonexistent > /tmp/check.json 2> /tmp/check.err
rc=$?
t1=$(cut -d' ' -f1 /proc/uptime)
echo "@@CHECK-EXIT $rc"
echo "@@CHECK-SECONDS $(awk "BEGIN {print $t1 - $t0}")"
echo "@@BEGIN check-json"; cat /tmp/check.json; echo; echo "@@END check-json"
echo "@@BEGIN check-stderr"; cat /tmp/check.err; echo "@@END check-stderr"

# serve, scraped from inside, then a process that crashes in libnccl.so.2 told by /dev/kmsg.
ip link set lo up
# --state-dir none: the VM's root is the host's, whose /var/lib/shmlink is not the test's.
shmlink serve --no-gpu --kube off --listen 127.0.0.1:9477 --interval 1s --kmsg /dev/kmsg \
  --pod-log-root /nonexistent --state-dir none > /tmp/serve.log 2>&1 &
serve_pid=$!
i=0
until wget -q -O /tmp/readyz http://127.0.0.1:9477/readyz 2>/dev/null; do
  i=$((i + 1)); [ $i -gt 300 ] && { echo "@@ERROR serve never ready"; break; }
  sleep 0.2
done
sleep 2
wget -q -O /tmp/metrics1 http://127.0.0.1:9477/metrics
echo "@@BEGIN metrics"; cat /tmp/metrics1; echo "@@END metrics"

# The crashing job: its main process is seen by a scan, then becomes the crashing program
# (exec keeps the PID), as in tests/e2e_containers/failures.rs.
u=$(pod_uid); c=$(hex 32)
cg=$BURSTABLE/kubepods-burstable-pod$(underscored "$u").slice/cri-containerd-$c.scope
start crash "$cg" default 0 "sleep 3; exec /nccl/crash" && scenario crash pod_uid=$u container_id=$c cgroup=/$cg
scrape_until 9477 /tmp/metrics2 'kind="gpu_job_crashed"'
echo "@@BEGIN metrics-after-crash"; cat /tmp/metrics2; echo "@@END metrics-after-crash"
echo "@@BEGIN kmsg-segfault"; dmesg | grep 'segfault at'; echo "@@END kmsg-segfault"

# An OOM kill of /dev/shm pages on cgroup v2: a 1 GiB emptyDir filled past the container's
# 64 MiB memory.max; the kernel's report, read from /dev/kmsg by the serve above.
mkdir -p /mnt/emptydir5; mount -t tmpfs -o size=1g,mode=1777 tmpfs /mnt/emptydir5
u=$(pod_uid); c=$(hex 32)
cg=$BURSTABLE/kubepods-burstable-pod$(underscored "$u").slice/cri-containerd-$c.scope
start oom "$cg" bind:/mnt/emptydir5 $((64 * MIB)) \
  "touch /tmp/ready; sleep 2; dd if=/dev/zero of=/dev/shm/batch bs=1M count=200 2>/dev/null; exec sleep 3600" && \
  scenario oom pod_uid=$u container_id=$c cgroup=/$cg limit_mib=64
scrape_until 9477 /tmp/metrics3 'kind="shm_oom_killed"'
echo "@@BEGIN metrics-after-oom"; cat /tmp/metrics3; echo "@@END metrics-after-oom"
echo "@@BEGIN kmsg-oom"; dmesg | grep -E 'invoked oom-killer|^.{0,20}memory: usage|Memory cgroup stats for|^.{0,20}shmem |^.{0,20}anon |oom-kill:|Killed process'; echo "@@END kmsg-oom"
shmlink check --json --no-gpu --kmsg /dev/kmsg --since 10m --pod-log-root /nonexistent > /tmp/check-oom.json 2>/dev/null
echo "@@BEGIN check-oom"; cat /tmp/check-oom.json; echo; echo "@@END check-oom"
kill -TERM $serve_pid; wait $serve_pid
echo "@@SERVE-EXIT $?"
echo "@@BEGIN serve-log"; tail -n 40 /tmp/serve.log; echo "@@END serve-log"

# The same without the kernel log: the container's memory.events counts the kill. A second
# container, its process killed while the agent watches.
shmlink serve --no-gpu --kube off --listen 127.0.0.1:9478 --interval 1s --kmsg off \
  --pod-log-root /nonexistent --state-dir none > /tmp/serve2.log 2>&1 &
serve_pid=$!
i=0
until wget -q -O /tmp/readyz http://127.0.0.1:9478/readyz 2>/dev/null; do
  i=$((i + 1)); [ $i -gt 300 ] && { echo "@@ERROR serve --kmsg off never ready"; break; }
  sleep 0.2
done
mkdir -p /mnt/emptydir6; mount -t tmpfs -o size=1g,mode=1777 tmpfs /mnt/emptydir6
u=$(pod_uid); c=$(hex 32)
cg=$BURSTABLE/kubepods-burstable-pod$(underscored "$u").slice/cri-containerd-$c.scope
start oomcount "$cg" bind:/mnt/emptydir6 $((64 * MIB)) \
  "touch /tmp/ready; sleep 3; dd if=/dev/zero of=/dev/shm/batch bs=1M count=200 2>/dev/null; exec sleep 3600" && \
  scenario oomcount pod_uid=$u container_id=$c cgroup=/$cg limit_mib=64
scrape_until 9478 /tmp/metrics4 'kind="shm_oom_killed"'
echo "@@BEGIN metrics-after-oomcount"; cat /tmp/metrics4; echo "@@END metrics-after-oomcount"
echo "@@BEGIN memory-events"; cat "$CG/$cg/memory.events"; echo "@@END memory-events"
kill -TERM $serve_pid; wait $serve_pid
echo "@@BEGIN serve2-log"; grep -i oom /tmp/serve2.log | tail -n 5; echo "@@END serve2-log"
exit 0
