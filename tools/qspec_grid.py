#!/usr/bin/env python3
"""The QSpec invariant grid and acceptance table, run as parallel `qspec eval qspec` shards.

Issue 3 asks for greedy QSpec == greedy W4A16 on all eval problems for every draft mode, gamma
1..6 and batch sizes 1, 3, 16 (staggered arrivals), and for the acceptance of every draft mode
with and without KV overwrite. One `qspec eval qspec` process checks one slice of that grid
single-threaded; this script runs the slices side by side on a many-core machine and merges
their JSON into one results file and the README tables.

  tools/qspec_grid.py run   --qspec build/qspec --model DIR --out DIR --part on|off|all [-j N]
                            [--reference REF.json] [--deadline SECONDS]
  tools/qspec_grid.py merge --out DIR --json bench/results/qspec-grid.json

Each shard is one (draft, batch size, gamma, overwrite) config. With --reference (made by
`qspec eval qspec ... --save-reference REF.json`) no shard re-runs plain W4A16. A shard whose
JSON already exists in --out is skipped, so an interrupted grid resumes where it stopped;
--deadline stops launching shards that would not finish and kills what still runs then.
"""
import argparse
import concurrent.futures
import json
import os
import pathlib
import subprocess
import sys
import time

START = time.time()

DRAFTS = ["w4a8", "w4a4-int4", "w4a4-nvfp4", "w4a4-mxfp4",
          "w4a4-int4-arc", "w4a4-nvfp4-arc", "w4a4-mxfp4-arc"]
GAMMAS = [1, 2, 3, 4, 5, 6]
# The invariant needs overwrite on at batch sizes 1, 3, 16; the ablation overwrite off at 16.
PARTS = {"on": [(1, "on"), (3, "on"), (16, "on")], "off": [(16, "off")]}


def jobs_for(args):
    if args.batches:
        configs = [(int(b), o) for b in args.batches.split(",") for o in args.overwrites.split(",")]
    else:
        configs = [c for p in (PARTS.keys() if args.part == "all" else [args.part]) for c in PARTS[p]]
    drafts = args.drafts.split(",") if args.drafts else DRAFTS
    # Slowest first (small batches), so the shards left at a deadline are the short ones.
    return [(draft, batch, overwrite, [gamma])
            for batch, overwrite in configs for gamma in GAMMAS for draft in drafts]


def job_name(draft, batch, overwrite, gammas):
    return f"{draft}_b{batch}_kv{overwrite}_g{''.join(map(str, gammas))}"


def run_job(args, job):
    draft, batch, overwrite, gammas = job
    name = job_name(*job)
    out_json = pathlib.Path(args.out) / f"{name}.json"
    if out_json.exists():
        return name, 0, 0.0
    if args.deadline and time.time() > START + args.deadline - args.shard_estimate:
        return name, "not started (deadline)", 0.0
    command = [args.qspec, "-t", "1", "--cpu-f32-weights", "eval", "qspec", args.model,
               "--limit", str(args.limit), "--drafts", draft,
               "--gammas", ",".join(map(str, gammas)), "--batch-sizes", str(batch),
               "--kv-overwrite", overwrite, "-o", str(out_json) + ".partial"]
    if args.reference:
        command += ["--reference", args.reference]
    if args.problems:
        command.insert(command.index(args.model) + 1, args.problems)
    command += ["-n", str(args.max_tokens)] + (["--chat"] if args.chat else [])
    start = time.time()
    timeout = args.timeout
    if args.deadline:
        remaining = START + args.deadline - start
        timeout = remaining if timeout is None else min(timeout, remaining)
    with open(pathlib.Path(args.out) / f"{name}.log", "w") as log:
        try:
            rc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    if rc == 0:
        os.replace(str(out_json) + ".partial", out_json)
    return name, rc, time.time() - start


def run(args):
    os.makedirs(args.out, exist_ok=True)
    jobs = jobs_for(args)
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_job, args, job) for job in jobs]
        for future in concurrent.futures.as_completed(futures):
            name, rc, seconds = future.result()
            print(f"{name}: rc {rc}, {seconds:.0f} s", flush=True)
            failed += rc != 0
    done = len(list(pathlib.Path(args.out).glob("*.json")))
    print(f"{done} of {len(jobs)} shards done", flush=True)
    return 1 if failed else 0


def merge(args):
    rows, commands, baselines = [], [], []
    for path in sorted(pathlib.Path(args.out).glob("*.json")):
        data = json.loads(path.read_text())
        commands.append(data["command"])
        baselines.extend(data.get("baseline_w4a16", []))
        rows.extend(data["results"])
        meta = {k: data[k] for k in ("model", "problems", "problems_file", "parameters", "commit")}
    key = lambda r: (DRAFTS.index(r["draft"]) if r["draft"] in DRAFTS else len(DRAFTS), r["gamma"],
                     r["batch_size"], not r["kv_overwrite"])
    rows.sort(key=key)
    summary = {
        "configs_overwrite_on": sum(r["kv_overwrite"] for r in rows),
        "configs_overwrite_off": sum(not r["kv_overwrite"] for r in rows),
        "outputs_checked_overwrite_on": sum(r["identical_to_w4a16"] + r["exact_logit_ties"] + r["mismatches"]
                                            for r in rows if r["kv_overwrite"]),
        "identical": sum(r["identical_to_w4a16"] for r in rows if r["kv_overwrite"]),
        "exact_logit_ties": sum(r["exact_logit_ties"] for r in rows if r["kv_overwrite"]),
        "mismatches": sum(r["mismatches"] for r in rows if r["kv_overwrite"]),
    }
    result = {"benchmark": "qspec_grid", **meta, "summary": summary, "shard_commands": commands,
              "command": " ".join(sys.argv), "baselines_w4a16": baselines, "results": rows}
    pathlib.Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print_tables(rows)
    return 0


def print_tables(rows):
    drafts = [d for d in DRAFTS if any(r["draft"] == d for r in rows)]
    gammas = sorted({r["gamma"] for r in rows})
    batches = sorted({r["batch_size"] for r in rows})
    print("\nInvariant (greedy QSpec, KV overwrite on) vs greedy W4A16: identical / ties / mismatches")
    print("| draft | " + " | ".join(f"batch {b}" for b in batches) + " |")
    print("|---|" + "---|" * len(batches))
    for draft in drafts:
        cells = []
        for b in batches:
            sel = [r for r in rows if r["draft"] == draft and r["batch_size"] == b and r["kv_overwrite"]]
            if not sel:
                cells.append("not run")
                continue
            ident = sum(r["identical_to_w4a16"] for r in sel)
            total = sum(r["identical_to_w4a16"] + r["exact_logit_ties"] + r["mismatches"] for r in sel)
            cells.append(f"{ident}/{total}, {sum(r['exact_logit_ties'] for r in sel)} ties, "
                         f"{sum(r['mismatches'] for r in sel)} mismatches (γ {min(r['gamma'] for r in sel)}.."
                         f"{max(r['gamma'] for r in sel)})")
        print(f"| {draft} | " + " | ".join(cells) + " |")
    batch = max(batches)
    for overwrite in (True, False):
        sel = [r for r in rows if r["batch_size"] == batch and r["kv_overwrite"] == overwrite]
        if not sel:
            continue
        print(f"\nAcceptance rate (mean accepted per cycle), batch {batch}, KV overwrite {'on' if overwrite else 'off'}")
        print("| draft | " + " | ".join(f"γ={g}" for g in gammas) + " |")
        print("|---|" + "---|" * len(gammas))
        for draft in drafts:
            cells = []
            for g in gammas:
                r = next((r for r in sel if r["draft"] == draft and r["gamma"] == g), None)
                cells.append("—" if r is None else f"{100 * r['acceptance_rate']:.2f}% ({r['mean_accepted_per_cycle']:.2f})")
            print(f"| {draft} | " + " | ".join(cells) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)
    r = sub.add_parser("run")
    r.add_argument("--qspec", default="build/qspec")
    r.add_argument("--model", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--part", choices=["on", "off", "all"], default="all")
    r.add_argument("--problems", help="problems file (default: MODEL/eval_problems.jsonl)")
    r.add_argument("--limit", type=int, default=0, help="first N problems (0: all)")
    r.add_argument("-n", "--max-tokens", type=int, default=160)
    r.add_argument("--chat", action="store_true", help="prompt with the model's chat template")
    r.add_argument("--drafts", help="comma-separated draft modes (default: all seven)")
    r.add_argument("--batches", help="comma-separated batch sizes (instead of --part)")
    r.add_argument("--overwrites", default="on", help="with --batches: on, off or on,off")
    r.add_argument("-j", "--jobs", type=int, default=os.cpu_count())
    r.add_argument("--timeout", type=float, default=None, help="seconds per shard")
    r.add_argument("--reference", help="W4A16 outputs from eval qspec --save-reference")
    r.add_argument("--deadline", type=float, default=None, help="seconds for the whole run")
    r.add_argument("--shard-estimate", type=float, default=150,
                   help="with --deadline: do not start a shard later than this before it")
    m = sub.add_parser("merge")
    m.add_argument("--out", required=True)
    m.add_argument("--json", required=True)
    args = parser.parse_args()
    return run(args) if args.verb == "run" else merge(args)


if __name__ == "__main__":
    sys.exit(main())
