#!/usr/bin/env python3
"""Where a decode step's time goes, from an nsys capture of one step.

Run on the GPU machine:
  nsys profile -t cuda --cuda-graph-trace=node --capture-range=cudaProfilerApi -o step \
      qspec bench --device cuda --synthetic llama3-8b --modes w4a16 --batch-sizes 1 --profile-step
  nsys export --type sqlite -o step.sqlite step.nsys-rep
  tools/nsys_timeline.py step.sqlite

On the device machine nsys is the one inside Nsight Compute
(/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys). It ends the application when the
capture range ends (exit status 143, expected) and leaves a .qdstrm, because its importer
(host/linux-desktop-glibc_2_11_3-x64/QdstrmImporter) misses libdw.so.1 there: copy libdw.so.1
(Debian libdw1) with its libelf/libbz2/liblzma into a folder that travels, and run
`LD_LIBRARY_PATH=that/folder QdstrmImporter -i step.qdstrm` to get step.nsys-rep.

Prints, per kernel name: launches, summed duration, and the summed "exposed" time (the part of
the step during which this kernel was the oldest one running), and the step's idle time (no
kernel running). With programmatic dependent launch a kernel's blocks may be resident (and
counted as running) while they wait for the kernel before it, so durations overlap; the oldest
running kernel is the one the others wait on, and the exposed column adds up to the busy time.
"""
import argparse
import re
import sqlite3
from collections import defaultdict


def short(name: str) -> str:
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"qspec::cuda::kernels::|qspec::cuda::|\(anonymous namespace\)::", "", name)
    base = name.split("<")[0].split("(")[0]
    args = re.search(r"<(.*)>", name)
    return base + ("<" + args.group(1)[:60] + ">" if args else "")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sqlite")
    parser.add_argument("--sequence", type=int, default=40, help="kernels of the step to list in order")
    args = parser.parse_args()
    db = sqlite3.connect(args.sqlite)
    rows = db.execute(
        "SELECT k.start, k.end, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = "
        "COALESCE(k.demangledName, k.shortName) ORDER BY k.start").fetchall()
    if not rows:
        raise SystemExit("no kernels in " + args.sqlite)
    kernels = [(start, end, short(name)) for start, end, name in rows]
    first, last = kernels[0][0], max(end for _, end, _ in kernels)
    # Sweep: at each instant the oldest running kernel owns the time.
    events = sorted({t for s, e, _ in kernels for t in (s, e)})
    exposed = defaultdict(float)
    idle = 0.0
    for t0, t1 in zip(events, events[1:]):
        running = [k for k in kernels if k[0] <= t0 and k[1] >= t1]
        if not running:
            idle += t1 - t0
        else:
            exposed[min(running)[2]] += t1 - t0
    total = defaultdict(float)
    count = defaultdict(int)
    for s, e, n in kernels:
        total[n] += e - s
        count[n] += 1
    span = last - first
    print(f"step span {span / 1e3:.1f} us, kernels {len(kernels)}, idle {idle / 1e3:.1f} us")
    print(f"{'kernel':70s} {'n':>4s} {'sum us':>9s} {'exposed us':>11s} {'exposed %':>9s}")
    for n in sorted(total, key=lambda n: -exposed[n]):
        print(f"{n[:70]:70s} {count[n]:4d} {total[n] / 1e3:9.1f} {exposed[n] / 1e3:11.1f} {100 * exposed[n] / span:8.1f}%")
    print("\nfirst kernels in order: start (us from step start), duration, gap from the previous kernel's end")
    prev_end = first
    for s, e, n in kernels[: args.sequence]:
        print(f"{(s - first) / 1e3:9.2f} {(e - s) / 1e3:8.2f} {(s - prev_end) / 1e3:+8.2f}  {n[:80]}")
        prev_end = max(prev_end, e)


if __name__ == "__main__":
    main()
