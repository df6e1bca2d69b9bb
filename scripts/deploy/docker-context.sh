#!/usr/bin/env bash
# The build context the Dockerfile copies (its COPY sources, nothing else) is a workspace cargo
# accepts with the lock file as it is: a manifest that names a file left out would fail here.
# Not --offline: metadata resolves every platform's dependencies, which a Linux build never
# downloads, so a fresh machine has them only after this fetch from crates.io.
#
#   scripts/deploy/docker-context.sh [CONTEXT_DIR]     (default: a temporary directory)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ctx=${1:-}
if [ -z "$ctx" ]; then
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' EXIT
fi
ctx=$(mkdir -p "$ctx" && cd "$ctx" && pwd)
cd "$here/../.."
sed -n 's/^COPY \([^-].*\) [^ ]*$/\1/p' Dockerfile | tr ' ' '\n' | while read -r src; do
  [ -n "$src" ] && cp -r "$src" "$ctx/"
done
(cd "$ctx" && cargo metadata --locked --format-version 1 >/dev/null)
python3 "$here/context_targets.py" "$ctx"
echo "   ok: $(ls "$ctx" | tr '\n' ' ')"
