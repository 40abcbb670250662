#!/usr/bin/env python3
"""Plots ADAngel's ablation (`qspec bench --device cuda --gemm-ablation ...`, the paper's Fig. 12):
per model (a column) and mode (a row pair), decode tokens/s over batch size and time to first
token over prompt length for the tuned map (ADAngel), the map without Split and Bitwise, the
rule-based map, the built-in crossovers, and each static strategy alone.

usage: tools/plot_gemm_ablation.py OUT.png gemm-ablation-MODEL-GPU.json [...]
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def label(spec):
    if spec.startswith("forced:"):
        return spec[len("forced:"):]
    if spec.endswith(".json"):
        return "ADAngel w/o Split+Bitwise" if "without" in os.path.basename(spec) else "ADAngel (tuned map)"
    return {"paper-rule": "rule-based map", "builtin": "built-in crossovers"}.get(spec, spec)


def style(spec):
    if spec.endswith(".json") and "without" not in os.path.basename(spec):
        return dict(color="black", linewidth=2.4, marker="o", zorder=5)
    if spec.endswith(".json"):
        return dict(color="tab:gray", linewidth=1.6, linestyle="--", marker="x", zorder=4)
    if spec == "paper-rule":
        return dict(color="tab:red", linewidth=1.6, linestyle=":", marker="s")
    if spec == "builtin":
        return dict(color="tab:blue", linewidth=1.4, linestyle="-.", marker="^")
    statics = ["small_m_v1", "small_m_v2", "small_m_v3", "small_m_v4", "tiled_256x64", "tiled_128x64",
               "tiled_256x32", "tiled_128x128", "dequant_cublas", "split_small_m", "bitwise_b1",
               "s8_wide_128x128", "s8_wgmma_128x128", "small_m_v5", "tiled_128x32", "wgmma_128x128"]
    name = spec[len("forced:"):]
    color = plt.get_cmap("tab20")(statics.index(name) / 20.0) if name in statics else None
    return dict(linewidth=0.9, alpha=0.8, marker=".", color=color)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, paths = sys.argv[1], sys.argv[2:]
    records = [json.load(open(p)) for p in paths]
    modes = sorted({m for r in records for m in r["gemm_ablation"]})
    fig, axes = plt.subplots(2 * len(modes), len(records), figsize=(6.5 * len(records), 4.2 * 2 * len(modes)),
                             squeeze=False)
    for col, record in enumerate(records):
        specs = record["gemm_ablation_policies"]
        for row, mode in enumerate(modes):
            rows = record["gemm_ablation"].get(mode, [])
            ax_dec, ax_ttft = axes[2 * row][col], axes[2 * row + 1][col]
            for spec in specs:
                dec = [(r["batch"], r["batch"] / (r["ms"][spec] * 1e-3)) for r in rows
                       if r["kind"] == "decode" and spec in r["ms"]]
                ttft = [(r["prompt_tokens"], r["ms"][spec]) for r in rows if r["kind"] == "ttft" and spec in r["ms"]]
                if dec:
                    ax_dec.plot(*zip(*dec), label=label(spec), **style(spec))
                if ttft:
                    ax_ttft.plot(*zip(*ttft), label=label(spec), **style(spec))
            name = record["model"].replace("synthetic ", "")
            ax_dec.set_title(f"{name}, {mode}: decode (context {record['context']})")
            ax_dec.set_xlabel("batch size")
            ax_dec.set_ylabel("tokens/s")
            ax_dec.set_xscale("log", base=2)
            ax_dec.set_yscale("log")
            ax_ttft.set_title(f"{name}, {mode}: time to first token")
            ax_ttft.set_xlabel("prompt tokens")
            ax_ttft.set_ylabel("ms (log)")
            ax_ttft.set_xscale("log", base=2)
            ax_ttft.set_yscale("log")
            for ax in (ax_dec, ax_ttft):
                ax.grid(True, which="both", alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"ADAngel ablation, {records[0]['gpu']}, commit {records[0]['commit'][:7]}")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote", out)


if __name__ == "__main__":
    main()
