#!/usr/bin/env python3
"""The docker component (deploy/components/docker, used by deploy/examples/docker) adds
`--docker-root /host/var/lib/docker` and the host's /var/lib/docker/containers read-only, as a
`Directory` hostPath (a node without Docker refuses the Pod; nothing is made there), and nothing
else.

    scripts/deploy/docker_component.py [BASE_CORE_YAML DOCKER_CORE_YAML]   (default: builds both)
"""
import copy

from deploycheck import arg, core, daemonset
from deploycheck import check as _check


def check(cond, what):
    _check(cond, f"docker component: {what}")


base = daemonset(core(arg(1), "deploy/base"))
docker = daemonset(core(arg(2), "deploy/examples/docker"))
spec = docker["spec"]["template"]["spec"]
(c,) = spec["containers"]
check(c["args"][-2:] == ["--docker-root", "/host/var/lib/docker"], f"args {c['args']}")
mount = next(m for m in c["volumeMounts"] if m["name"] == "docker-containers")
check(mount == {"name": "docker-containers", "mountPath": "/host/var/lib/docker/containers", "readOnly": True}, f"mount {mount}")
volume = next(v for v in spec["volumes"] if v["name"] == "docker-containers")
check(volume["hostPath"] == {"path": "/var/lib/docker/containers", "type": "Directory"}, f"volume {volume}")
# Everything else as in the base.
undo = copy.deepcopy(docker)
uspec = undo["spec"]["template"]["spec"]
(u,) = uspec["containers"]
u["args"] = u["args"][:-2]
u["volumeMounts"] = [m for m in u["volumeMounts"] if m["name"] != "docker-containers"]
uspec["volumes"] = [v for v in uspec["volumes"] if v["name"] != "docker-containers"]
for d in (undo, base):
    s = d["spec"]["template"]["spec"]
    s["volumes"].sort(key=lambda v: v["name"])
check(undo == base, "it changes more than --docker-root and Docker's directory")
print("   ok")
