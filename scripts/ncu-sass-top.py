#!/usr/bin/env python3
"""Summarise `ncu --page source --csv --print-source sass` output: where a kernel's issued
instructions and warp-stall samples go, by SASS opcode and by line.

usage: ncu -i REPORT --page source --csv --print-source sass > sass.csv
       scripts/ncu-sass-top.py sass.csv [lines]
"""
import csv
import collections
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own messages are not quoted
    rows = list(csv.reader(lines))
    header_at = next(i for i, r in enumerate(rows) if "Source" in r)
    header = rows[header_at]
    body = [r for r in rows[header_at + 1:] if len(r) == len(header) and r != header]

    def column(*names):
        for name in names:
            for i, h in enumerate(header):
                if h.startswith(name):
                    return i
        return None

    src = column("Source")
    executed = column("Warp Instructions Executed", "Instructions Executed")
    stalls = column("Warp Stall Sampling (All Samples)", "Sampling Data (All)")
    print("columns:", [h for h in header])
    if executed is None or stalls is None:
        print("no instruction / stall columns; header above")
        return
    total_exec = sum(number(r[executed]) for r in body) or 1
    total_stall = sum(number(r[stalls]) for r in body) or 1
    by_op = collections.defaultdict(lambda: [0.0, 0.0])
    for r in body:
        text = r[src].strip()
        op = text.split()[0] if text else "?"
        if op.startswith("@"):
            op = text.split()[1] if len(text.split()) > 1 else op
        by_op[op.split(".")[0]][0] += number(r[executed])
        by_op[op.split(".")[0]][1] += number(r[stalls])
    print(f"\ninstructions executed {total_exec:.0f}, stall samples {total_stall:.0f}, {len(body)} SASS lines")
    print("\nby opcode: % of executed, % of stall samples")
    for op, (e, s) in sorted(by_op.items(), key=lambda kv: -kv[1][1])[:30]:
        print(f"  {op:12s} {100 * e / total_exec:6.2f} {100 * s / total_stall:6.2f}")
    for title, key in (("stall samples", stalls), ("executed", executed)):
        print(f"\ntop {top} lines by {title} (line, samples %, executed %, source)")
        for i, r in sorted(enumerate(body), key=lambda ir: -number(ir[1][key]))[:top]:
            print(f"  {i:5d} {100 * number(r[stalls]) / total_stall:6.2f} {100 * number(r[executed]) / total_exec:6.2f}"
                  f"  {r[src].strip()[:90]}")


if __name__ == "__main__":
    main()
