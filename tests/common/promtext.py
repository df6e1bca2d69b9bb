"""Prometheus text exposition, parsed for the Python harnesses (bench/, scripts/vm/verify.py);
tests/common/promtext.rs is the same parser for the Rust ones. Import it with tests/common on
sys.path (PYTHONPATH=tests/common from the repository's root).
"""
import re

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|\})')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def samples(text):
    """[(name, {label: value}, value)], one per sample line, in order. Label values are
    unescaped; a line that is not a sample (comments, blank lines, and anything else, such as a
    kernel message on the same console) is skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _NAME.match(line)
        if not m:
            continue
        name, rest, labels = m.group(0), line[m.end():], {}
        if rest.startswith("{"):
            pos = 1
            if rest[1:].lstrip().startswith("}"):
                pos = rest.index("}") + 1
            else:
                while True:
                    lm = _LABEL.match(rest, pos)
                    if not lm:
                        break
                    labels[lm.group(1)] = re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e.group(0)], lm.group(2))
                    pos = lm.end()
                    if lm.group(3) == "}":
                        break
                    if rest[pos:].lstrip().startswith("}"):  # a trailing comma
                        pos = rest.index("}", pos) + 1
                        break
                if not lm:
                    continue
            rest = rest[pos:]
        fields = rest.split()
        # The value, then an optional timestamp.
        if not rest[:1].isspace() or len(fields) not in (1, 2):
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        out.append((name, labels, value))
    return out
