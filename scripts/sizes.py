#!/usr/bin/env python3
"""The size limits ARCHITECTURE.md keeps: no source file over 600 lines before its tests, no
function over 80 lines (tables of data aside: none today). Lists what is over and exits 1.

    scripts/sizes.py [DIR ...]        (default: src crates bench tests/common)

A function's length is counted from its `fn` line to its closing brace, braces inside string
and character literals and after `//` set aside; a file's lines stop at its `#[cfg(test)]`.
"""
import os
import re
import sys

FILE_MAX, FN_MAX = 600, 80
FN = re.compile(
    r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"C"\s+)?fn\s+(\w+)'
)


def code(line):
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    return line.split("//")[0]


def measure(path):
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    end = next((i for i, l in enumerate(lines) if l.startswith("#[cfg(test)]")), len(lines))
    long = []
    for i in range(end):
        m = FN.match(lines[i])
        if not m or lines[i].rstrip().endswith(";"):
            continue
        depth, opened, j = 0, False, i
        while j < len(lines):
            text = code(lines[j])
            for ch in text:
                if ch == "{":
                    depth, opened = depth + 1, True
                elif ch == "}":
                    depth -= 1
            if (opened and depth <= 0) or (not opened and text.rstrip().endswith(";")):
                break
            j += 1
        if j - i + 1 > FN_MAX:
            long.append((j - i + 1, f"{path}::{m.group(7)}"))
    return end, long


def main(roots):
    big, long = [], []
    for root in roots:
        for d, _, files in os.walk(root):
            if "/target" in d:
                continue
            for f in sorted(files):
                if f.endswith(".rs"):
                    path = os.path.join(d, f)
                    n, fns = measure(path)
                    if n > FILE_MAX:
                        big.append((n, path))
                    long.extend(fns)
    print(f"files over {FILE_MAX} lines before their tests: {len(big)}")
    for n, p in sorted(big, reverse=True):
        print(f"  {n:5} {p}")
    print(f"functions over {FN_MAX} lines: {len(long)}")
    for n, p in sorted(long, reverse=True):
        print(f"  {n:5} {p}")
    return 1 if big or long else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["src", "crates", "bench", "tests/common"]))
