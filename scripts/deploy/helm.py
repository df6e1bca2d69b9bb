#!/usr/bin/env python3
"""The Helm chart (charts/shmlink) with the real Helm engine: helm-python-sdk (pip) binds Helm v4's
Go SDK (libhelm_c.so), so this renders and lints as `helm template` and `helm lint` do, with no
helm binary. It checks that:
  - its copies of the rules and dashboards equal their sources (scripts/deploy/helm_files.py);
  - `helm lint --strict` passes for the defaults and for everything on, for each $K8S_VERSIONS;
  - the defaults render the objects of `kubectl kustomize deploy/base`, object for object (the
    Namespace too; never for default or kube-*, nor with namespace.create=false); each component
    value renders what its kustomize example or overlay builds;
  - values against values.schema.json are refused, each naming the offending key;
  - a release of another name and namespace names its objects by the release, everywhere;
  - runbookBaseUrl re-bases every alert's runbook_url.
With OUT it writes each render as OUT/helm_<case>.{core,crs}.yaml (scripts/test-deploy.sh then
validates them against Kubernetes' and the Prometheus Operator's schemas) and reads the kustomize
builds scripts/deploy/kustomize.sh wrote there; without, it builds them.

    scripts/deploy/helm.py [OUT]
"""
import copy
import difflib
import os
import subprocess
import sys
import tempfile

import yaml

from deploycheck import arg, build, check, daemonset, is_cert_manager, is_core, is_custom_resource, load
from gpu_device_taint import EFFECTS as DEVICE_TAINT_EFFECTS, example as device_taint_example

try:
    import helm_python as helm
except ImportError:
    sys.exit("FAIL: helm-python-sdk is not installed (python3 -m pip install helm-python-sdk)")

CHART = "charts/shmlink"
OUT = arg(1)
NS = {"namespace": {"create": True}}
PO = {"prometheusOperator": {"enabled": True}}
# (case, values, the kustomize directory that builds the same objects)
TWINS = [
    ("kernel-log", {**NS, "kernelLog": {"enabled": True}}, "deploy/examples/kernel-log"),
    ("docker", {**NS, "docker": {"enabled": True}}, "deploy/examples/docker"),
    ("gpu-fault-taint", {**NS, "gpuFaultTaint": {"enabled": True}}, "deploy/examples/gpu-fault-taint"),
    ("prometheus-operator", {**NS, **PO}, "deploy/overlays/prometheus-operator"),
    ("grafana-dashboard", {**NS, **PO, "grafanaDashboards": {"enabled": True}}, "deploy/overlays/grafana-dashboard"),
    ("kube-rbac-proxy", {**NS, **PO, "kubeRbacProxy": {"enabled": True}}, "deploy/overlays/kube-rbac-proxy"),
    ("admission", {**NS, "admission": {"enabled": True}}, "deploy/overlays/admission"),
    ("admission-dra", {**NS, "admission": {"enabled": True, "dra": {"enabled": True}}}, "deploy/overlays/admission-dra"),
    ("admission-policy", {**NS, "admissionPolicy": {"enabled": True}}, "deploy/overlays/admission-policy"),
    ("admission-prometheus-operator", {**NS, **PO, "admission": {"enabled": True}}, "deploy/overlays/admission-prometheus-operator"),
]
# gpuDeviceTaint's twins are kustomizations gpu_device_taint.py writes (base + component, and + the
# patch its comment shows for each other effect): no deploy/examples directory holds them.
DEVICE_TAINT = [(effect, {**NS, "gpuDeviceTaint": {"enabled": True, **({"effect": effect} if effect else {})}})
                for effect in (None, *DEVICE_TAINT_EFFECTS)]
COMPONENTS = ["kernelLog", "docker", "gpuFaultTaint", "gpuDeviceTaint", "prometheusOperator",
              "grafanaDashboards", "kubeRbacProxy", "admission", "admissionPolicy"]
EVERYTHING = {
    **{c: {"enabled": True} for c in COMPONENTS},
    "image": {"repository": "registry.example/gpu/shmlink", "digest": "sha256:" + "ab" * 32},
    "imagePullSecrets": [{"name": "registry"}],
    "nvml": {"hostLibDir": "/usr/lib/x86_64-linux-gnu"},
    "extraArgs": ["--interval", "10s"],
    "extraEnv": [{"name": "SHMLINK_LOG", "value": "debug"}],
    "commonLabels": {"team": "ml-infra"},
    "podAnnotations": {"example.com/scrape": "false"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "nodeSelector": {"nvidia.com/gpu.present": "true"},
    "priorityClassName": "gpu-agents",
    "hostPaths": {"podResources": "/var/lib/k0s/kubelet/pod-resources", "podLogs": "/var/log/pods"},
    "stateDir": "/data/shmlink",
    "prometheusOperator": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "runbookBaseUrl": "https://wiki.example.com/runbooks/shmlink/",
    "grafanaDashboards": {"enabled": True, "namespace": "grafana"},
}
# Each refused, the message naming where.
INVALID = [
    ({"kernelLog": {"enabled": "yes"}}, "/kernelLog/enabled"),
    ({"deathTrace": {"mode": "sometimes"}}, "/deathTrace/mode"),
    ({"deathTrace": {"enabled": True}}, "/deathTrace"),
    ({"unknownComponent": {"enabled": True}}, "unknownComponent"),
    ({"image": {"repository": "shmlink", "pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"tolerations": [{"operator": "Exists", "effect": "NoSchedul"}]}, "/tolerations/0/effect"),
    ({"logFormat": "xml"}, "/logFormat"),
    ({"stateDir": "var/lib/shmlink"}, "/stateDir"),
    ({"port": 70000}, "/port"),
    ({"docker": {"enabled": True, "root": "var/lib/docker"}}, "/docker/root"),
    ({"networkPolicy": {"scraper": {"podLabels": {"app": 9090}}}}, "/networkPolicy/scraper/podLabels/app"),
    ({"commonLabels": {"not a label key": "x"}}, "not a label key"),
    ({"prometheusOperator": {"interval": "15 seconds"}}, "/prometheusOperator/interval"),
    ({"resources": {"limits": {"memory": "lots"}}}, "/resources/limits/memory"),
    ({"runbookBaseUrl": "docs/runbooks"}, "/runbookBaseUrl"),
    ({"admission": {"mode": "off"}}, "/admission/mode"),
    ({"admission": {"enabled": True, "certManager": {"enabled": False}, "caBundle": "QUJD"}}, "/admission/tls/secretName"),
    ({"admission": {"enabled": True, "certManager": {"enabled": False}, "tls": {"secretName": "tls"}}}, "/admission/caBundle"),
    ({"admission": {"replicas": 0}}, "/admission/replicas"),
    ({"admission": {"networkPolicy": {"apiServer": []}}}, "/admission/networkPolicy/apiServer"),
    ({"admission": {"networkPolicy": {"apiServer": ["10.0.0.10"]}}}, "/admission/networkPolicy/apiServer/0"),
    ({"gpuDeviceTaint": {"enabled": True, "effect": "NoSchedul"}}, "/gpuDeviceTaint/effect"),
    ({"gpuDeviceTaint": {"effect": "off"}}, "/gpuDeviceTaint/effect"),
]
# Lists the API server merges by `name`: kustomize's patches move the entries they merge, so
# their order is not compared. An empty list is what the API server keeps as absent.
KEYED = {"env", "volumeMounts", "volumes", "containers", "ports"}


def render(chart, values, release="shmlink", namespace="shmlink"):
    """The objects of one render, as `helm template` gives them."""
    manifests = chart.render(values, name=release, namespace=namespace)
    docs = []
    for path, text in sorted(manifests.items()):
        if not path.endswith("NOTES.txt"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs, manifests.get(f"{chart.name}/templates/NOTES.txt", "")


def normal(x, key=None):
    if isinstance(x, dict):
        return {k: normal(v, k) for k, v in x.items() if v is not None and v != []}
    if isinstance(x, list):
        items = [normal(i) for i in x]
        if key in KEYED and all(isinstance(i, dict) and "name" in i for i in items):
            items.sort(key=lambda i: i["name"])
        return items
    return x


# The labels of every object of the chart. Kustomize gives deploy/base's labels only to the base's
# own objects, so a component's ClusterRoles and bindings come unlabelled: the one difference
# the comparison forgives, and only where kustomize's object has no labels at all.
LABELS = {"app.kubernetes.io/name": "shmlink", "app.kubernetes.io/part-of": "shmlink"}


def unlabelled_in_kustomize(chart_doc, built_doc):
    if "labels" in built_doc["metadata"] or chart_doc["metadata"].get("labels") != LABELS:
        return chart_doc
    chart_doc = copy.deepcopy(chart_doc)
    del chart_doc["metadata"]["labels"]
    return chart_doc


def by_identity(docs):
    out = {}
    for d in docs:
        ident = (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])
        check(ident not in out, f"{ident} twice")
        out[ident] = normal(d)
    return out


def differences(rendered, built):
    """What differs, object by object, as a unified diff; empty when the same."""
    a, b = by_identity(rendered), by_identity(built)
    lines = [f"only in the chart: {k}" for k in sorted(set(a) - set(b))]
    lines += [f"only in kustomize: {k}" for k in sorted(set(b) - set(a))]
    for k in sorted(set(a) & set(b)):
        a[k] = unlabelled_in_kustomize(a[k], b[k])
        if a[k] != b[k]:
            diff = difflib.unified_diff(yaml.safe_dump(b[k]).splitlines(), yaml.safe_dump(a[k]).splitlines(),
                                        f"kustomize {k}", f"chart {k}", lineterm="", n=2)
            lines += list(diff)
    return lines


def kustomized(directory):
    if OUT:
        path = os.path.join(OUT, directory.replace("/", "_") + ".yaml")
        if os.path.exists(path):
            return load(path)
    return build(directory)


def write(case, docs, out=None):
    out = out or OUT
    if not out:
        return
    for suffix, which in (("core", is_core), ("crs", is_custom_resource), ("cert-manager", is_cert_manager)):
        yaml.safe_dump_all([d for d in docs if which(d)], open(os.path.join(out, f"helm_{case}.{suffix}.yaml"), "w"),
                           sort_keys=False)


def admission(chart):
    """The webhook without cert-manager (the user's Secret and CA), in mutate mode with three
    replicas: the same design (scripts/deploy/admission.py), the Secret and caBundle given."""
    ca = "TFMwdExTMUNSVWRKVGlCRFJWSlVTVVpKUTBGVVJTMHRMUzB0Q2c9PQ=="
    api_server = ["10.0.0.10/32", "fd00::10/128"]
    values = {"admission": {"enabled": True, "mode": "mutate", "replicas": 3, "certManager": {"enabled": False},
                            "tls": {"secretName": "webhook-tls"}, "caBundle": ca,
                            "networkPolicy": {"apiServer": api_server}}}
    docs, _ = render(chart, values)
    np = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-admission"))
    cidrs = [peer["ipBlock"]["cidr"] for peer in np["spec"]["ingress"][0]["from"]]
    check(cidrs == api_server, f"the API server's addresses given: {cidrs}")
    check(not [d for d in docs if is_cert_manager(d)], "cert-manager objects with certManager.enabled=false")
    with tempfile.TemporaryDirectory() as tmp:
        out = OUT or tmp
        write("admission-own-tls", docs, out)
        subprocess.run([sys.executable, "scripts/deploy/admission.py", os.path.join(out, "helm_admission-own-tls.core.yaml"),
                        "--mode", "mutate", "--replicas", "3", "--ca-bundle", ca], check=True)
    secret = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["volumes"][0]["secret"]
    check(secret == {"secretName": "webhook-tls"}, f"the given Secret: {secret}")
    off, _ = render(chart, {"admission": {"enabled": True, "networkPolicy": {"enabled": False}}})
    check(not [d for d in off if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-admission")],
          "admission.networkPolicy.enabled=false still renders its NetworkPolicy")
    print("   admission without cert-manager: the given Secret and caBundle, --mode mutate, 3 replicas,"
          " the API server's addresses given; without its NetworkPolicy when asked")


def same_as_kustomize(chart, case, values, directory, drop=(), label=None):
    docs, _ = render(chart, values)
    write(case, docs)
    built = [d for d in kustomized(directory) if d["kind"] not in drop]
    diff = differences(docs, built)
    label = label or directory
    check(not diff, f"helm {case} differs from kubectl kustomize {label}:\n" + "\n".join(diff))
    print(f"   {case}: the same {len(docs)} objects as kubectl kustomize {label}"
          + (f" (but its {', '.join(drop)})" if drop else ""))
    return docs


def lint(values, what):
    for version in os.environ.get("K8S_VERSIONS", "1.33.0 1.37.0").split():
        report = helm.lint(CHART, values, strict=True, namespace="shmlink", kube_version=f"v{version}")
        bad = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        check(not bad, f"helm lint --strict ({what}, Kubernetes {version}): {bad}")
    print(f"   helm lint --strict ({what}): ok for Kubernetes {os.environ.get('K8S_VERSIONS', '1.33.0 1.37.0')}")


def refuses(chart):
    for values, where in INVALID:
        try:
            chart.render(values, name="shmlink", namespace="shmlink")
        except helm.HelmValuesError as e:
            check(where in str(e), f"{values} refused, but the message does not name {where}: {e}")
            continue
        sys.exit(f"FAIL: the chart rendered values its schema should refuse: {values}")
    for ns in ("default", "kube-system"):
        kinds = [d["kind"] for d in render(chart, {}, namespace=ns)[0]]
        check("Namespace" not in kinds, f"namespace {ns} rendered (it would be relabelled privileged)")
    kinds = [d["kind"] for d in render(chart, {"namespace": {"create": False}})[0]]
    check("Namespace" not in kinds, "namespace.create=false still renders the Namespace")
    report = helm.lint(CHART, INVALID[0][0], strict=True)
    check(report["errors"], "helm lint passes values the schema refuses")
    print(f"   {len(INVALID)} invalid values refused by values.schema.json, each naming the key; lint too;"
          " no Namespace rendered for default, kube-system or namespace.create=false")


def other_release(chart):
    """A release `agents` in namespace gpu-ops: every name and namespace follows it."""
    docs, _ = render(chart, {**EVERYTHING, "grafanaDashboards": {"enabled": True}}, "agents", "gpu-ops")
    write("other-release", docs)
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    check(("DaemonSet", "agents-shmlink") in names and ("ClusterRole", "agents-shmlink-gpu-fault-taint") in names
          and ("ClusterRoleBinding", "agents-shmlink-gpu-device-taint") in names,
          f"names do not follow the release: {sorted(names)}")
    mwc = next(d for d in docs if d["kind"] == "MutatingWebhookConfiguration")
    cert = next(d for d in docs if d["kind"] == "Certificate")
    binding = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding")
    check(mwc["metadata"]["name"] == "agents-shmlink-admission"
          and all(h["clientConfig"]["service"]["name"] == "agents-shmlink-admission"
                  and h["clientConfig"]["service"]["namespace"] == "gpu-ops" for h in mwc["webhooks"])
          and mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "gpu-ops/agents-shmlink-admission-tls"
          and cert["metadata"]["name"] == "agents-shmlink-admission-tls"
          and "agents-shmlink-admission.gpu-ops.svc" in cert["spec"]["dnsNames"]
          and binding["spec"]["policyName"] == binding["metadata"]["name"] == "agents-shmlink-dev-shm"
          and ("ValidatingAdmissionPolicy", "agents-shmlink-dev-shm") in names, "admission names do not follow the release")
    for d in docs:
        ns = d["metadata"].get("namespace")
        check(ns in (None, "gpu-ops"), f"{d['kind']} {d['metadata']['name']} in namespace {ns}")
        for s in d.get("subjects", []):
            check((s["name"], s["namespace"]) == ("agents-shmlink", "gpu-ops"), f"binding subject {s}")
    sm = next(d for d in docs if d["kind"] == "ServiceMonitor" and d["metadata"]["name"] == "agents-shmlink")
    check(sm["spec"]["namespaceSelector"]["matchNames"] == ["gpu-ops"], "ServiceMonitor namespaceSelector")
    print(f"   release agents in gpu-ops: {len(docs)} objects named by the release, all in gpu-ops")


def everything(chart):
    """Every component and the common settings at once: each shows where it should."""
    docs, notes = render(chart, EVERYTHING)
    write("everything", docs)
    ds = daemonset(docs)
    pod = ds["spec"]["template"]["spec"]
    agent = next(c for c in pod["containers"] if c["name"] == "shmlink")
    check(agent["image"] == "registry.example/gpu/shmlink@sha256:" + "ab" * 32, f"image {agent['image']}")
    check(agent["args"][-8:] == ["--docker-root", "/host/var/lib/docker", "--nvml-lib",
                                 "/host/nvidia/libnvidia-ml.so.1", "--state-dir", "/data/shmlink",
                                 "--interval", "10s"], f"args {agent['args']}")
    caps = agent["securityContext"]["capabilities"]["add"]
    check(caps == ["SYS_PTRACE", "DAC_READ_SEARCH", "PERFMON", "SYSLOG"], f"capabilities {caps}")
    env = {e["name"]: e.get("value") for e in agent["env"]}
    check(env["SHMLINK_KMSG"] == "syslog" and "SHMLINK_DEATH_TRACE" not in env
          and env["SHMLINK_TAINT_ON_GPU_FAULT"] == "true" and env["SHMLINK_GPU_DEVICE_TAINT"] == "None"
          and env["SHMLINK_LISTEN"] == "127.0.0.1:9479"
          and env["SHMLINK_LOG"] == "debug", f"env {env}")
    vols = {v["name"]: v["hostPath"] for v in pod["volumes"]}
    check(vols["nvidia-lib"] == {"path": "/usr/lib/x86_64-linux-gnu", "type": "Directory"}, f"{vols}")
    check(vols["pod-resources"]["path"] == "/var/lib/k0s/kubelet/pod-resources", f"{vols}")
    # Only the state store's directory is made on a node (and is writable).
    check(vols.pop("state") == {"path": "/data/shmlink", "type": "DirectoryOrCreate"}, f"{vols}")
    check({"name": "state", "mountPath": "/data/shmlink"} in agent["volumeMounts"], "the state mount")
    check(all(v["type"] == "Directory" for v in vols.values()), f"a hostPath that may be made: {vols}")
    check(pod["priorityClassName"] == "gpu-agents" and pod["imagePullSecrets"] == [{"name": "registry"}]
          # Helm merges maps with the defaults: linux stays (null removes a default key).
          and pod["nodeSelector"] == {"kubernetes.io/os": "linux", "nvidia.com/gpu.present": "true"}, "pod settings")
    check(ds["spec"]["template"]["metadata"]["annotations"] == {"example.com/scrape": "false"}, "podAnnotations")
    for d in docs:
        check(d["metadata"]["labels"].get("team") == "ml-infra", f"{d['kind']} without commonLabels")
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    check(rule["metadata"]["labels"]["release"] == "kube-prometheus-stack", "prometheusOperator.labels")
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    for r in alerts:
        url = r["annotations"]["runbook_url"]
        check(url == f"https://wiki.example.com/runbooks/shmlink/{r['alert']}.md", f"runbook_url {url}")
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    check(cm["metadata"]["namespace"] == "grafana", "grafanaDashboards.namespace")
    check("--docker-root /host/var/lib/docker" in notes, "NOTES.txt's check command lacks --docker-root")
    print(f"   everything on: {len(docs)} objects, {len(alerts)} runbook_urls re-based, settings where they belong")


def no_state(chart):
    """stateDir none: `--state-dir none`, and no hostPath made or mounted."""
    docs, _ = render(chart, {"stateDir": "none"})
    pod = daemonset(docs)["spec"]["template"]["spec"]
    agent = next(c for c in pod["containers"] if c["name"] == "shmlink")
    check(agent["args"][-2:] == ["--state-dir", "none"], f"args {agent['args']}")
    check("state" not in {v["name"] for v in pod["volumes"]}, "a state volume with stateDir none")
    check(all(m.get("readOnly") for m in agent["volumeMounts"]), "a writable mount with stateDir none")
    print("   stateDir none: no state volume, every mount read-only")


def main():
    subprocess.run([sys.executable, "scripts/deploy/helm_files.py", "--check"], check=True)
    print(f"   Helm {helm.helm_sdk_version()} (helm-python-sdk {helm.__version__}, {os.path.basename(helm.library_path)})")
    lint(None, "defaults")
    lint(EVERYTHING, "everything on")
    with helm.Chart.load(CHART) as chart:
        check(chart.metadata["apiVersion"] == "v2", "Chart.yaml apiVersion v2")
        check(set(COMPONENTS) <= set(chart.values), f"a component without its value: {COMPONENTS}")
        docs = same_as_kustomize(chart, "defaults", None, "deploy/base")
        # The comparison can fail: the defaults are not the kernel-log example.
        check(differences(docs, [d for d in kustomized("deploy/examples/kernel-log") if d["kind"] != "Namespace"]),
              "the defaults compare equal to the kernel-log example: the comparison sees nothing")
        for case, values, directory in TWINS:
            same_as_kustomize(chart, case, values, directory)
        with tempfile.TemporaryDirectory() as tmp:
            for effect, values in DEVICE_TAINT:
                case = "gpu-device-taint" + (f"-{effect}" if effect else "")
                how = " and its comment's patch to " + effect if effect else ""
                same_as_kustomize(chart, case, values, device_taint_example(tmp, effect),
                                  label=f"of deploy/base with deploy/components/gpu-device-taint{how}")
        refuses(chart)
        other_release(chart)
        everything(chart)
        admission(chart)
        no_state(chart)
    print("   ok")


main()
