#!/usr/bin/env python3
"""Every `kubectl ... exec ... shmlink check` in docs/runbooks carries the path options the base
DaemonSet gives `serve` (--proc-root, --cgroup-root, --docker-root, ...), so that the check an
operator runs in the agent's Pod looks where serve looks. Environment variables need no repeating:
`kubectl exec` runs with the container's.

    scripts/deploy/runbook_commands.py [BASE_CORE_YAML]     (default: builds deploy/base)
"""
import glob
import re

from deploycheck import arg, check, core


def serve_paths(docs):
    """The DaemonSet's serve options whose value is a path, as (option, value)."""
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "shmlink"]
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    check(args and args[0] == "serve", f"the DaemonSet's args do not start with serve: {args}")
    pairs = []
    i = 1
    while i < len(args):
        a = args[i]
        if a.startswith("--") and "=" in a:
            opt, value = a.split("=", 1)
            i += 1
        elif a.startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            opt, value = a, args[i + 1]
            i += 2
        else:
            i += 1
            continue
        if value.startswith("/"):
            pairs.append((opt, value))
    check(pairs, f"no path options in the DaemonSet's args {args}")
    return pairs


def check_commands(text):
    """Each shell command (backslash continuations joined) that execs `shmlink check`."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line for line in joined.splitlines() if re.search(r"\bexec\b.*--\s+shmlink check\b", line)]


def has(cmd, opt, value):
    words = cmd.replace("`", " ").split()
    return any(w == f"{opt}={value}" or (w == opt and i + 1 < len(words) and words[i + 1] == value)
               for i, w in enumerate(words))


paths = serve_paths(core(arg(1), "deploy/base"))
seen = 0
for page in sorted(glob.glob("docs/runbooks/*.md")):
    for cmd in check_commands(open(page).read()):
        seen += 1
        missing = [f"{o} {v}" for o, v in paths if not has(cmd, o, v)]
        check(not missing, f"{page}: `{cmd.strip()}` lacks {', '.join(missing)} (the DaemonSet's serve has them)")
check(seen > 0, "no `kubectl exec ... shmlink check` in docs/runbooks: nothing was checked")
print(f"   ok ({seen} commands carry {' '.join(f'{o} {v}' for o, v in paths)})")
