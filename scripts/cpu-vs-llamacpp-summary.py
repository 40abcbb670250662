#!/usr/bin/env python3
"""The summary of a scripts/cpu-vs-llamacpp.sh log: each engine's prefill and decode tokens/s per
round and their medians, qspec's ratios to each llama.cpp run (median over median), and the load
averages the runs saw. Engines are named by their round headers (`== round N NAME`; a qspec run
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
    loads = []
    engine = None
    for line in lines:
        line = line.rstrip("\n")
        match = ROUND.match(line)
        if match:
            engine = match.group(2)
            continue
        match = LOAD.search(line)
        if match and line.startswith("uptime"):
            loads.append(float(match.group(1)))
            continue
        if engine == "qspec":
            match = QSPEC_ROW.match(line)
            if match:
                runs.setdefault(("qspec " + match.group(1), "prefill"), []).append(float(match.group(2)))
                runs.setdefault(("qspec " + match.group(1), "decode"), []).append(float(match.group(3)))
        elif engine is not None:
            match = LLAMA_ROW.match(line)
            if match:
                metric = "prefill" if match.group(1) == "pp" else "decode"
                runs.setdefault((engine, metric), []).append(float(match.group(3)))
    if not runs:
        sys.exit("no qspec or llama-bench results in the log")
    engines = {}
    for (name, metric), values in runs.items():
        engines.setdefault(name, {})[metric] = {"per_round": values, "median": statistics.median(values)}
    ratios = {}
    peers = {name: metrics for name, metrics in engines.items() if name.startswith("llama.cpp")}
    for name, metrics in engines.items():
        if name in peers:
            continue
        for peer_name, peer in peers.items():
            for metric, value in metrics.items():
                if metric in peer:
                    ratios[f"{name} {metric} / {peer_name} {metric}"] = round(value["median"] / peer[metric]["median"], 3)
    return {
        "benchmark": "cpu_vs_llamacpp",
        "header": header,
        "engines": engines,
        "ratios_of_medians": ratios,
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
