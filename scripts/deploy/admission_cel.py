#!/usr/bin/env python3
"""The admission CEL, evaluated by a real CEL implementation (cel-python, PyPI `cel-python`)
against Pods as they reach admission:
  - the webhook's matchConditions (deploy/components/admission/webhook.yaml): which Pods are
    sent to `shmlink admit` at all; the three webhooks carry the same ones;
  - the ValidatingAdmissionPolicy (deploy/components/admission-policy/policy.yaml): its
    matchConditions, its variables in order, and each failing validation's messageExpression,
    which must be the shared warning text, one per container, exactly.
The Pods: deploy/components/admission-policy/testdata/*.json, and tests/fixtures/admission/*.json
(the server's fixtures) where they exist: every Pod against the shared design's rule written out
in Python (`reference`), and those of testdata/ against testdata/expected.json too. Then the size formula against its definition for
g = 1..64 GPUs. What this cannot check: the namespace selectors (no CEL) and Kubernetes' type
checker (the policy uses no extension library, so plain CEL is what runs).

    scripts/deploy/admission_cel.py [WEBHOOK_BUILD.yaml POLICY_BUILD.yaml]
"""
import glob
import json
import os
import sys
from importlib.metadata import version

import yaml

from deploycheck import arg, build, check, load

try:
    import celpy
except ImportError:
    sys.exit("FAIL: cel-python is not installed (python3 -m pip install cel-python)")

TESTDATA = "deploy/components/admission-policy/testdata"
SERVER_FIXTURES = "tests/fixtures/admission"
# The shared design's warning (docs/admission.md), word for word.
TEMPLATE = ('shmlink: container "{name}" uses GPUs and gets the runtime\'s 64Mi /dev/shm: DataLoader workers die'
            ' with "Bus error", NCCL fails. Fix: mount an emptyDir (medium: Memory, sizeLimit: {size}) at /dev/shm'
            ' and add {size} to its memory limit')
ENV = celpy.Environment()
PROGRAMS = {}


class CelError(Exception):
    pass


def evaluate(expr, activation):
    """One expression's value as plain Python; a CEL error (celpy returns or raises it) raises CelError."""
    if expr not in PROGRAMS:
        PROGRAMS[expr] = ENV.program(ENV.compile(expr))
    try:
        value = PROGRAMS[expr].evaluate(activation)
    except celpy.CELEvalError as e:
        raise CelError(f"{expr[:80]}...: {e}") from e
    if isinstance(value, celpy.CELEvalError):
        raise CelError(f"{expr[:80]}...: {value}")
    return plain(value)


def plain(v):
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (bool, celpy.celtypes.BoolType)):  # BoolType is an int subclass
        return bool(v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, str):
        return str(v)
    return v


def sent(webhook, pod):
    obj = {"object": celpy.json_to_cel(pod)}
    return all(evaluate(c["expression"], obj) for c in webhook["matchConditions"])


def policy_warnings(policy, pod):
    """The warnings the policy gives for POD in order; None when its matchConditions skip it."""
    spec = policy["spec"]
    obj = celpy.json_to_cel(pod)
    if not all(evaluate(c["expression"], {"object": obj}) for c in spec["matchConditions"]):
        return None
    variables = {}
    for v in spec["variables"]:
        value = evaluate(v["expression"], {"object": obj, "variables": celpy.json_to_cel(variables)})
        variables[v["name"]] = value
    activation = {"object": obj, "variables": celpy.json_to_cel(variables)}
    return [evaluate(v["messageExpression"], activation)
            for v in spec["validations"] if not evaluate(v["expression"], activation)]


def pod_of(path):
    doc = json.load(open(path))
    if doc.get("kind") == "AdmissionReview":
        req = doc.get("request") or {}
        if (req.get("kind") or {}).get("kind") != "Pod" or not isinstance(req.get("object"), dict):
            return None
        return req["object"]
    return doc if doc.get("kind") == "Pod" else None


def size_of(g):
    mib = -(-max(1 << 30, 9_637_888 * g * (g - 1)) // (1 << 20))
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def quantity_bytes(text):
    """A Kubernetes quantity in whole bytes, rounded up, as the API server (and the webhook)
    read one; None when it is not one. The reference the policy's regular expressions meet."""
    if not text or len(text) > 40:
        return None
    body = text[1:] if text.startswith("+") else text
    split = next((i for i, ch in enumerate(body) if not (ch.isdigit() or ch == ".")), len(body))
    number, suffix = body[:split], body[split:]
    if number.count(".") > 1 or number.strip(".") == "" or not number.replace(".", "").isascii():
        return None
    binary, exp10 = 0, 0
    if suffix in BINARY:
        binary = BINARY[suffix]
    elif suffix in DECIMAL:
        exp10 = DECIMAL[suffix]
    elif suffix[:1] in ("e", "E"):
        digits = suffix[1:].lstrip("+-")
        if not digits.isdigit() or len(digits) > 3 or not digits.isascii():
            return None
        exp10 = -int(digits) if suffix[1:].startswith("-") else int(digits)
    elif suffix:
        return None
    whole, _, frac = number.partition(".")
    mantissa = int(whole + frac) << binary
    exp10 -= len(frac)
    return mantissa * 10**exp10 if exp10 >= 0 else -(-mantissa // 10**-exp10)


def size_bytes(text):
    """The annotation as the webhook takes it (pod::read_size): a quantity of at least 1Mi, not
    with a fraction-of-a-byte suffix (512m is 0.512 bytes, not 512 MiB); else None."""
    n = quantity_bytes(text)
    if n is None or text[-1:] in ("n", "u", "m") or n < 1 << 20:
        return None
    return n


# The annotation's text: the size shown when the webhook takes it; no warning at all when it is
# at most 64Mi in the forms the policy reads (whole Mi, Ki, bytes, k, M).
ANNOTATIONS = ["24Gi", "1.5Gi", "+2Gi", ".5Gi", "512Mi", "2G", "2e9", "3Ti", "100000000", "65Mi",
               "64Mi", "64M", "67M", "68M", "65536Ki", "65537Ki", "67108864", "67108865", "1k", "67108k", "67109k",
               "lots", "8gb", "8g", "1 Gi", "-1Gi", "0", "0Gi", "0.0", "", "1Gix", "1e", "1e1234", "Gi", "1..5Gi",
               "1" * 41, "500m", "512m", "3u", "9n", "4096", "1048575", "1048576", "1023Ki", "1024Ki", "1048k",
               "1049k", "1M", "2M", "1Mi"]
# Small, yet warned about: forms the policy's expressions do not read (documented in policy.yaml).
SMALL_BUT_WARNED = {"0.05Gi"}
# Below 1Mi in forms the policy's expressions do not read (an exponent, a decimal point): the
# webhook warns with its own size, the policy with the annotation's text.
TINY_SHOWN_AS_WRITTEN = {"1E3", "0.5Mi"}


def reference(pod):
    """The shared design's rule written out in Python: what the CEL must give for POD."""
    spec, meta = pod["spec"], pod.get("metadata", {})
    notes = meta.get("annotations") or {}
    containers = (spec.get("initContainers") or []) + spec["containers"]

    def gpus(c):
        res = c.get("resources") or {}
        return max([int(str(q)) for which in ("limits", "requests") for k, q in (res.get(which) or {}).items()
                    if k.endswith("/gpu")] or [0])

    gpu = [c for c in containers if gpus(c) > 0]
    opted_out = notes.get("shmlink.io/admission") == "off"
    claims = bool(spec.get("resourceClaims"))
    sent = not opted_out and (bool(gpu) or claims or "shmlink.io/shm-size" in notes)
    if opted_out or spec.get("hostIPC"):
        return {"sent": sent, "warnings": None}
    text = notes.get("shmlink.io/shm-size", "")
    n = size_bytes(text)
    if n and n <= 64 << 20 and text not in SMALL_BUT_WARNED:
        return {"sent": sent, "warnings": []}
    g = max([gpus(c) for c in gpu] or [0])
    size = text if n else size_of(g)
    bare = [c["name"] for c in gpu
            if not any(m["mountPath"] in ("/dev/shm", "/dev/shm/", "/dev", "/dev/") for m in c.get("volumeMounts") or [])]
    return {"sent": sent, "warnings": [TEMPLATE.format(name=b, size=size) for b in bare]}


def annotations(policy, base):
    checked = 0
    for text in ANNOTATIONS + sorted((SMALL_BUT_WARNED | TINY_SHOWN_AS_WRITTEN) - set(ANNOTATIONS)):
        pod = json.loads(json.dumps(base))
        pod["metadata"]["annotations"] = {"shmlink.io/shm-size": text}
        got = policy_warnings(policy, pod)
        n = size_bytes(text)
        shown = text if n or text in TINY_SHOWN_AS_WRITTEN else "1Gi"
        if n and n <= 64 << 20 and text not in SMALL_BUT_WARNED:
            check(got == [], f"annotation {text!r} ({n} bytes): {got}")
        else:
            check(got == [TEMPLATE.format(name="trainer", size=shown)], f"annotation {text!r}: {got}")
        checked += 1
    return checked


def main():
    docs = load(arg(1)) if arg(1) else build("deploy/overlays/admission")
    docs += load(arg(2)) if arg(2) else build("deploy/overlays/admission-policy")
    mwc = next(d for d in docs if d["kind"] == "MutatingWebhookConfiguration")
    policy = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    hooks = mwc["webhooks"]
    check(all(h["matchConditions"] == hooks[0]["matchConditions"] for h in hooks), "the webhooks' matchConditions differ")
    expected = json.load(open(f"{TESTDATA}/expected.json"))
    check(expected["template"] == TEMPLATE, f"expected.json's template is not the shared warning:\n{expected['template']}")
    cases = {os.path.basename(p)[:-5]: p for p in sorted(glob.glob(f"{TESTDATA}/*.json"))}
    check(set(expected["pods"]) <= set(cases), f"expectations without a Pod: {set(expected['pods']) - set(cases)}")
    server = {}
    for p in sorted(glob.glob(f"{SERVER_FIXTURES}/*.json")):
        server["server:" + os.path.basename(p)[:-5]] = p
    asserted = unasserted = 0
    for name, path in {**cases, **server}.items():
        pod = pod_of(path)
        if pod is None:
            continue
        if not isinstance(pod.get("spec", {}).get("containers"), list):
            # Unreadable (the server's `malformed`): the CEL fails, and failurePolicy Ignore admits it.
            try:
                sent(hooks[0], pod)
                policy_warnings(policy, pod)
                sys.exit(f"FAIL: {name}: an unreadable Pod evaluated without a CEL error")
            except CelError:
                print(f"   {name}: unreadable, a CEL error (admitted: failurePolicy Ignore)")
                continue
        try:
            got = {"sent": sent(hooks[0], pod), "warnings": policy_warnings(policy, pod)}
        except CelError as e:
            sys.exit(f"FAIL: {name}: CEL error: {e}")
        check(got == reference(pod), f"{name}: the CEL and the rule in Python differ:\n  CEL  {got}\n  rule {reference(pod)}")
        want = expected["pods"].get(name) if name in cases else None
        if want is None:
            check(name not in cases, f"{name}: no expectation in expected.json")
            print(f"   {name}: sent={got['sent']}, {len(got['warnings'] or [])} warning(s), as the rule in Python says")
            unasserted += 1
            continue
        want = {k: v for k, v in want.items() if k != "note"}
        if want["warnings"] is not None:
            want = {**want, "warnings": [TEMPLATE.format(name=n, size=s) for n, s in want["warnings"]]}
        check(got == want, f"{name}:\n  got  {got}\n  want {want}")
        asserted += 1
        for w in got["warnings"] or []:
            print(f"   {name}: {w[:60]}... sizeLimit: {w.split('sizeLimit: ')[1].split(')')[0]}")
    check(asserted >= len(expected["pods"]), f"only {asserted} Pods asserted")
    # The size: the CEL's arithmetic against its definition, one container of g GPUs each.
    base = json.loads(json.dumps(pod_of(cases["pytorch-8gpu"])))
    for g in list(range(1, 65)):
        for key in ("limits", "requests"):
            base["spec"]["containers"][0]["resources"][key]["nvidia.com/gpu"] = str(g)
        got = policy_warnings(policy, base)
        check(got == [TEMPLATE.format(name="trainer", size=size_of(g))], f"g={g}: {got}")
    n = annotations(policy, pod_of(cases["pytorch-8gpu"]))
    # Ten bare GPU containers: eight warnings, then how many more.
    many = json.loads(json.dumps(pod_of(cases["pytorch-8gpu"])))
    many["spec"]["containers"] = [{**many["spec"]["containers"][0], "name": f"w{i}"} for i in range(10)]
    got = policy_warnings(policy, many)
    check(got[:8] == [TEMPLATE.format(name=f"w{i}", size="1Gi") for i in range(8)]
          and got[8:] == ["shmlink: 2 more containers use GPUs and get the runtime's 64Mi /dev/shm"], f"ten containers: {got}")
    print(f"   {asserted} Pods asserted (webhook matchConditions and the policy's exact warnings),"
          f" {unasserted} more against the rule in Python; sizes right for 1..64 GPUs, {n} annotations as the webhook reads them, ten containers (cel-python {version('cel-python')})")


main()
