#!/usr/bin/env python3
"""Picks the W4A16 `automatic` crossovers from a qspec_gpu_bench JSON: per M, the summed time of
the layer GEMMs (qkv, o, gate_up, down) through each path `automatic` can take (small-M default
variant 1, tiled default tile: 256x32 for m <= 32 else 256x64, dequantize + cuBLAS). Prints the
table and, last, "SMALL_M_MAX TILED_M_MAX" (the build flags QSPEC_W4A16_SMALL_M_MAX / _TILED_M_MAX).

usage: tools/pick_w4a16_crossover.py BENCH.json
"""
import json
import sys
from collections import defaultdict

LAYER_SHAPES = ("qkv", "o", "gate_up", "down")


def path_of(row):
    p = row["path"]
    m = row["m"]
    if p in ("w4a16_small_m_v1",) or (p == "w4a16_small_m" and m > 32):
        return "small_m"
    if p == ("w4a16_tiled_256x32" if m <= 32 else "w4a16_tiled_256x64"):
        return "tiled"
    if p == "w4a16_dequant_cublas":
        return "dequant"
    return None


def main():
    data = json.load(open(sys.argv[1]))
    times = defaultdict(lambda: defaultdict(float))  # m -> path -> us
    seen = defaultdict(lambda: defaultdict(set))
    for row in data["results"]:
        if row["shape"] not in LAYER_SHAPES:
            continue
        path = path_of(row)
        if path is None:
            continue
        times[row["m"]][path] += row["median_us"]
        seen[row["m"]][path].add(row["shape"])
    small_max, tiled_max, region = 0, 0, "small_m"
    print(f"{'m':>6} {'small_m':>10} {'tiled':>10} {'dequant':>10}  best")
    for m in sorted(times):
        complete = {p: t for p, t in times[m].items() if len(seen[m][p]) == len(LAYER_SHAPES)}
        best = min(complete, key=complete.get)
        print(f"{m:6d} " + " ".join(f"{complete.get(p, float('nan')):10.1f}" for p in ("small_m", "tiled", "dequant")) +
              f"  {best}")
        if region == "small_m" and best == "small_m":
            small_max = m
        elif best == "tiled" and region in ("small_m", "tiled"):
            region, tiled_max = "tiled", m
        elif best != "small_m":
            region = "dequant"
    print(small_max, tiled_max)


if __name__ == "__main__":
    main()
