"""What the deploy checks share: the failure message, and the kustomize builds they read.

Every check runs alone from anywhere (`scripts/deploy/<check>`; as root scripts/test-deploy.sh
installs the tools). A check given a file reads it (scripts/test-deploy.sh builds every directory once and passes
the files); run alone without one, it builds the directory itself with `kubectl kustomize`.
"""
import os
import subprocess
import sys

import yaml

# Every check reads the repository's files by their paths from its root; the files a caller
# names are taken from where it stands.
sys.argv[1:] = [os.path.abspath(a) for a in sys.argv[1:]]
os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

CR_GROUP = "monitoring.coreos.com/"
# cert-manager's kinds (the admission component's serving certificate): checked against
# cert-manager's CRD schemas, never Kubernetes' own.
CERT_MANAGER_GROUP = "cert-manager.io/"

# The runbooks' base URL the plain rules link (`<base>/<alert>.md`), and the placeholder for it in
# the overlay's generated prometheusrule.yaml, which kustomize replaces with the value of
# RUNBOOK_BASE_FILE (deploy/overlays/prometheus-operator/kustomization.yaml, `replacements`).
RUNBOOK_BASE = "https://github.com/shmlink/shmlink/blob/main/docs/runbooks"
RUNBOOK_PLACEHOLDER = "RUNBOOK_BASE_URL"
RUNBOOK_BASE_FILE = "deploy/overlays/prometheus-operator/runbook-base-url.yaml"


def runbook_base_value():
    """The base URL an operator set for the Prometheus Operator overlay."""
    return yaml.safe_load(open(RUNBOOK_BASE_FILE))["data"]["url"]


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


def load(path):
    return [d for d in yaml.safe_load_all(open(path)) if d]


def is_custom_resource(doc):
    """The Prometheus Operator's kinds, which Kubernetes' own schema does not know."""
    return doc["apiVersion"].startswith(CR_GROUP)


def is_cert_manager(doc):
    return doc["apiVersion"].startswith(CERT_MANAGER_GROUP)


def is_core(doc):
    """What Kubernetes' own schema knows."""
    return not is_custom_resource(doc) and not is_cert_manager(doc)


def build(directory):
    out = subprocess.run(["kubectl", "kustomize", directory], check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def core(path_or_none, directory):
    """The core objects: from the file scripts/test-deploy.sh wrote, else built here."""
    if path_or_none:
        return load(path_or_none)
    return [d for d in build(directory) if is_core(d)]


def custom_resources(path_or_none, directory):
    if path_or_none:
        return load(path_or_none)
    return [d for d in build(directory) if is_custom_resource(d)]


def daemonset(docs):
    """The agent's DaemonSet among a build's objects."""
    return next(d for d in docs if d["kind"] == "DaemonSet")


def arg(n):
    return sys.argv[n] if len(sys.argv) > n else None
