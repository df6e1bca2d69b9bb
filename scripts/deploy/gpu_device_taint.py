#!/usr/bin/env python3
"""The gpu-device-taint component (deploy/components/gpu-device-taint) adds
SHMLINK_GPU_DEVICE_TAINT=None (the dry run) and its ClusterRole and binding, exactly the RBAC of
docs/CONTRACT.md "One GPU out", and nothing else; the patch its comment shows for choosing
NoSchedule or NoExecute, applied after it, changes that one value and nothing else.

There is no deploy/examples directory for it: the builds are made from kustomizations written to
a temporary directory (base + component, and + the comment's patch), which scripts/deploy/helm.py
also compares the chart's gpuDeviceTaint values with. With OUT each build's core objects go to
OUT/gpu-device-taint[-<effect>].core.yaml (scripts/test-deploy.sh validates them).

    scripts/deploy/gpu_device_taint.py [BASE_CORE_YAML [OUT]]   (default: builds the base)
"""
import copy
import os
import tempfile
import textwrap

import yaml

from deploycheck import arg, build, check as _check, core, daemonset, is_core

COMPONENT = "deploy/components/gpu-device-taint"
NAME = "shmlink-gpu-device-taint"
ENV = "SHMLINK_GPU_DEVICE_TAINT"
EFFECTS = ("NoSchedule", "NoExecute")
# The contract's RBAC: its own rules (get for a conflict's re-read, no patch, no watch), the
# slices read by UUID (watched). Nodes get, for the owner reference, is the base role's.
RULES = sorted([(("resource.k8s.io",), ("devicetaintrules",), ("create", "delete", "get", "list", "update")),
                (("resource.k8s.io",), ("resourceslices",), ("get", "list", "watch"))])


def check(cond, what):
    _check(cond, f"gpu-device-taint component: {what}")


def comment_patches():
    """The `patches:` block the component's top comment tells an operator to add, parsed."""
    lines = open(os.path.join(COMPONENT, "kustomization.yaml")).read().splitlines()
    start = lines.index("#   patches:")
    block = []
    for line in lines[start:]:
        if not line.startswith("#") or line.strip() == "#":
            break
        block.append(line[1:])
    patches = yaml.safe_load(textwrap.dedent("\n".join(block)))["patches"]
    check(len(patches) == 1, f"the comment's patches: {patches}")
    return patches


def example(root, effect=None):
    """A kustomization under ROOT of the base with the component (and the comment's patch
    choosing EFFECT); returns its directory."""
    here = os.path.join(root, "gpu-device-taint" + (f"-{effect}" if effect else ""))
    os.makedirs(here, exist_ok=True)
    k = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
         # kustomize refuses absolute paths; a relative one may leave the kustomization's root.
         "resources": [os.path.relpath(os.path.abspath("deploy/base"), here)],
         "components": [os.path.relpath(os.path.abspath(COMPONENT), here)]}
    if effect:
        patches = comment_patches()
        text = patches[0]["patch"]
        check(text.count("value: NoExecute") == 1, "the comment's patch does not set NoExecute")
        patches[0]["patch"] = text.replace("value: NoExecute", f"value: {effect}")
        k["patches"] = patches
    with open(os.path.join(here, "kustomization.yaml"), "w") as f:
        yaml.safe_dump(k, f, sort_keys=False)
    return here


def agent_env(docs):
    (c,) = daemonset(docs)["spec"]["template"]["spec"]["containers"]
    return c["env"]


def without_env(ds):
    """The DaemonSet without the component's variable, env sorted (a merge patch moves entries)."""
    ds = copy.deepcopy(ds)
    for c in ds["spec"]["template"]["spec"]["containers"]:
        c["env"] = sorted((e for e in c["env"] if e["name"] != ENV), key=lambda e: e["name"])
    return ds


def rbac(docs, base):
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    role, binding = by[("ClusterRole", NAME)], by[("ClusterRoleBinding", NAME)]
    rules = sorted((tuple(r["apiGroups"]), tuple(r["resources"]), tuple(sorted(r["verbs"]))) for r in role["rules"])
    check(rules == RULES, f"ClusterRole {NAME} is not the contract's least privilege: {rules}")
    check(binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
          f"roleRef {binding['roleRef']}")
    (base_binding,) = [d for d in base if d["kind"] == "ClusterRoleBinding"]
    check(binding["subjects"] == base_binding["subjects"], f"subjects {binding['subjects']}, not the agent's")
    (base_role,) = [d for d in base if d["kind"] == "ClusterRole"]
    check({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]} in base_role["rules"],
          "the base role lost nodes get (the rule's owner reference needs the Node's UID)")


def key(d):
    return d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]


def same_but(docs, base, effect):
    """DOCS is BASE plus the two RBAC objects, the DaemonSet with ENV=EFFECT once more."""
    env = [e for e in agent_env(docs) if e["name"] == ENV]
    check(env == [{"name": ENV, "value": effect}], f"{ENV} {env}, not {effect!r} once")
    check(not [e for e in agent_env(base) if e["name"] == ENV], f"the base sets {ENV}")
    added = sorted(key(d) for d in docs if key(d) not in {key(b) for b in base})
    check(added == [("ClusterRole", "", NAME), ("ClusterRoleBinding", "", NAME)], f"objects added: {added}")
    rest = {key(d): (without_env(d) if d["kind"] == "DaemonSet" else d) for d in docs if key(d) not in set(added)}
    was = {key(d): (without_env(d) if d["kind"] == "DaemonSet" else d) for d in base}
    check(rest == was, f"with {effect} it changes more than {ENV} and its RBAC")


def write(out, name, docs):
    if out:
        with open(os.path.join(out, f"{name}.core.yaml"), "w") as f:
            yaml.safe_dump_all([d for d in docs if is_core(d)], f, sort_keys=False)


def main():
    base = core(arg(1), "deploy/base")
    out = arg(2)
    with tempfile.TemporaryDirectory() as tmp:
        dry = [d for d in build(example(tmp)) if is_core(d)]
        same_but(dry, base, "None")
        rbac(dry, base)
        write(out, "gpu-device-taint", dry)
        print(f"   {ENV}=None, ClusterRole {NAME} (devicetaintrules get/list/create/update/delete,"
              " resourceslices get/list/watch) bound to the agent; nothing else")
        for effect in EFFECTS:
            docs = [d for d in build(example(tmp, effect)) if is_core(d)]
            same_but(docs, base, effect)
            write(out, f"gpu-device-taint-{effect}", docs)
        print(f"   the comment's patch after it: {ENV}={' / '.join(EFFECTS)}, nothing else changed")
    print("   ok")


if __name__ == "__main__":
    main()
