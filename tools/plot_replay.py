#!/usr/bin/env python3
"""Plots `qspec bench --replay` records (bench/results/gpu-replay-*.json): for each record, QSpec's
tokens/s over plain W4A16's of the same run against batch size, one line per QSpec run (draft and
gamma), with 1.0 (plain W4A16) marked.

usage: tools/plot_replay.py OUT.png RECORD.json [RECORD.json ...]
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
    fig, axes = plt.subplots(1, len(records), figsize=(5.4 * len(records), 4.2), squeeze=False)
    for ax, record in zip(axes[0], records):
        runs = {}
        for row in record["rows"]:
            if row["run"] == "w4a16":
                continue
            runs.setdefault(f'{row["run"]} g{row["gamma"]}', []).append((row["batch_size"], row["over_w4a16"]))
        for name, points in sorted(runs.items()):
            points.sort()
            ax.plot([b for b, _ in points], [r for _, r in points], marker="o", label=name)
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch (sequences)")
        ax.set_ylabel("tokens/s over plain W4A16")
        texts = record["texts"].split("/")[-1].replace("replay-texts-", "").replace(".json", "")
        costs = "" if record.get("qspec_costs", "auto") == "auto" else f', planner costs: {record["qspec_costs"]}'
        ax.set_title(f'{record["model"]}, {texts}{costs}\n{record["gpu"]}, commit {record["commit"][:7]}', fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
