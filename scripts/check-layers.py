#!/usr/bin/env python3
"""Includes run one way: down the layers, never up.

Each top-level folder (and each folder of runtime/) may include the public headers of the
folders listed for it below and nothing above it: core is the bottom, the runtime's engine
sits on config and everything outside the runtime, the training loop on the engine, the
formats and the planner. A reader (or a change) that makes a lower part call up into a
higher one fails here, naming the file, the line and the rule.

  python3 scripts/check-layers.py        # exit 1 and one line per include that runs upward
"""
import re
import subprocess
import sys

# What each part may include, besides itself.
BELOW = {
    "core": set(),
    "memory": {"core"},
    "offload": {"core", "memory"},
    "collectives": {"core", "memory"},
    "model": {"core"},
    "runtime/config": {"core", "memory", "offload", "collectives", "model"},
    "runtime/engine": {"core", "memory", "offload", "collectives", "model", "runtime/config"},
    "runtime/formats": {"core", "memory", "offload", "collectives", "model", "runtime/config", "runtime/engine"},
    "runtime/plan": {"core", "memory", "offload", "collectives", "model", "runtime/config", "runtime/engine",
                     "runtime/train"},
    "runtime/train": {"core", "memory", "offload", "collectives", "model", "runtime/config", "runtime/engine",
                      "runtime/formats"},
    "runtime/api": {"core", "memory", "offload", "collectives", "model", "runtime/config", "runtime/engine",
                    "runtime/formats", "runtime/train", "runtime/plan"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"strata/([a-z_]+)/(?:([a-z_]+)/)?')


def part_of(path):
    """The part a source file belongs to, or None for folders without a rule (cli, bench, tests...)."""
    m = re.match(r"runtime/(?:src|include/strata/runtime)/([a-z_]+)/", path)
    if m:
        return "runtime/" + m.group(1)
    top = path.split("/", 1)[0]
    return top if top in BELOW else None


def main():
    files = subprocess.check_output(["git", "ls-files"], text=True).split()
    bad = []
    for path in files:
        if not re.search(r"\.(cpp|hpp|h|cu|cuh)$", path):
            continue
        part = part_of(path)
        if part is None:
            continue
        with open(path, errors="replace") as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = m.group(1)
                if target == "runtime":
                    target = "runtime/" + (m.group(2) or "")
                if target == part or target in BELOW[part]:
                    continue
                bad.append(f"{path}:{n}: {part} includes {target}, which is not below it")
    for b in bad:
        print(b)
    if bad:
        print(f"{len(bad)} includes run upward (scripts/check-layers.py lists what each part may include)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
