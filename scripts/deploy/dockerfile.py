#!/usr/bin/env python3
"""The Dockerfile parses (dockerfile-parse, pip): known instructions only, multi-stage from Rust
1.95, no ADD, every COPY source exists, nothing architecture-specific, the OCI labels, the binary
as ENTRYPOINT and `serve` as CMD; .dockerignore leaves out target/.

    scripts/deploy/dockerfile.py
"""
import glob
import os
import re

from dockerfile_parse import DockerfileParser

from deploycheck import check as _check


def check(cond, what):
    _check(cond, f"Dockerfile: {what}")


p = DockerfileParser(path="Dockerfile")
instr = p.structure
known = {"FROM", "ARG", "ENV", "RUN", "COPY", "ADD", "WORKDIR", "USER", "LABEL", "EXPOSE",
         "ENTRYPOINT", "CMD", "HEALTHCHECK", "STOPSIGNAL", "SHELL", "VOLUME", "ONBUILD"}
instr = [i for i in instr if i["instruction"] != "COMMENT"]
for i in instr:
    check(i["instruction"] in known, f"line {i['startline'] + 1}: unknown instruction {i['instruction']}")
froms = [i for i in instr if i["instruction"] == "FROM"]
check(len(froms) >= 2, "multi-stage")
check(froms[0]["value"].split()[0].startswith("rust:1.95"), f"builder {froms[0]['value']}")
stages = [f["value"].split()[-1] for f in froms if " AS " in f["value"].upper()]
check(not any(i["instruction"] == "ADD" for i in instr), "ADD (use COPY)")
for i in instr:
    if i["instruction"] != "COPY":
        continue
    args = i["value"].split()
    from_stage = [a for a in args if a.startswith("--from=")]
    paths = [a for a in args if not a.startswith("--")]
    if from_stage:
        check(from_stage[0][7:] in stages, f"COPY --from={from_stage[0][7:]}: no such stage")
        continue
    for src in paths[:-1]:
        check(glob.glob(src), f"COPY source {src} does not exist")
# GH200/GB200 nodes are aarch64: no instruction may tie the image to one architecture.
for i in instr:
    check(not re.search(r"amd64|x86_64|x86-64|aarch64|arm64|--platform", i["value"]),
          f"line {i['startline'] + 1} is architecture-specific: {i['value']}")
labels = p.labels
for key in ["org.opencontainers.image.title", "org.opencontainers.image.version", "org.opencontainers.image.licenses", "org.opencontainers.image.source"]:
    check(key in labels, f"OCI label {key}")
ep = [i for i in instr if i["instruction"] == "ENTRYPOINT"]
check(ep and "shmlink" in ep[-1]["value"], "ENTRYPOINT is the binary")
cmd = [i for i in instr if i["instruction"] == "CMD"]
check(cmd and "serve" in cmd[-1]["value"], "CMD serve")
check(os.path.exists(".dockerignore"), ".dockerignore")
ignored = open(".dockerignore").read().split()
check("target" in ignored or "/target" in ignored, ".dockerignore leaves out target/")
print(f"   ok ({len(froms)} stages, {sum(1 for i in instr if i['instruction'] == 'COPY')} COPY)")
