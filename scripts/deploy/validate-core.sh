#!/usr/bin/env bash
# The core objects of a kustomize build, strictly against Kubernetes' own schema
# (kubernetes-validate, pip) for each of $K8S_VERSIONS: the version the agent's client is built
# for (k8s-openapi v1_33) and the newest the validator knows.
#
#   scripts/deploy/validate-core.sh DIR [CORE_YAML]   e.g. scripts/deploy/validate-core.sh deploy/base
# Without CORE_YAML it builds DIR first (scripts/deploy/kustomize.sh).
set -euo pipefail
K8S_VERSIONS=${K8S_VERSIONS:-1.33.0 1.37.0}
dir=${1:?usage: $0 DIR [CORE_YAML]}
core=${2:-}
if [ -z "$core" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$(dirname "$0")/kustomize.sh" "$dir" "$tmp" >/dev/null
  core=$tmp/$(echo "$dir" | tr / _).core.yaml
fi
for version in $K8S_VERSIONS; do
  echo "== kubernetes-validate -k $version --strict ($dir, core objects)"
  # It only warns, and exits 0, for a kind its schema lacks: that is a failure here.
  said=$(kubernetes-validate -k "$version" --strict --quiet "$core" 2>&1) || { echo "$said"; exit 1; }
  if grep -q "Couldn't find schema" <<<"$said"; then
    echo "$said"
    echo "FAIL: $dir: a kind Kubernetes $version's schema does not have, so not validated" >&2
    exit 1
  fi
  [ -z "$said" ] || echo "$said"
  echo "   ok"
done
