#!/usr/bin/env bash
# The shm end-to-end scenarios on a pure cgroup v2 hierarchy, in a qemu VM (TCG: no KVM needed).
#
#   scripts/vm/run.sh [SHMLINK_BINARY]
#
# Fetches Debian's cloud kernel once (cached in target/vm/kernel), builds an initramfs of
# busybox-static, runc and its libraries, the shmlink binary (stripped; default
# $CARGO_TARGET_DIR/debug/shmlink), a program that crashes in a libnccl.so.2, scripts/vm/init and
# scripts/vm/scenarios.sh; boots it, keeps the serial console in target/vm/console.log, and has
# scripts/vm/verify.py check what the VM said. Exit status: 0 every scenario passed, 1 a
# scenario failed or the VM did not finish, 2 it could not run here (said on stderr).
#
# Needs no root itself (the VM is root inside); needs busybox-static, runc, cpio, gcc, python3
# and apt (for the kernel, and for qemu where none is installed: scripts/vm/fetch-qemu.sh
# unpacks Debian's under target/vm/qemu; SHMLINK_VM_QEMU=private uses that one always).
# scripts/test.sh installs the rest as root.
set -euo pipefail
cd "$(dirname "$0")/../.."
vm_dir=target/vm
bin=${1:-${CARGO_TARGET_DIR:-target}/debug/shmlink}
timeout_s=${SHMLINK_VM_TIMEOUT:-900}
start=$(date +%s.%N)

missing=()
for t in runc cpio gcc python3 apt-get apt-cache dpkg-deb; do
  command -v "$t" >/dev/null || missing+=("$t")
done
[ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 || missing+=("static /bin/busybox")
[ -x "$bin" ] || missing+=("$bin (cargo build)")
if [ ${#missing[@]} -gt 0 ]; then
  echo "vm: cannot run: missing ${missing[*]}" >&2
  exit 2
fi

mkdir -p "$vm_dir"
if command -v qemu-system-x86_64 >/dev/null && [ "${SHMLINK_VM_QEMU:-}" != private ]; then
  qemu=qemu-system-x86_64
elif ! qemu=$(scripts/vm/fetch-qemu.sh "$vm_dir/qemu"); then
  echo "vm: cannot run: no qemu (scripts/vm/fetch-qemu.sh failed, above)" >&2
  exit 2
fi
if ! kernel=$(scripts/vm/fetch-kernel.sh "$vm_dir/kernel"); then
  echo "vm: cannot run: no kernel (scripts/vm/fetch-kernel.sh failed, above)" >&2
  exit 2
fi

# --- the initramfs ---------------------------------------------------------------------------
root=$vm_dir/initramfs
rm -rf "$root"
mkdir -p "$root"/{bin,usr/bin,usr/sbin,lib64,nccl,proc,sys,dev,run,tmp,mnt}
cp /bin/busybox "$root/bin/busybox"
cp scripts/vm/init "$root/init"
cp scripts/vm/scenarios.sh "$root/scenarios.sh"
cp "$(command -v runc)" "$root/usr/sbin/runc"
# The debug binary carries ~180 MB of debug info the VM has no use for.
strip -o "$root/usr/bin/shmlink" "$bin"
# Every shared library runc and shmlink load, at the path the loader looks for it.
for exe in "$root/usr/sbin/runc" "$root/usr/bin/shmlink"; do
  ldd "$exe" | awk '/=> \// {print $3} /^\t\/lib/ {print $1}' | while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
done
# A program whose crash the kernel reports in libnccl.so.2 (as tests/e2e_containers/failures.rs builds it):
# no libc, its own loader beside it, so it runs in a busybox-only container.
nccl_src=$(mktemp -d)
trap 'rm -rf "$nccl_src"' EXIT
echo 'int ncclAllReduce(void) { volatile int *p = (int *)0; return *p; }' > "$nccl_src/nccl.c"
printf 'extern int ncclAllReduce(void);\nvoid _start(void) { ncclAllReduce(); for (;;) {} }\n' \
  > "$nccl_src/crash.c"
gcc -shared -fPIC -nostdlib -Wl,-soname,libnccl.so.2 -o "$root/nccl/libnccl.so.2" "$nccl_src/nccl.c"
gcc -nostdlib -fno-stack-protector -o "$root/nccl/crash" "$nccl_src/crash.c" \
  -L"$root/nccl" -l:libnccl.so.2 -Wl,-rpath,/nccl -Wl,--dynamic-linker=/nccl/ld-linux-x86-64.so.2
cp -L /lib64/ld-linux-x86-64.so.2 "$root/nccl/ld-linux-x86-64.so.2"
initrd=$vm_dir/initramfs.cpio.gz
(cd "$root" && find . | cpio -o -H newc --quiet) | gzip -1 > "$initrd"
built=$(date +%s.%N)
echo "vm: kernel $(basename "$kernel"), initramfs $(du -h "$initrd" | cut -f1), built in" \
  "$(awk "BEGIN {printf \"%.1f\", $built - $start}") s" >&2

# --- boot ------------------------------------------------------------------------------------
# cgroup_no_v1=all + systemd.unified_cgroup_hierarchy=1: no v1 hierarchy can be mounted, the
# init mounts cgroup2 alone. quiet keeps kernel messages off the console (the scenarios read
# /dev/kmsg themselves); panic=-1 turns a dead init into a reset, which -no-reboot turns into
# qemu's exit.
log=$vm_dir/console.log
rm -f "$log"
set +e
timeout "$timeout_s" "$qemu" -accel tcg -m 2G -smp 2 -nic none \
  -kernel "$kernel" -initrd "$initrd" \
  -append 'console=ttyS0 quiet panic=-1 systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all' \
  -display none -monitor none -serial "file:$log" -no-reboot < /dev/null
qemu_rc=$?
set -e
booted=$(date +%s.%N)
echo "vm: qemu exited $qemu_rc after $(awk "BEGIN {printf \"%.1f\", $booted - $built}") s" >&2
if [ "$qemu_rc" = 124 ]; then
  echo "vm: FAILED: the VM did not finish within $timeout_s s; console:" >&2
  tail -n 50 "$log" >&2
  exit 1
fi
rc=0
python3 scripts/vm/verify.py "$log" || rc=$?
echo "vm: total $(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $start}") s" >&2
exit $rc
