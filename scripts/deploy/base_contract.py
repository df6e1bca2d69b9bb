#!/usr/bin/env python3
"""The base DaemonSet, RBAC and Service keep their contract: least-privilege ClusterRole, hostPID,
node-critical, the capability set (SYS_PTRACE, DAC_READ_SEARCH, PERFMON for the death trace; no kernel log), read-only host
mounts (every hostPath `Directory`, none of Docker's: deploy/components/docker) but the state
store's (`/var/lib/shmlink`, writable, `DirectoryOrCreate`), port 9477,
probes, a headless Service that selects the agents.

    scripts/deploy/base_contract.py [BASE_CORE_YAML]     (default: builds deploy/base)
"""
from deploycheck import arg, check, core

docs = {(d["kind"], d["metadata"]["name"]): d for d in core(arg(1), "deploy/base")}
assert ("Namespace", "shmlink") in docs, "no Namespace shmlink"
for kind in ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "Service"]:
    check((kind, "shmlink") in docs, f"no {kind} shmlink")
rules = sorted((tuple(r["apiGroups"]), tuple(r["resources"]), tuple(sorted(r["verbs"])))
               for r in docs["ClusterRole", "shmlink"]["rules"])
check(rules == sorted([(("",), ("pods",), ("get", "list", "watch")),
                       (("events.k8s.io",), ("events",), ("create", "patch")),
                       (("",), ("nodes",), ("get",)),
                       (("",), ("nodes/status",), ("patch",))]), f"ClusterRole is not least privilege: {rules}")
ds = docs["DaemonSet", "shmlink"]
check(ds["metadata"]["namespace"] == "shmlink", "DaemonSet namespace")
pod = ds["spec"]["template"]["spec"]
check(pod.get("hostPID") is True, "hostPID")
check(pod.get("priorityClassName") == "system-node-critical", "priorityClassName")
check({"operator": "Exists"} in pod.get("tolerations", []), "tolerations: operator Exists")
check(pod["serviceAccountName"] == "shmlink", "serviceAccountName")
(c,) = pod["containers"]
check(c["args"][:5] == ["serve", "--proc-root", "/host/proc", "--cgroup-root", "/host/sys/fs/cgroup"], f"args {c['args']}")
env = {e["name"]: e for e in c["env"]}
check(env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName", "NODE_NAME")
check(env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all", "NVIDIA_VISIBLE_DEVICES")
check(env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility", "NVIDIA_DRIVER_CAPABILITIES")
sc = c["securityContext"]
check(sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
      and sc["readOnlyRootFilesystem"] is True and sc["runAsUser"] == 0, f"securityContext {sc}")
check(sc["capabilities"]["drop"] == ["ALL"], "drop ALL")
check(sorted(sc["capabilities"].get("add", [])) == ["DAC_READ_SEARCH", "PERFMON", "SYS_PTRACE"], "capabilities beyond or short of the contract")
# The kernel log needs CAP_SYSLOG: off here, on with deploy/components/kernel-log.
check(env["SHMLINK_KMSG"]["value"] == "off", "the base does not read the kernel log")
check(sc["seccompProfile"]["type"] == "RuntimeDefault", "seccomp")
vols = {v["name"]: v for v in pod["volumes"]}
mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
for path, host in [("/host/proc", "/proc"), ("/host/sys/fs/cgroup", "/sys/fs/cgroup"),
                   ("/var/lib/kubelet/pod-resources", "/var/lib/kubelet/pod-resources"),
                   ("/var/log/pods", "/var/log/pods")]:
    check(path in mounts and mounts[path].get("readOnly") is True, f"{path} mounted read-only")
    check(vols[mounts[path]["name"]]["hostPath"]["path"] == host, f"{path} is the host's {host}")
# Docker's directory exists only on cri-dockerd nodes: deploy/components/docker mounts it.
check(not any("docker" in v["hostPath"]["path"] for v in vols.values() if "hostPath" in v),
      "the base mounts Docker's directory, which only Docker nodes have")
check("--docker-root" not in c["args"], "the base names a Docker root it does not mount")
# The state store (--state-dir's default): the one writable mount, the one host path made.
STATE = "/var/lib/shmlink"
check(STATE in mounts and not mounts[STATE].get("readOnly"), f"{STATE} mounted writable")
check(vols[mounts[STATE]["name"]]["hostPath"] == {"path": STATE, "type": "DirectoryOrCreate"},
      f"{STATE} is the host's, made on first use")
check("--state-dir" not in c["args"], "the base's state directory is --state-dir's default")
# No other host path is made on a node that lacks it: the kubelet makes the ones the base mounts.
for v in vols.values():
    check(v["hostPath"].get("type") == "Directory" or v["hostPath"]["path"] == STATE,
          f"hostPath {v['hostPath']} is not type Directory")
check(all(m.get("readOnly") for m in c["volumeMounts"] if m["mountPath"] != STATE),
      "every mount but the state store's read-only")
(port,) = c["ports"]
check(port["containerPort"] == 9477 and port["name"] == "metrics", "port 9477 named metrics")
check(c["livenessProbe"]["httpGet"]["path"] == "/healthz", "liveness /healthz")
check(c["readinessProbe"]["httpGet"]["path"] == "/readyz", "readiness /readyz")
res = c["resources"]
check(res["requests"]["cpu"] and res["requests"]["memory"] and res["limits"]["memory"], "resources")
svc = docs["Service", "shmlink"]
check(svc["spec"]["clusterIP"] == "None", "headless Service")
check(svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items(), "Service selects the agents")
print("   ok")
