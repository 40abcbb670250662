#!/usr/bin/env python3
"""Splice a retuned token range into a committed GEMM policy map.

usage: scripts/splice-policy-map.py BASE.json NEW.json LO HI OUT.json [--activations=f16,int8] [--note=KEY=TEXT ...]

For every shape (activations, n, k) of BASE, the strategies at LO <= M <= HI come from NEW (a map
that `qspec tune --m-values ...` wrote for that range, with or without --refine-steps); the rest
stay BASE's, so hand edits and refinements outside the range survive. --activations limits the
splice to those kinds (default: every kind NEW has). A shape NEW lacks keeps
BASE's choice. The maps must be for the same GPU. Lookups follow PolicyMap::lookup: the first range
whose max_m >= M, the last range beyond them all.
"""
import json
import sys


def lookup(ranges, m):
    for r in ranges:
        if m <= r["max_m"]:
            return r["strategy"]
    return ranges[-1]["strategy"]


def key(entry):
    return (entry["activations"], entry["n"], entry["k"])


def main(argv):
    notes = [a for a in argv[1:] if a.startswith("--note=")]
    kinds = [a.split("=", 1)[1].split(",") for a in argv[1:] if a.startswith("--activations=")]
    args = [a for a in argv[1:] if not a.startswith("--")]
    if len(args) != 5:
        sys.exit(__doc__)
    base_path, new_path, lo, hi, out_path = args[0], args[1], int(args[2]), int(args[3]), args[4]
    if not 1 <= lo <= hi:
        sys.exit(f"splice-policy-map: bad range {lo}..{hi}")
    with open(base_path) as f:
        base = json.load(f)
    with open(new_path) as f:
        new = json.load(f)
    if base.get("gpu") != new.get("gpu"):
        sys.exit(f"splice-policy-map: {base_path} is for {base.get('gpu')!r}, {new_path} for {new.get('gpu')!r}")
    new_entries = {key(e): e for e in new["entries"]}
    last_m = max([hi] + [r["max_m"] for e in base["entries"] for r in e["ranges"]])
    changed = 0
    for entry in base["entries"]:
        other = new_entries.get(key(entry))
        if other is None or (kinds and entry["activations"] not in kinds[-1]):
            continue
        picks = []
        for m in range(1, last_m + 1):
            s = lookup(other["ranges"], m) if lo <= m <= hi else lookup(entry["ranges"], m)
            changed += s != lookup(entry["ranges"], m)
            picks.append(s)
        ranges = []
        for m, s in enumerate(picks, start=1):
            if ranges and ranges[-1]["strategy"] == s:
                ranges[-1]["max_m"] = m
            else:
                ranges.append({"max_m": m, "strategy": s})
        entry["ranges"] = ranges
    for note in notes:
        name, _, text = note.split("=", 1)[1].partition("=")
        base[name] = text
    with open(out_path, "w") as f:
        json.dump(base, f, indent=1)
        f.write("\n")
    print(f"{out_path}: {changed} (shape, M) picks changed in {lo}..{hi}")


if __name__ == "__main__":
    main(sys.argv)
