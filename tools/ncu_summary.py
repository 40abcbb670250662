#!/usr/bin/env python3
"""Sums an `ncu --csv --metrics gpu__time_duration.sum` log per kernel name: where a decode
step's time goes (each kernel timed alone, serialized, so gaps between kernels are not in it).

usage: tools/ncu_summary.py NCU.csv [--top N]
"""
import csv
import io
import re
import sys
from collections import defaultdict


def main():
    path = sys.argv[1]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 25
    text = open(path, encoding="utf-8", errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        sys.exit(f"{path}: no ncu CSV table found")
    rows = csv.DictReader(io.StringIO(text[start:]))
    total = defaultdict(float)
    count = defaultdict(int)
    for row in rows:
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = re.sub(r"\(.*", "", row["Kernel Name"]).strip()
        name = re.sub(r"<.*", "", name) if len(name) > 60 else name
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "ns")
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit, 1e-3)
        total[name] += value * scale
        count[name] += 1
    grand = sum(total.values())
    print(f"{'kernel':60s} {'launches':>8s} {'total us':>10s} {'mean us':>9s} {'share':>6s}")
    for name, us in sorted(total.items(), key=lambda item: -item[1])[:top]:
        print(f"{name[:60]:60s} {count[name]:8d} {us:10.1f} {us / count[name]:9.2f} {100 * us / grand:5.1f}%")
    print(f"{'all kernels':60s} {sum(count.values()):8d} {grand:10.1f}")


if __name__ == "__main__":
    main()
