#!/usr/bin/env python3
"""The layering check of src/: reads every #include "..." of the C++/CUDA sources and checks
that includes between src/ folders only run down the layer order below, so no cycle can form.

    python3 tools/check_layers.py            # exit 1 and a list of the arrows that run up
    python3 tools/check_layers.py --graph    # the folder graph as it is

A folder is a layer (src/ops/cuda counts as src/ops, src/model/cuda as src/model: a backend
lives in its op or model folder). include/qspec is the public API: any layer may include it,
and it includes only its own headers. The order, lowest first, is one list here (LAYERS):
a folder may include its own files and those of any folder below it.
"""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Lowest first. Each folder may include itself and any folder before it in this list.
LAYERS = ["qspec", "base", "quant", "ops", "gemm", "io", "tokenizer", "model", "runtime", "server", "bench", "cli"]

# Arrows that run up today, each with the issue that removes it. The check fails on any
# other up-arrow, and also when a listed one is gone (so the list only shrinks).
KNOWN = {
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of_source(path):
    rel = os.path.relpath(path, ROOT).split(os.sep)
    if rel[0] == "include":
        return "qspec"
    if rel[0] == "src" and len(rel) > 2:
        return rel[1]
    return None


def layer_of_include(name):
    parts = name.split("/")
    if parts[0] == "qspec":
        return "qspec"
    if len(parts) > 1 and parts[0] in LAYERS:
        return parts[0]
    return None


def edges():
    found = {}
    for top in ("src", "include"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if not f.endswith((".h", ".cpp", ".cu", ".cuh", ".hpp")):
                    continue
                path = os.path.join(dirpath, f)
                src = layer_of_source(path)
                if src is None:
                    continue
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                for inc in INCLUDE.findall(text):
                    dst = layer_of_include(inc)
                    if dst is None or dst == src:
                        continue
                    found.setdefault((src, dst), []).append(os.path.relpath(path, ROOT) + " -> " + inc)
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graph", action="store_true", help="print every folder arrow with its count")
    args = parser.parse_args()
    rank = {name: i for i, name in enumerate(LAYERS)}
    found = edges()
    if args.graph:
        for (src, dst), where in sorted(found.items()):
            print("%-10s -> %-10s %3d %s" % (src, dst, len(where), "UP" if rank[dst] > rank[src] else ""))
        return 0
    bad = []
    for (src, dst), where in sorted(found.items()):
        if rank[dst] <= rank[src]:
            continue
        if (src, dst) in KNOWN:
            continue
        bad.append("%s -> %s (%s is above %s in tools/check_layers.py LAYERS):\n    %s"
                   % (src, dst, dst, src, "\n    ".join(where)))
    stale = [k for k in KNOWN if k not in found or rank[k[1]] <= rank[k[0]]]
    for k in stale:
        bad.append("%s -> %s is listed in KNOWN but no longer exists: remove it from the list" % k)
    for b in bad:
        print("layering:", b)
    print("layering: %d folder arrows checked, %d known exceptions, %d problems" % (len(found), len(KNOWN), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
