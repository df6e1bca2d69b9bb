#!/usr/bin/env python3
"""The DRA fixtures the agent's tests load (tests/fixtures/dra: the 8-GPU ResourceSlice through
resource.k8s.io/v1 and v1beta2, the same node with MIG on GPU 7, shmlink's DeviceTaintRule for
GPU 7) validate strictly against
Kubernetes 1.37's own schema (kubernetes-validate's Python API), and the rule selects a device
of the slice by the contract's names.

Only 1.37: DeviceTaintRule is served as resource.k8s.io/v1 from 1.37 on, and the 1.33 schema
(the other of $K8S_VERSIONS) has no resource.k8s.io/v1 at all. The command line
`kubernetes-validate` only warns, and exits 0, for a kind its schema lacks; here a missing
schema is a failure, and the check proves it is caught (the v1 rule against 1.36's schema), as
it proves strict validation refuses a field the schema does not have.

    scripts/deploy/dra_fixtures.py
"""
import copy
import glob
import json

from deploycheck import check

try:
    import kubernetes_validate
    from kubernetes_validate.utils import SchemaNotFoundError, ValidationError
except ImportError:
    raise SystemExit("FAIL: kubernetes-validate is not installed (python3 -m pip install kubernetes-validate)")

VERSION = "1.37.0"
FIXTURES = "tests/fixtures/dra"
RULE = f"{FIXTURES}/devicetaintrule-gpu7-v1.json"
SLICES = [f"{FIXTURES}/resourceslice-8gpu-v1.json", f"{FIXTURES}/resourceslice-8gpu-v1beta2.json"]
MIG = f"{FIXTURES}/resourceslice-8gpu-mig-v1.json"


def validate(doc, version, what):
    """Strict validation; a kind without a schema in VERSION is a failure, never a pass."""
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except SchemaNotFoundError as e:
        raise SystemExit(f"FAIL: {what}: no schema for it in Kubernetes {version}: {e}")
    except ValidationError as e:
        raise SystemExit(f"FAIL: {what} against Kubernetes {version}: {e.message} at {list(e.path)}")


def refused(doc, version):
    """How VERSION's schema refuses DOC (strict), or None when it accepts it."""
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except SchemaNotFoundError:
        return "no schema"
    except ValidationError:
        return "invalid"
    return None


def main():
    found = sorted(glob.glob(f"{FIXTURES}/*.json"))
    check(found == sorted([RULE, MIG] + SLICES), f"{FIXTURES} holds {found}: add a new fixture here")
    rule = json.load(open(RULE))
    slices = [json.load(open(p)) for p in SLICES]
    mig = json.load(open(MIG))
    for path, doc in [(RULE, rule), (MIG, mig)] + list(zip(SLICES, slices)):
        validate(doc, VERSION, path)
        print(f"   {path}: {doc['kind']} {doc['apiVersion']} valid (strict) for Kubernetes {VERSION}")

    # The check can fail: a missing schema, and a field the schema lacks, are refused.
    check(refused(rule, "1.36.0") == "no schema", "the v1 DeviceTaintRule passed 1.36, which has no schema for it")
    bad = copy.deepcopy(rule)
    bad["spec"]["taint"]["reason"] = "nvlink-down"
    check(refused(bad, VERSION) == "invalid", "strict validation took an unknown field spec.taint.reason")
    print("   a kind without a schema (v1 DeviceTaintRule on 1.36) and an unknown field are refused")

    # The two slices are one stored object read through two versions.
    a, b = (copy.deepcopy(s) for s in slices)
    check(a.pop("apiVersion") == "resource.k8s.io/v1" and b.pop("apiVersion") == "resource.k8s.io/v1beta2"
          and a == b, "the v1 and v1beta2 slices differ beyond apiVersion")
    # The rule by the contract's names, selecting a device the slice lists.
    meta, spec = rule["metadata"], rule["spec"]
    node = meta["labels"]["shmlink.io/node"]
    check(meta["labels"]["app.kubernetes.io/managed-by"] == "shmlink", "label managed-by")
    check(meta["name"].startswith(f"shmlink-{node}-gpu-"), f"rule name {meta['name']}")
    check("shmlink.io/description" in meta["annotations"], "no shmlink.io/description annotation")
    (owner,) = meta["ownerReferences"]
    check(owner["apiVersion"] == "v1" and owner["kind"] == "Node" and owner["name"] == node
          and "controller" not in owner and "blockOwnerDeletion" not in owner, f"owner {owner}")
    check(spec["taint"]["key"] == "shmlink.io/gpu-unhealthy"
          and spec["taint"]["effect"] in ("None", "NoSchedule", "NoExecute"), f"taint {spec['taint']}")
    sel, s = spec["deviceSelector"], slices[0]["spec"]
    check(set(sel) == {"driver", "pool", "device"}, f"the selector must set driver, pool and device: {sel}")
    check((sel["driver"], sel["pool"]) == (s["driver"], s["pool"]["name"]) and s["nodeName"] == node,
          f"selector {sel} is not the node's slice")
    check(sel["device"] in [d["name"] for d in s["devices"]], f"no device {sel['device']} in the slice")
    print(f"   {meta['name']} selects {sel['driver']}/{sel['pool']}/{sel['device']}, a device of the node's slice")
    # MIG on GPU 7: its MIG devices name it as their parent; the full GPU is not listed.
    parent = next(d for d in s["devices"] if d["name"] == "gpu-7")["attributes"]["uuid"]["string"]
    names = [d["name"] for d in mig["spec"]["devices"]]
    migs = [d for d in mig["spec"]["devices"] if d["attributes"]["type"]["string"] == "mig"]
    check("gpu-7" not in names and len(migs) == 2, f"MIG slice devices {names}")
    check(all(d["attributes"]["parentUUID"]["string"] == parent and d["name"].startswith("gpu-7-mig-")
              for d in migs), "the MIG devices are GPU 7's")
    print("   ok")


main()
