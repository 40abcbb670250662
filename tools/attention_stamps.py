#!/usr/bin/env python3
"""Summarize the decode attention's per-phase stamps (a build with -DQSPEC_ATTENTION_STAMPS=N prints
them: src/ops/cuda/kernels/paged_attention_decode_tiles.cuh). Input: the output of one or more
`qspec bench` runs, each preceded by a line "== batch B". Output: per batch and launch, the phases'
times in microseconds after the first block's grid-dependency wait returned (the QKV GEMM's end):
medians over the blocks, and the last block's end.

usage: tools/attention_stamps.py STAMPS.log
"""
import collections
import re
import statistics
import sys

LINE = re.compile(r"attention-stamps launch (\d+) block (\d+) (\d+) (\d+): entry (\d+) wait (\d+) rope (\d+) "
                  r"tile1 (\d+) tile2 (\d+) stores (\d+) end (\d+) tiles (\d+)")


def main(path):
    batch = None
    launches = collections.defaultdict(list)
    for line in open(path, encoding="utf-8", errors="replace"):
        if line.startswith("== batch"):
            batch = int(line.split()[2])
            continue
        match = LINE.match(line)
        if match:
            values = list(map(int, match.groups()))
            launches[(batch, values[0])].append(values[4:])  # entry, wait, rope, tile1, tile2, stores, end, tiles
    print("batch launch blocks  entry->wait  rope  tile1  tile2  stores  end(median)  end(last)   [us after the first wait]")
    for (batch, launch), blocks in sorted(launches.items()):
        first_wait = min(b[1] for b in blocks)
        first_entry = min(b[0] for b in blocks)

        def median(i, subset=blocks):
            return statistics.median(b[i] - first_wait for b in subset) / 1e3 if subset else float("nan")

        two_tiles = [b for b in blocks if b[7] >= 2]
        print(f"{batch:5d} {launch:6d} {len(blocks):6d} {(first_wait - first_entry) / 1e3:12.2f} {median(2):5.2f} "
              f"{median(3):6.2f} {median(4, two_tiles):6.2f} {median(5):7.2f} {median(6):12.2f} "
              f"{(max(b[6] for b in blocks) - first_wait) / 1e3:10.2f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
