#!/usr/bin/env python3
"""Plots `qspec_gpu_bench` records (bench/results/gpu-w4a16-*.json): for each layer GEMM (a
column), every kernel's median time over the token count M (top row) and its rate as a fraction of
the dense f16 tensor-core rate (bottom row), with the GEMM's floors: its weight bytes (4-bit codes
and f16 group scales) over the record's copy bandwidth, and its multiply-adds over the f16 rate
(issue 53's "max(bytes floor, mma floor)"). Each record keeps its own marker: compare kernels
within a record (one device call), not across records.

usage: tools/plot_gemm_over_m.py OUT.png RECORD.json [RECORD.json ...] [--f16-tflops 756]
"""
import argparse
import json
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SHAPES = ["qkv", "o", "gate_up", "down"]
MARKERS = ["o", "s", "^", "D", "v"]


def weight_bytes(n, k, group):
    return n * k / 2 + n * (k / group) * 2  # codes + f16 scales


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("records", nargs="+")
    parser.add_argument("--f16-tflops", type=float, default=756.0,
                        help="measured dense f16 rate, TFLOP/s (qspec bench's header: cuBLAS f16)")
    args = parser.parse_args()
    records = []
    for path in args.records:
        with open(path) as f:
            records.append(json.load(f))
    paths = sorted({r["path"] for rec in records for r in rec["results"] if r["shape"] in SHAPES})
    colours = {p: plt.cm.tab10(i % 10) for i, p in enumerate(paths)}
    fig, axes = plt.subplots(2, len(SHAPES), figsize=(4.8 * len(SHAPES), 7.6), squeeze=False)
    labelled = set()  # paths already in the legend (the first column's)
    for col, shape in enumerate(SHAPES):
        ax_time, ax_rate = axes[0][col], axes[1][col]
        if col > 0:
            labelled = set(paths)
        ms_all, dims = set(), None
        for index, rec in enumerate(records):
            rows = defaultdict(list)
            for r in rec["results"]:
                if r["shape"] == shape:
                    rows[r["path"]].append(r)
                    dims = (r["n"], r["k"], r["group"])
                    ms_all.add(r["m"])
            for path, points in rows.items():
                points.sort(key=lambda r: r["m"])
                marker = MARKERS[index % len(MARKERS)]
                # Lines only between neighbouring M of one record (a record's gaps stay gaps).
                segments = [[points[0]]]
                for r in points[1:]:
                    if r["m"] > 2.5 * segments[-1][-1]["m"]:
                        segments.append([])
                    segments[-1].append(r)
                for segment in segments:
                    label = path if path not in labelled else None
                    labelled.add(path)
                    xs = [r["m"] for r in segment]
                    ax_time.plot(xs, [r["median_us"] for r in segment], marker=marker, markersize=4,
                                 color=colours[path], label=label)
                    ax_rate.plot(xs, [100 * r["tflops"] / args.f16_tflops for r in segment], marker=marker,
                                 markersize=4, color=colours[path])
        if dims is None:
            ax_time.set_visible(False)
            ax_rate.set_visible(False)
            continue
        n, k, group = dims
        ms = sorted(ms_all)
        copy = records[0]["copy_bandwidth_gbps"]
        bytes_floor = [weight_bytes(n, k, group) / (copy * 1e3) for _ in ms]  # GB/s -> bytes/us
        mma_floor = [2.0 * n * k * m / (args.f16_tflops * 1e6) for m in ms]  # TFLOP/s -> flop/us
        ax_time.plot(ms, [max(b, f) for b, f in zip(bytes_floor, mma_floor)], "k:", label="max(bytes, mma) floor")
        ax_time.set_title(f"{shape} (n {n}, k {k})")
        ax_time.set_xscale("log", base=2)
        ax_time.set_yscale("log")
        ax_time.set_ylabel("median time, us")
        ax_rate.set_xscale("log", base=2)
        ax_rate.axhline(70, color="grey", linewidth=0.8, linestyle="--")
        ax_rate.set_ylim(0, 110)
        ax_rate.set_xlabel("tokens (M)")
        ax_rate.set_ylabel(f"% of {args.f16_tflops:.0f} TFLOP/s")
        for ax in (ax_time, ax_rate):
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    commits = ", ".join(f'{MARKERS[i % len(MARKERS)]}: {rec["commit"][:7]}' for i, rec in enumerate(records))
    fig.suptitle(f'W4A16 GEMMs over M on {records[0]["gpu"]} (records {commits})')
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
