#!/usr/bin/env python3
"""In a copy of the Dockerfile's build context, every target file the manifests name explicitly
exists: cargo metadata does not look for them, a build does. scripts/deploy/docker-context.sh
runs it.

    scripts/deploy/context_targets.py CONTEXT_DIR
"""
import os
import sys
import tomllib

ctx = sys.argv[1]
root = tomllib.load(open(os.path.join(ctx, "Cargo.toml"), "rb"))
for member in root.get("workspace", {}).get("members", ["."]):
    base = os.path.join(ctx, member)
    manifest = tomllib.load(open(os.path.join(base, "Cargo.toml"), "rb"))
    wanted = []
    if "lib" in manifest:
        wanted.append(manifest["lib"].get("path", "src/lib.rs"))
    for kind, folder in [("bin", "src/bin"), ("bench", "benches"), ("test", "tests"), ("example", "examples")]:
        for t in manifest.get(kind, []):
            wanted.append(t.get("path") or [f"{folder}/{t['name']}.rs", f"{folder}/{t['name']}/main.rs"])
    build = manifest.get("package", {}).get("build")
    if isinstance(build, str):
        wanted.append(build)
    for w in wanted:
        options = w if isinstance(w, list) else [w]
        if not any(os.path.exists(os.path.join(base, o)) for o in options):
            sys.exit(f"FAIL: Dockerfile: the build context lacks {member}/{options[0]}, which a manifest names")
