#!/usr/bin/env bash
# Runs the whole test suite. As root it installs what the end-to-end tests need (runc,
# busybox-static) and makes those tests fail rather than skip when they cannot run; as a normal
# user it says loudly what it skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then
  missing=()
  command -v runc >/dev/null || missing+=(runc)
  [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 || missing+=(busybox-static)
  # tests/e2e_prometheus.rs and scripts/test-deploy.sh: the rules, alerts and dashboard queries
  # against Debian's Prometheus and Alertmanager.
  command -v prometheus >/dev/null || missing+=(prometheus)
  command -v prometheus-alertmanager >/dev/null || missing+=(prometheus-alertmanager)
  # tests/e2e_hostile.rs: what the agent opens, traced
  command -v strace >/dev/null || missing+=(strace)
  # tests/e2e_docker.rs: a private Docker engine (its own socket and data root), stopped after
  command -v dockerd >/dev/null || missing+=(docker.io)
  # tests/e2e_deaths.rs, tests/e2e_docker.rs, tests/e2e_death_trace.rs: a real SIGBUS from
  # Debian's Python in a container
  [ -x /usr/bin/python3 ] || missing+=(python3)
  # tests/e2e_death_trace.rs: the agent without CAP_PERFMON (setpriv)
  command -v setpriv >/dev/null || missing+=(util-linux)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  export SHMLINK_E2E=require
else
  cat >&2 <<'MSG'
############################################################################
SKIPPED: not root. runc and busybox-static are not installed and every
end-to-end test against real containers (tests/e2e_*.rs) says SKIPPED and
returns without checking anything. Run as root for the full suite.
############################################################################
MSG
fi
# What an operator installs: kustomize builds, schemas, promtool rules and unit tests, Dockerfile.
# As a normal user, a missing tool is reported SKIPPED instead of failing.
if [ "$(id -u)" = 0 ]; then
  scripts/test-deploy.sh
else
  SHMLINK_DEPLOY_SKIP_MISSING=1 scripts/test-deploy.sh
fi
# Builds the fake NVML libraries too: the GPU tests load them by path.
cargo build --workspace
cargo test --workspace
# The shm scenarios again, in a qemu VM (TCG) on a pure cgroup v2 hierarchy in kubelet's
# systemd-driver layout (scripts/vm/): this machine's own hierarchy is v1 (hybrid). qemu is not
# installed (Debian's would conflict with a newer qemu-utils some machines hold): where none is
# on the PATH, scripts/vm/fetch-qemu.sh unpacks Debian's under target/vm/qemu. As root, cpio is
# installed when missing; when the step cannot run it says SKIPPED loudly.
vm_skipped() {
  cat >&2 <<MSG
############################################################################
SKIPPED: the cgroup v2 VM scenarios (scripts/vm/run.sh): $1
Nothing was checked on cgroup v2 with real containers.
############################################################################
MSG
}
if [ "$(id -u)" = 0 ]; then
  # The kernel (and qemu, where none is installed) come from apt's package lists.
  apt-cache show linux-image-cloud-amd64 >/dev/null 2>&1 || apt-get update -qq
  if ! command -v cpio >/dev/null; then
    echo "== installing cpio"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --no-remove cpio \
      >/tmp/shmlink-vm-apt.log 2>&1 || cat /tmp/shmlink-vm-apt.log >&2
  fi
fi
echo "== cgroup v2 VM"
vm_start=$(date +%s)
vm_rc=0
scripts/vm/run.sh || vm_rc=$?
echo "== cgroup v2 VM: $(($(date +%s) - vm_start)) s"
# 2: it could not run here (said above): a failure as root, as the e2e tests are.
if [ "$vm_rc" = 2 ] && [ "$(id -u)" != 0 ]; then
  vm_skipped "not root, and a tool it needs is missing (above)"
elif [ "$vm_rc" != 0 ]; then
  exit "$vm_rc"
fi
