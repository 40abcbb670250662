#!/usr/bin/env python3
"""Plots `qspec bench --device cuda` results (bench/results/gpu-decode-*.json) into one PNG:
per model, decode tokens/s and the step's fraction of its roofline against batch size for each
mode, time to first token against prompt length, and, when present, the dataset workloads'
output tokens/s (continuous batching).

usage: tools/plot_gpu_bench.py OUT.png RESULT.json [RESULT.json ...]
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, paths = sys.argv[1], sys.argv[2:]
    records = [json.load(open(p)) for p in paths]
    has_workloads = any("workloads" in m for r in records for m in r["modes"].values())
    rows = 4 if has_workloads else 3
    fig, axes = plt.subplots(rows, len(records), figsize=(5.2 * len(records), 3.6 * rows), squeeze=False)
    for col, record in enumerate(records):
        title = f'{record["model"]}\n{record["gpu"]}, commit {record["commit"][:7]}'
        ax_tps, ax_roof, ax_ttft = axes[0][col], axes[1][col], axes[2][col]
        for mode, data in record["modes"].items():
            decode = data.get("decode", [])
            if decode:
                batch = [d["batch"] for d in decode]
                ax_tps.plot(batch, [d["tokens_per_second"] for d in decode], marker="o", label=mode)
                ax_roof.plot(batch, [100 * d["roofline_fraction"] for d in decode], marker="o", label=mode)
            ttft = data.get("ttft", [])
            if ttft:
                ax_ttft.plot([t["prompt_tokens"] for t in ttft], [t["ttft_ms"] for t in ttft], marker="o", label=mode)
                ax_ttft.plot([t["prompt_tokens"] for t in ttft], [t["roofline_ms"] for t in ttft], linestyle=":",
                             color=ax_ttft.lines[-1].get_color(), label=f"{mode} roofline")
            if has_workloads:
                for name, workload in data.get("workloads", {}).items():
                    w = workload["rows"]
                    axes[3][col].plot([r["batch"] for r in w], [r["output_tokens_per_second"] for r in w], marker="o",
                                      label=f"{mode} {name}")
        ax_tps.set_title(title, fontsize=9)
        ax_tps.set_ylabel("decode tokens/s")
        ax_roof.set_ylabel("% of step roofline")
        ax_roof.set_ylim(0, 100)
        ax_ttft.set_ylabel("time to first token, ms")
        ax_ttft.set_xlabel("prompt tokens")
        ax_ttft.set_xscale("log", base=2)
        ax_ttft.set_yscale("log")
        for ax in (ax_tps, ax_roof):
            ax.set_xlabel("batch size")
            ax.set_xscale("log", base=2)
        if has_workloads:
            axes[3][col].set_xlabel("batch size (slots)")
            axes[3][col].set_ylabel("workload output tokens/s")
            axes[3][col].set_xscale("log", base=2)
        for row in range(rows):
            axes[row][col].grid(True, alpha=0.3)
            if axes[row][col].lines:
                axes[row][col].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
