#!/usr/bin/env bash
# Replays the failure this project exists for, with real PyTorch (not run in CI: torch is ~5 GB).
# A DataLoader in a runc container on the runtime's default 64 MiB /dev/shm, in a kubelet-style
# cgroup, its output written as a CRI log under a pod log root the way containerd writes it;
# `shmlink serve` follows that log, and `shmlink check` reads it back afterwards.
#
#   scripts/replay/torch.sh [VENV]   (root; VENV defaults to ./target/torch-venv, made with
#                                     `python3 -m venv VENV && VENV/bin/pip install torch`)
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=$(readlink -f "${1:-target/torch-venv}")
[ -x "$venv/bin/python" ] || { echo "no venv at $venv: python3 -m venv $venv && $venv/bin/pip install torch" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "needs root (runc)" >&2; exit 2; }
command -v runc >/dev/null || { echo "needs runc (apt-get install runc)" >&2; exit 2; }
cargo build --release -q
bin=target/release/shmlink

python=$(readlink -f "$venv/bin/python")
pyhome=$(dirname "$(dirname "$python")")
work=$(mktemp -d /tmp/shmlink-replay-XXXXXX)
uid=$(cat /proc/sys/kernel/random/uuid)
id=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
logs="$work/pods"; cdir="$logs/ml_trainer-0_$uid/trainer"; mkdir -p "$cdir" "$work/bundle/rootfs"
trap 'runc kill "$id" KILL 2>/dev/null || true; runc delete --force "$id" 2>/dev/null || true; kill $serve 2>/dev/null || true' EXIT

python3 - "$work/bundle/config.json" "$uid" "$id" "$venv" "$pyhome" "$python" <<'PY'
import json, sys
out, uid, cid, venv, pyhome, python = sys.argv[1:]
ro = lambda p: {"destination": p, "type": "bind", "source": p, "options": ["rbind", "ro"]}
mounts = [
    {"destination": "/proc", "type": "proc", "source": "proc"},
    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]},
    # What containerd gives a Pod without an emptyDir at /dev/shm.
    {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
     "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
    {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"},
] + [ro(p) for p in ["/usr", "/lib", "/lib64", "/bin", "/etc", venv, pyhome, "/replay"]]
json.dump({
    "ociVersion": "1.0.2",
    "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "cwd": "/",
                "args": [venv + "/bin/python", "/replay/dataloader_shm.py", "24"],
                "env": ["PATH=/usr/bin:/bin", "PYTHONUNBUFFERED=1"]},
    "root": {"path": "rootfs", "readonly": True},
    "mounts": mounts,
    "linux": {"cgroupsPath": f"/kubepods/burstable/pod{uid}/{cid}",
              "namespaces": [{"type": t} for t in ["pid", "ipc", "uts", "mount"]]},
}, open(out, "w"), indent=1)
PY
# The script's folder is bound at /replay.
sed -i "s#\"source\": \"/replay\"#\"source\": \"$(pwd)/scripts/replay\"#" "$work/bundle/config.json"
for d in usr lib lib64 bin etc proc dev tmp replay; do mkdir -p "$work/bundle/rootfs/$d"; done
mkdir -p "$work/bundle/rootfs$venv" "$work/bundle/rootfs$pyhome"

port=${SHMLINK_REPLAY_PORT:-19477}
"$bin" serve --listen 127.0.0.1:$port --interval 1s --kube off --no-gpu --pod-log-root "$logs" \
  --kmsg off --log-format text 2> "$work/serve.log" & serve=$!
sleep 2

# containerd's log format: `<RFC 3339 nano> <stream> F <line>`, one line per line of output.
started=$(date +%s.%N)
runc run --bundle "$work/bundle" "$id" 2>&1 </dev/null |
  while IFS= read -r line; do printf '%s stderr F %s\n' "$(date -u +%Y-%m-%dT%H:%M:%S.%NZ)" "$line"; done \
  > "$cdir/0.log" || true
ended=$(date +%s.%N)
echo "== the container's log ($cdir/0.log), $(awk "BEGIN{printf \"%.2f\", $ended-$started}") s from start to death"
grep -v '^\S* stderr F \(  File\|    \)' "$cdir/0.log" | tail -8
sleep 2
echo "== shmlink serve's log"
grep -i "could not allocate" "$work/serve.log" | tail -3 || true
echo "== /metrics"
curl -s "http://127.0.0.1:$port/metrics" | grep "^shmlink_workload_failures_total" || true
kill $serve; wait $serve 2>/dev/null || true
echo "== shmlink check --since 10m --pod-log-root $logs --kmsg off --no-gpu --json (failures)"
{ "$bin" check --since 10m --pod-log-root "$logs" --kmsg off --no-gpu --json || true; } | python3 -c '
import json, sys; r = json.load(sys.stdin)
for f in r["failures"]: print(json.dumps(f, indent=1))'
