#!/usr/bin/env python3
"""scripts/splice-policy-map.py: a retuned token range replaces the base map's picks there and only
there, per activation kind when asked, and maps of two GPUs are refused."""
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "splice-policy-map.py")


def lookup(ranges, m):
    for r in ranges:
        if m <= r["max_m"]:
            return r["strategy"]
    return ranges[-1]["strategy"]


def entry(activations, n, k, ranges):
    return {"activations": activations, "group": 128, "n": n, "k": k,
            "ranges": [{"max_m": m, "strategy": s} for m, s in ranges]}


def write(directory, name, value):
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        json.dump(value, f)
    return path


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def main():
    failures = []

    def check(condition, what):
        if not condition:
            failures.append(what)

    base = {"gpu": "G", "format": "qspec-gemm-policy", "edit_note": "kept",
            "entries": [entry("f16", 4096, 4096, [(16, "small_m_v5"), (32, "tiled_128x32"), (128, "tiled_256x64"),
                                                  (4096, "dequant_cublas")]),
                        entry("int8", 4096, 4096, [(8, "small_m_v1"), (511, "tiled_256x64"), (4096, "s8_wgmma_128x128")]),
                        entry("f16", 28672, 4096, [(16, "small_m_v5"), (4096, "tiled_256x64")])]}
    new = {"gpu": "G", "entries": [entry("f16", 4096, 4096, [(48, "tiled_128x64"), (96, "tiled_128x32"), (4096, "tiled_256x32")]),
                                   entry("int8", 4096, 4096, [(4096, "tiled_128x128")])]}
    with tempfile.TemporaryDirectory() as tmp:
        base_path, new_path = write(tmp, "base.json", base), write(tmp, "new.json", new)
        out = os.path.join(tmp, "out.json")
        result = run(base_path, new_path, "33", "96", out, "--note=retune=why")
        check(result.returncode == 0, f"splice failed: {result.stderr}")
        spliced = json.load(open(out))
        by_key = {(e["activations"], e["n"]): e["ranges"] for e in spliced["entries"]}
        f16 = by_key[("f16", 4096)]
        for m, want in [(1, "small_m_v5"), (32, "tiled_128x32"), (33, "tiled_128x64"), (48, "tiled_128x64"),
                        (49, "tiled_128x32"), (96, "tiled_128x32"), (97, "tiled_256x64"), (128, "tiled_256x64"),
                        (129, "dequant_cublas"), (4096, "dequant_cublas"), (9999, "dequant_cublas")]:
            check(lookup(f16, m) == want, f"f16 at {m}: {lookup(f16, m)}, want {want}")
        check(all(a["max_m"] < b["max_m"] and a["strategy"] != b["strategy"] for a, b in zip(f16, f16[1:])),
              f"f16 ranges not merged and increasing: {f16}")
        int8 = by_key[("int8", 4096)]
        check([lookup(int8, m) for m in (8, 32, 33, 96, 97, 512)] ==
              ["small_m_v1", "tiled_256x64", "tiled_128x128", "tiled_128x128", "tiled_256x64", "s8_wgmma_128x128"],
              f"int8: {int8}")
        check(by_key[("f16", 28672)] == base["entries"][2]["ranges"], "a shape the new map lacks changed")
        check(spliced["edit_note"] == "kept" and spliced["retune"] == "why", "notes lost or not added")

        only_int8 = os.path.join(tmp, "int8.json")
        result = run(base_path, new_path, "33", "96", only_int8, "--activations=int8")
        check(result.returncode == 0, f"--activations splice failed: {result.stderr}")
        by_key = {(e["activations"], e["n"]): e["ranges"] for e in json.load(open(only_int8))["entries"]}
        check(by_key[("f16", 4096)] == base["entries"][0]["ranges"], "--activations=int8 changed f16")
        check(lookup(by_key[("int8", 4096)], 64) == "tiled_128x128", "--activations=int8 left int8 alone")

        other = write(tmp, "other.json", dict(new, gpu="H"))
        result = run(base_path, other, "33", "96", os.path.join(tmp, "x.json"))
        check(result.returncode != 0 and "is for" in result.stderr, "maps of two GPUs were spliced")
        result = run(base_path, new_path, "96", "33", os.path.join(tmp, "x.json"))
        check(result.returncode != 0 and "bad range" in result.stderr, "an empty range was accepted")
        result = run(base_path, new_path, "33")
        check(result.returncode != 0 and "usage" in result.stderr, "missing arguments were accepted")

    for failure in failures:
        print("FAIL:", failure)
    print("splice-policy-map:", "ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
