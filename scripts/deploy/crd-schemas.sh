#!/usr/bin/env bash
# The custom resources of a build against their operators' own CRD schemas, as the npm packages
# @kubernetes-models/prometheus-operator and @kubernetes-models/cert-manager ship them (generated
# from the CRDs; validated with ajv), installed once under target/deploy-check. Needs node and npm.
#
#   scripts/deploy/crd-schemas.sh DIR [CRS_YAML]   e.g. scripts/deploy/crd-schemas.sh deploy/overlays/prometheus-operator
# Without CRS_YAML it builds DIR first (scripts/deploy/kustomize.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:?usage: $0 DIR [CRS_YAML]}
crs=${2:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -z "$crs" ]; then
  "$here/kustomize.sh" "$dir" "$tmp" >/dev/null
  crs=$tmp/$(echo "$dir" | tr / _).crs.yaml
fi
models=$here/../../target/deploy-check
# Both in one install: `npm install --no-save` of one package removes the other.
if [ ! -d "$models/node_modules/@kubernetes-models/prometheus-operator" ] ||
   [ ! -d "$models/node_modules/@kubernetes-models/cert-manager" ]; then
  mkdir -p "$models"
  (cd "$models" && npm install --silent --no-audit --no-fund --no-save \
    @kubernetes-models/prometheus-operator@6.0.0 @kubernetes-models/cert-manager@6.0.0 >/dev/null)
fi
python3 -c 'import sys, yaml, json; json.dump([d for d in yaml.safe_load_all(open(sys.argv[1])) if d], open(sys.argv[2], "w"))' \
  "$crs" "$tmp/crs.json"
cp "$here/validate-crds.mjs" "$models/validate.mjs"
node "$models/validate.mjs" "$tmp/crs.json"
