#!/usr/bin/env python3
"""The summary of a scripts/cpu-vs-llamacpp.sh log: each engine's prefill and decode tokens/s per
round and their medians, qspec's ratios to each llama.cpp run (median over median, and the median
of the ratios within each round: the pairs saw the same load), and the load averages the runs saw. Engines are named by their round headers (`== round N NAME`; a qspec run
gives one engine per mode, "qspec w4a16"). Prints JSON.

    python3 scripts/cpu-vs-llamacpp-summary.py OUT_PREFIX.log > OUT_PREFIX.json
"""
import json
import re
import statistics
import sys

ROUND = re.compile(r"^== round (\d+) (qspec|llama\.cpp.*)$")
QSPEC_ROW = re.compile(r"^(w\S+)\s+([\d.]+) t/s\s+([\d.]+) t/s$")
LLAMA_ROW = re.compile(r"^\|.*\|\s*(pp|tg)(\d+)\s*\|\s*([\d.]+) ± ([\d.]+)\s*\|$")
LOAD = re.compile(r"load average: ([\d.]+), ([\d.]+), ([\d.]+)")


def summarize(lines):
    header = [line[2:].strip() for line in lines if line.startswith("# ")]
    runs = {}  # (engine, metric) -> [value per round]
    by_round = {}  # (engine, metric) -> {round: value}
    loads = []
    engine = None
    round_number = None
    for line in lines:
        line = line.rstrip("\n")
        match = ROUND.match(line)
        if match:
            round_number, engine = int(match.group(1)), match.group(2)
            continue
        match = LOAD.search(line)
        if match and line.startswith("uptime"):
            loads.append(float(match.group(1)))
            continue
        if engine == "qspec":
            match = QSPEC_ROW.match(line)
            if match:
                for metric, value in (("prefill", match.group(2)), ("decode", match.group(3))):
                    runs.setdefault(("qspec " + match.group(1), metric), []).append(float(value))
                    by_round.setdefault(("qspec " + match.group(1), metric), {})[round_number] = float(value)
        elif engine is not None:
            match = LLAMA_ROW.match(line)
            if match:
                metric = "prefill" if match.group(1) == "pp" else "decode"
                runs.setdefault((engine, metric), []).append(float(match.group(3)))
                by_round.setdefault((engine, metric), {})[round_number] = float(match.group(3))
    if not runs:
        sys.exit("no qspec or llama-bench results in the log")
    engines = {}
    for (name, metric), values in runs.items():
        engines.setdefault(name, {})[metric] = {"per_round": values, "median": statistics.median(values)}
    ratios, paired = {}, {}
    peers = {name: metrics for name, metrics in engines.items() if name.startswith("llama.cpp")}
    for name, metrics in engines.items():
        if name in peers:
            continue
        for peer_name, peer in peers.items():
            for metric, value in metrics.items():
                if metric not in peer:
                    continue
                key = f"{name} {metric} / {peer_name} {metric}"
                ratios[key] = round(value["median"] / peer[metric]["median"], 3)
                ours, theirs = by_round[(name, metric)], by_round[(peer_name, metric)]
                per_round = [round(ours[r] / theirs[r], 3) for r in sorted(ours) if r in theirs and theirs[r] > 0]
                if per_round:
                    paired[key] = {"per_round": per_round, "median": statistics.median(per_round)}
    return {
        "benchmark": "cpu_vs_llamacpp",
        "header": header,
        "engines": engines,
        "ratios_of_medians": ratios,
        "ratios_within_rounds": paired,
        "load_average_1min": {"per_run": loads, "min": min(loads, default=None), "median":
                              statistics.median(loads) if loads else None, "max": max(loads, default=None)},
    }


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        print(json.dumps(summarize(f.readlines()), indent=2))


if __name__ == "__main__":
    main()
