#!/usr/bin/env python3
"""Plots a `qspec tune` timing record (bench/results/gemm-tune-*.json): for each layer GEMM (a
column) and activation kind (a row), every strategy's median time over the token count M, the
strategy the map picked at each M, and the floors of the GEMM: its weight bytes (4-bit codes and
f16 group scales) over the copy bandwidth, and for f16 activations its multiply-adds over the
dense f16 tensor-core rate (issue 53's "1.25x of max(bytes floor, mma floor)"). The bandwidth and
rate are what `qspec bench --device cuda` prints for the same GPU (its header line).

usage: tools/plot_gemm_tune.py OUT.png RECORD.json [--copy-gbs 3927] [--f16-tflops 767]
"""
import argparse
import json
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SHAPES = ["qkv", "o", "gate_up", "down"]


def weight_bytes(n, k, group):
    return n * k / 2 + n * (k / group) * 2  # codes + f16 scales


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("record")
    parser.add_argument("--copy-gbs", type=float, default=3927.0, help="measured copy bandwidth, GB/s")
    parser.add_argument("--f16-tflops", type=float, default=767.0, help="measured dense f16 mma rate, TFLOP/s")
    args = parser.parse_args()
    with open(args.record) as f:
        record = json.load(f)
    points = defaultdict(list)  # (shape, activations) -> [(m, us by strategy, best, n, k, group)]
    for p in record["timings"]:
        points[(p["shape"], p["activations"])].append((p["m"], p["us"], p.get("best"), p["n"], p["k"], p["group"]))
    kinds = sorted({a for (_, a) in points}, key=lambda a: (a != "f16", a))
    shapes = [s for s in SHAPES if any((s, a) in points for a in kinds)]
    strategies = sorted({s for rows in points.values() for (_, us, *_r) in rows for s in us})
    colours = {s: plt.cm.tab20(i % 20) for i, s in enumerate(strategies)}
    fig, axes = plt.subplots(len(kinds), len(shapes), figsize=(4.6 * len(shapes), 3.8 * len(kinds)), squeeze=False)
    for row, kind in enumerate(kinds):
        for col, shape in enumerate(shapes):
            ax = axes[row][col]
            rows = sorted(points.get((shape, kind), []), key=lambda r: r[0])
            if not rows:
                ax.set_visible(False)
                continue
            n, k, group = rows[0][3], rows[0][4], rows[0][5]
            for strategy in strategies:
                xs = [m for (m, us, *_r) in rows if strategy in us]
                ys = [us[strategy] for (m, us, *_r) in rows if strategy in us]
                if xs:
                    ax.plot(xs, ys, color=colours[strategy], linewidth=1.0, alpha=0.8, label=strategy)
            best = [(m, us[b]) for (m, us, b, *_r) in rows if b in us]
            if best:
                ax.plot([m for m, _ in best], [t for _, t in best], "k.", markersize=4, label="map's pick")
            ms = [r[0] for r in rows]
            bytes_us = weight_bytes(n, k, group) / (args.copy_gbs * 1e3)
            ax.plot([ms[0], ms[-1]], [bytes_us, bytes_us], "k--", linewidth=1.2, label="weight bytes floor")
            if kind == "f16":
                mma = [2.0 * m * n * k / (args.f16_tflops * 1e6) for m in ms]
                ax.plot(ms, [max(a, bytes_us) for a in mma], "k:", linewidth=1.4, label="max(bytes, f16 mma) floor")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{shape} {n}x{k} g{group}, {kind} activations", fontsize=9)
            ax.set_xlabel("tokens (M)")
            ax.set_ylabel("us")
            ax.grid(True, which="both", alpha=0.25)
    handles, labels = [], []
    for ax in axes.flat:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    fig.legend(handles, labels, loc="lower center", ncol=min(7, len(labels)), fontsize=8)
    fig.suptitle(f"{record.get('model', '')} GEMMs on {record.get('gpu', '')} ({record.get('commit', '')}): "
                 f"qspec tune record", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 0.96))
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
