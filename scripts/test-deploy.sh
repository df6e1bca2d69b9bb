#!/usr/bin/env bash
# Checks what an operator installs, with the real tools:
#   - `kubectl kustomize` builds deploy/base and every overlay;
#   - the core objects validate strictly against Kubernetes' own schema (kubernetes-validate,
#     Kubernetes $K8S_VERSIONS); the Prometheus Operator's custom resources, which that schema
#     does not know, against the Prometheus Operator's CRD schemas (the npm package
#     @kubernetes-models/prometheus-operator), field by field here, and their rules by promtool;
#   - the PrometheusRule carries exactly the groups of deploy/prometheus/shmlink.rules.yml;
#   - the admission webhook's DRA lookup (deploy/components/admission-dra) gets only get on
#     resource claims, templates and classes;
#   - the admission webhook and policy (deploy/components/admission, admission-policy) keep the
#     shared design; their cert-manager objects validate against cert-manager's CRD schemas
#     (@kubernetes-models/cert-manager); their CEL (the webhook's matchConditions, the policy's
#     warnings) is evaluated by cel-python against Pod fixtures, messages asserted exactly;
#   - the DaemonSet keeps its contract (capabilities, mounts, args, probes, RBAC); the
#     NetworkPolicy admits only the scraper on 9477; the grafana-dashboard and kube-rbac-proxy
#     overlays do what they say; the gpu-device-taint component adds its variable and exactly
#     its RBAC, and the patch its comment shows picks the effect (built from temporary
#     kustomizations, validated like the rest);
#   - the DRA fixtures (tests/fixtures/dra) validate strictly against Kubernetes 1.37's schema,
#     the only one with DeviceTaintRule v1; a kind without a schema fails, here and above;
#   - every alert links docs/runbooks/<alert>.md, and that file exists; the overlay's runbook_url
#     base is one value (runbook-base-url.yaml); the runbooks' `shmlink check` commands carry the
#     DaemonSet's roots;
#   - the Alertmanager example: `amtool check-config`, and the real Alertmanager inhibits a
#     culprit GPU's pair alerts (scripts/deploy/alertmanager.sh);
#   - `promtool check rules` and `promtool test rules` on the plain rules;
#   - the Dockerfile parses and every COPY source exists; the dashboards are valid JSON;
#   - the Helm chart charts/shmlink with the real Helm engine (helm-python-sdk: Helm v4's Go SDK
#     as a library, no helm binary): lint, every component value rendered and compared object
#     for object with its kustomize build, the schema's refusals; each render validated as above.
# Each check is a file of its own in scripts/deploy/ that runs alone (its first lines say how);
# this script installs the tools, builds every kustomize directory once and runs them all.
# As root it installs what is missing (apt: prometheus, prometheus-alertmanager, kubectl, nodejs, npm; pip:
# kubernetes-validate, dockerfile-parse, helm-python-sdk, cel-python; npm, under target/:
# @kubernetes-models/prometheus-operator and cert-manager);
# otherwise a missing tool is an error unless SHMLINK_DEPLOY_SKIP_MISSING=1, where it says loudly
# what it skipped.
#
#   scripts/test-deploy.sh               run every check
#   scripts/test-deploy.sh --write-rule  regenerate the overlay's prometheusrule.yaml first
set -euo pipefail
cd "$(dirname "$0")/.."
# The version the agent's client is built for (k8s-openapi v1_33) and the newest the validator knows.
export K8S_VERSIONS=${K8S_VERSIONS:-1.33.0 1.37.0}
checks=scripts/deploy

if [ "${1:-}" = --write-rule ]; then
  python3 $checks/write_rule.py
fi

skipped=()
need() { # need TOOL: true when TOOL is there (installed here as root when missing)
  command -v "$1" >/dev/null && return 0
  [[ " ${skipped[*]-} " == *" $1 "* ]] || skipped+=("$1")
  return 1
}

if [ "$(id -u)" = 0 ]; then
  apt_missing=()
  command -v promtool >/dev/null || apt_missing+=(prometheus)
  command -v prometheus-alertmanager >/dev/null || apt_missing+=(prometheus-alertmanager)
  command -v kubectl >/dev/null || apt_missing+=(kubectl)
  command -v npm >/dev/null || apt_missing+=(nodejs npm)
  if [ ${#apt_missing[@]} -gt 0 ]; then
    echo "== installing ${apt_missing[*]} (apt)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >/dev/null
  fi
  # Debian's prometheus package starts its service on install; these checks need none.
  command -v kubernetes-validate >/dev/null && python3 -c 'import dockerfile_parse, helm_python, celpy' 2>/dev/null ||
    { echo "== installing kubernetes-validate dockerfile-parse helm-python-sdk cel-python (pip)"
      python3 -m pip install -q kubernetes-validate dockerfile-parse helm-python-sdk cel-python; }
fi
python3 -c 'import yaml' # PyYAML: every check below reads YAML

fail() { echo "FAIL: $*" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# --- promtool on the plain rules ------------------------------------------------------------
if need promtool; then
  echo "== promtool check rules / test rules"
  $checks/promtool-rules.sh
fi

# --- Alertmanager ----------------------------------------------------------------------------
if need prometheus-alertmanager && need amtool; then
  echo "== the Alertmanager example: amtool check-config, routes, and the real Alertmanager's inhibition"
  python3 $checks/alertmanager.py
fi

# --- runbooks --------------------------------------------------------------------------------
echo "== every alert has a severity and a runbook_url naming docs/runbooks/<alert>.md, which exists"
python3 $checks/runbooks.py

# --- kustomize builds ------------------------------------------------------------------------
builds=(deploy/base)
for example in deploy/examples/*/; do builds+=("${example%/}"); done
for overlay in deploy/overlays/*/; do builds+=("${overlay%/}"); done
if need kubectl; then
  # Each directory built once, into $out/<dir with / as _>.{core,crs}.yaml, which the checks read.
  for dir in "${builds[@]}"; do
    echo "== kubectl kustomize $dir"
    $checks/kustomize.sh "$dir" "$out"
    name=$(echo "$dir" | tr / _)
    if need kubernetes-validate; then
      $checks/validate-core.sh "$dir" "$out/$name.core.yaml"
    fi
  done

  echo "== the DaemonSet, RBAC and Service keep their contract"
  python3 $checks/base_contract.py "$out/deploy_base.core.yaml"

  echo "== the kernel-log component adds CAP_SYSLOG and SHMLINK_KMSG=syslog, nothing else"
  python3 $checks/kernel_log.py "$out/deploy_base.core.yaml" "$out/deploy_examples_kernel-log.core.yaml"

  echo "== the docker component adds --docker-root and Docker's directory (type Directory), nothing else"
  python3 $checks/docker_component.py "$out/deploy_base.core.yaml" "$out/deploy_examples_docker.core.yaml"

  echo "== the gpu-device-taint component adds SHMLINK_GPU_DEVICE_TAINT=None and exactly its RBAC; its comment's patch sets the effect"
  python3 $checks/gpu_device_taint.py "$out/deploy_base.core.yaml" "$out"
  if need kubernetes-validate; then
    for core in "$out"/gpu-device-taint*.core.yaml; do
      $checks/validate-core.sh "deploy/components/gpu-device-taint ($(basename "$core" .core.yaml))" "$core"
    done
  fi

  echo "== every runbook's \`kubectl exec ... shmlink check\` carries the DaemonSet's path options"
  python3 $checks/runbook_commands.py "$out/deploy_base.core.yaml"

  echo "== runbook_url's base is the one value in the prometheus-operator overlay's runbook-base-url.yaml"
  python3 $checks/runbook_base.py

  echo "== the NetworkPolicy admits only the scraper's selectors, on port 9477"
  python3 $checks/network_policy.py "$out/deploy_base.core.yaml"

  echo "== the grafana-dashboard overlay: dashboards/*.json as a ConfigMap for Grafana's sidecar"
  python3 $checks/grafana_dashboard.py "$out/deploy_overlays_grafana-dashboard.core.yaml"

  echo "== the kube-rbac-proxy overlay: the agent on loopback, TLS and authorization on 9477"
  python3 $checks/kube_rbac_proxy.py "$out/deploy_overlays_kube-rbac-proxy.core.yaml" "$out/deploy_overlays_kube-rbac-proxy.crs.yaml"

  echo "== the admission webhook (deploy/overlays/admission) and policy (deploy/overlays/admission-policy) keep the shared design"
  python3 $checks/admission.py "$out/deploy_overlays_admission.core.yaml" "$out/deploy_overlays_admission.cert-manager.yaml"
  python3 $checks/admission.py --policy "$out/deploy_overlays_admission-policy.core.yaml"
  python3 $checks/admission_dra.py "$out/deploy_overlays_admission-dra.core.yaml" "$out/deploy_overlays_admission.core.yaml"

  if python3 -c 'import celpy' 2>/dev/null; then
    echo "== the admission CEL (webhook matchConditions, the policy's warnings) by cel-python, against Pod fixtures"
    python3 $checks/admission_cel.py "$out/deploy_overlays_admission.core.yaml" "$out/deploy_overlays_admission-policy.core.yaml"
  else
    skipped+=(cel-python)
  fi

  for dir in "${builds[@]}"; do
    name=$(echo "$dir" | tr / _)
    if grep -q kind "$out/$name.cert-manager.yaml" && need node && need npm; then
      echo "== cert-manager objects of $dir against cert-manager's CRD schemas"
      $checks/crd-schemas.sh "$dir" "$out/$name.cert-manager.yaml"
    fi
    [ -s "$out/$name.crs.yaml" ] && grep -q kind "$out/$name.crs.yaml" || continue
    echo "== custom resources of $dir: ServiceMonitor and PrometheusRule"
    python3 $checks/custom_resources.py "$dir" "$out/$name.crs.yaml" "$out/$name.core.yaml" "$out/rule-groups.yml"
    if need node && need npm; then
      echo "== the custom resources against the Prometheus Operator's CRD schemas"
      $checks/crd-schemas.sh "$dir" "$out/$name.crs.yaml"
    fi
    if need promtool; then
      echo "== promtool check rules (the PrometheusRule's groups)"
      promtool check rules "$out/rule-groups.yml"
    fi
  done
fi

# --- DRA fixtures ------------------------------------------------------------------------------
if need kubernetes-validate; then
  echo "== the DRA fixtures (tests/fixtures/dra) strictly against Kubernetes 1.37's schema (DeviceTaintRule v1 is 1.37's)"
  python3 $checks/dra_fixtures.py
fi

# --- the Helm chart ----------------------------------------------------------------------------
if ! python3 -c 'import helm_python' 2>/dev/null; then
  skipped+=(helm-python-sdk)
elif need kubectl; then
  echo "== the Helm chart (Helm's own engine): lint, renders equal to the kustomize builds, schema"
  python3 $checks/helm.py "$out"
  for core in "$out"/helm_*.core.yaml; do
    case=$(basename "$core" .core.yaml)
    if need kubernetes-validate; then
      $checks/validate-core.sh "charts/shmlink ($case)" "$core"
    fi
    crs=$out/$case.crs.yaml
    if grep -q kind "$crs" && need node && need npm; then
      echo "== the chart's custom resources ($case) against the Prometheus Operator's CRD schemas"
      $checks/crd-schemas.sh "charts/shmlink ($case)" "$crs"
    fi
    if grep -q kind "$out/$case.cert-manager.yaml" && need node && need npm; then
      echo "== the chart's cert-manager objects ($case) against cert-manager's CRD schemas"
      $checks/crd-schemas.sh "charts/shmlink ($case)" "$out/$case.cert-manager.yaml"
    fi
  done
fi

# --- Dockerfile ------------------------------------------------------------------------------
echo "== Dockerfile parses; every COPY source exists"
if python3 -c 'import dockerfile_parse' 2>/dev/null; then
  python3 $checks/dockerfile.py
else
  skipped+=(dockerfile-parse)
fi

if need cargo; then
  echo "== the Dockerfile's build context: cargo metadata --locked"
  $checks/docker-context.sh "$out/context"
fi

# --- dashboards ------------------------------------------------------------------------------
echo "== dashboards are Grafana JSON"
python3 $checks/dashboards.py

if [ ${#skipped[@]} -gt 0 ]; then
  msg="SKIPPED: ${skipped[*]} not installed (run as root to install them); the checks that need them did not run"
  if [ "${SHMLINK_DEPLOY_SKIP_MISSING:-}" = 1 ]; then
    printf '%s\n%s\n%s\n' "########################################################################" "$msg" "########################################################################" >&2
  else
    fail "$msg"
  fi
fi
echo "deploy checks passed"
