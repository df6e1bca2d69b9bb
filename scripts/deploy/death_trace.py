#!/usr/bin/env python3
"""The death-trace component (deploy/components/death-trace, used by deploy/examples/death-trace)
adds CAP_PERFMON, the host's tracefs read-only, SHMLINK_DEATH_TRACE=on and SHMLINK_TRACEFS to
the base DaemonSet, and nothing else.

    scripts/deploy/death_trace.py [BASE_CORE_YAML DEATH_TRACE_CORE_YAML]   (default: builds both)
"""
import copy
import sys

from deploycheck import arg, core, daemonset


base = daemonset(core(arg(1), "deploy/base"))
traced = daemonset(core(arg(2), "deploy/examples/death-trace"))
spec = traced["spec"]["template"]["spec"]
(c,) = spec["containers"]
caps = c["securityContext"]["capabilities"]["add"]
if sorted(caps) != sorted(["SYS_PTRACE", "DAC_READ_SEARCH", "PERFMON"]):
    sys.exit(f"FAIL: capabilities {caps}")
env = {e["name"]: e.get("value") for e in c["env"]}
if env.get("SHMLINK_DEATH_TRACE") != "on" or env.get("SHMLINK_TRACEFS") != "/host/sys/kernel/tracing":
    sys.exit(f"FAIL: env {env}")
mount = next(m for m in c["volumeMounts"] if m["name"] == "host-tracefs")
if mount != {"name": "host-tracefs", "mountPath": "/host/sys/kernel/tracing", "readOnly": True}:
    sys.exit(f"FAIL: mount {mount}")
volume = next(v for v in spec["volumes"] if v["name"] == "host-tracefs")
if volume["hostPath"]["path"] != "/sys/kernel/tracing":
    sys.exit(f"FAIL: volume {volume}")
# Everything else as in the base.
undo = copy.deepcopy(traced)
uspec = undo["spec"]["template"]["spec"]
(u,) = uspec["containers"]
u["securityContext"]["capabilities"]["add"] = [x for x in caps if x != "PERFMON"]
u["env"] = [e for e in u["env"] if e["name"] not in ("SHMLINK_DEATH_TRACE", "SHMLINK_TRACEFS")]
u["volumeMounts"] = [m for m in u["volumeMounts"] if m["name"] != "host-tracefs"]
uspec["volumes"] = [v for v in uspec["volumes"] if v["name"] != "host-tracefs"]
# The patch moves the entries it merges: order is not meaning.
for d in (undo, base):
    s = d["spec"]["template"]["spec"]
    for k in s["containers"]:
        k["env"].sort(key=lambda e: e["name"])
        k["volumeMounts"].sort(key=lambda m: m["name"])
    s["volumes"].sort(key=lambda v: v["name"])
if undo != base:
    sys.exit("FAIL: the component changes more than CAP_PERFMON, tracefs and its two variables")
print("   ok")
