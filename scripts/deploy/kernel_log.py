#!/usr/bin/env python3
"""The kernel-log component (deploy/components/kernel-log, used by deploy/examples/kernel-log)
adds CAP_SYSLOG and SHMLINK_KMSG=syslog to the base DaemonSet, and nothing else.

    scripts/deploy/kernel_log.py [BASE_CORE_YAML KERNEL_LOG_CORE_YAML]   (default: builds both)
"""
import copy
import sys

from deploycheck import arg, core, daemonset


base = daemonset(core(arg(1), "deploy/base"))
with_log = daemonset(core(arg(2), "deploy/examples/kernel-log"))
(c,) = with_log["spec"]["template"]["spec"]["containers"]
caps = c["securityContext"]["capabilities"]["add"]
if sorted(caps) != sorted(["SYS_PTRACE", "DAC_READ_SEARCH", "PERFMON", "SYSLOG"]):
    sys.exit(f"FAIL: capabilities {caps}")
env = {e["name"]: e.get("value") for e in c["env"]}
if env["SHMLINK_KMSG"] != "syslog":
    sys.exit(f"FAIL: SHMLINK_KMSG {env['SHMLINK_KMSG']}")
# Everything else as in the base.
undo = copy.deepcopy(with_log)
(u,) = undo["spec"]["template"]["spec"]["containers"]
u["securityContext"]["capabilities"]["add"] = [x for x in caps if x != "SYSLOG"]
for e in u["env"]:
    if e["name"] == "SHMLINK_KMSG":
        e["value"] = "off"
# The patch moves the entry it merges to the front of `env`: order is not meaning.
for d in (undo, base):
    for k in d["spec"]["template"]["spec"]["containers"]:
        k["env"].sort(key=lambda e: e["name"])
if undo != base:
    sys.exit("FAIL: the component changes more than CAP_SYSLOG and SHMLINK_KMSG")
print("   ok")
