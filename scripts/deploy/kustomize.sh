#!/usr/bin/env bash
# `kubectl kustomize DIR` into OUT/<DIR with / as _>.yaml, split into .core.yaml (Kubernetes'
# own kinds), .crs.yaml (the Prometheus Operator's) and .cert-manager.yaml (cert-manager's);
# prints what each holds. A build that fails is a failure.
#
#   scripts/deploy/kustomize.sh DIR [OUT]      e.g. scripts/deploy/kustomize.sh deploy/base /tmp/b
set -euo pipefail
dir=${1:?usage: $0 DIR [OUT]}
out=${2:-$(mktemp -d)}
here=$(dirname "$0")
name=$(echo "$dir" | tr / _)
kubectl kustomize "$dir" >"$out/$name.yaml"
python3 "$here/split.py" "$out/$name.yaml" "$out/$name"
[ -n "${2:-}" ] || echo "   built into $out/$name.{core,crs}.yaml"
