#!/usr/bin/env python3
"""Summarises a draft-auto planner trace (`qspec bench --replay ... --replay-planner-trace FILE`).

For each run (a line {"run", "gamma", "batch"} then its engine's lines): how many plans of each
kind it made, why it stayed plain where sequences had drafts to propose (by their estimated
first-draft acceptance), and what its W4A16 passes cost: plain steps and verify passes by batch
size and verify tokens, graph captures (one-off passes) and prompt passes apart. Runs of the
same batch size side by side show where `auto` spends passes or time that a fixed gamma does not.
--buckets: each batch size's verify passes also by the bucket of their tokens (1, 2, 3-4, 5-8,
9-16, ...: the buckets the planner prices, MeasuredPassCosts::token_bucket), median ms a pass.

usage: tools/planner_trace.py TRACE.jsonl [--batch B] [--buckets]
"""
import argparse
import collections
import json
import re
import sys


def load(path):
    runs, current = [], None
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as error:
                sys.exit(f"{path}:{number}: not a JSON line ({error})")
            if "run" in entry:
                current = {"header": entry, "plans": [], "passes": []}
                runs.append(current)
            elif current is None:
                sys.exit(f"{path}:{number}: an engine line before any run line")
            elif "plan" in entry:
                current["plans"].append(entry)
            elif "pass" in entry:
                current["passes"].append(entry)
            else:
                sys.exit(f"{path}:{number}: neither a run, a plan nor a pass")
    return runs


PLAIN_WITH_DRAFTS = re.compile(r"acceptance ([0-9.]+) then ([0-9.]+), drafts to propose in (\d+) of (\d+)")


def bucket_of(tokens):
    """The planner's token bucket of a pass: (low, high) tokens, powers of two."""
    high = 1
    while high < tokens:
        high *= 2
    return (high // 2 + 1 if high > 1 else 1), high


def summarise(run, buckets=False):
    header = run["header"]
    print(f"== {header['run']} gamma {header['gamma']}, batch {header['batch']}")
    plans = collections.Counter(p["plan"] for p in run["plans"])
    if plans:
        print("  plans: " + ", ".join(f"{label} {count}" for label, count in sorted(plans.items())))
        plain = collections.Counter()
        for p in run["plans"]:
            if p["plan"] != "w4a16":
                continue
            match = PLAIN_WITH_DRAFTS.search(p["reason"])
            if match is None:
                plain[p["reason"].split("(")[0].strip()] += 1
            elif int(match.group(3)) == 0:
                plain["no sequence had drafts to propose"] += 1
            else:
                plain[f"drafts to propose, first-draft acceptance ~{float(match.group(1)):.1f}"] += 1
        for reason, count in sorted(plain.items(), key=lambda item: -item[1]):
            print(f"    plain {count:5d}: {reason}")
        # Lookups by source (traces from 0aa747d on): the sequence's own tokens, or the corpus of
        # earlier requests' text, and the drafts the plans gave them.
        sourced = [p for p in run["plans"] if "lookups" in p]
        if sourced:
            own = sum(p["lookups"]["own"] for p in sourced)
            corpus = sum(p["lookups"]["corpus"] for p in sourced)
            own_drafts = sum(p["drafts"]["own"] for p in sourced)
            corpus_drafts = sum(p["drafts"]["corpus"] for p in sourced)
            print(f"  lookups: own tokens {own} ({own_drafts} drafts planned), "
                  f"earlier requests' text {corpus} ({corpus_drafts} drafts planned)")
    passes = run["passes"]
    total = sum(p["ms"] for p in passes)
    one_off = [p for p in passes if p["one_off"]]
    prompt = [p for p in passes if p["prompt"] and not p["one_off"]]
    decode = [p for p in passes if not p["prompt"] and not p["one_off"]]
    print(f"  passes {len(passes)}, {total:.1f} ms: one-off {len(one_off)} ({sum(p['ms'] for p in one_off):.1f} ms), "
          f"prompt {len(prompt)} ({sum(p['ms'] for p in prompt):.1f} ms), "
          f"decode {len(decode)} ({sum(p['ms'] for p in decode):.1f} ms)")
    by_shape = collections.defaultdict(list)
    for p in decode:
        by_shape[(p["pass"], p["tokens"] - p["pass"])].append(p["ms"])
    plain_ms = {}
    for (sequences, extra), times in sorted(by_shape.items()):
        if extra == 0:
            plain_ms[sequences] = sum(times) / len(times)
    rows = collections.defaultdict(lambda: [0, 0.0, 0])  # sequences -> verify passes, extra ms, tokens
    for (sequences, extra), times in by_shape.items():
        if extra > 0 and sequences in plain_ms:
            row = rows[sequences]
            row[0] += len(times)
            row[1] += sum(times) - len(times) * plain_ms[sequences]
            row[2] += extra * len(times)
    for sequences in sorted(plain_ms):
        line = f"    {sequences:3d} sequences: plain step {plain_ms[sequences]:.3f} ms"
        count, extra_ms, tokens = rows.get(sequences, (0, 0.0, 0))
        if count:
            line += (f"; {count} verify passes, {extra_ms / count:+.3f} ms a pass over the step, "
                     f"{tokens / count:.1f} verify tokens a pass")
        print(line)
        if not buckets:
            continue
        by_bucket = collections.defaultdict(list)
        for (n, extra), times in by_shape.items():
            if n == sequences and extra > 0:
                by_bucket[bucket_of(n + extra)].extend(times)
        for (low, high), times in sorted(by_bucket.items()):
            times = sorted(times)
            print(f"        verify of {low}-{high} tokens: {len(times)} passes, median {times[len(times) // 2]:.3f} ms")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--batch", type=int, help="only the runs of this batch size")
    parser.add_argument("--buckets", action="store_true", help="verify passes by the bucket of their tokens")
    args = parser.parse_args()
    for run in load(args.trace):
        if args.batch is None or run["header"]["batch"] == args.batch:
            summarise(run, args.buckets)


if __name__ == "__main__":
    main()
