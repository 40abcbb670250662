#!/usr/bin/env python3
"""The summary of a scripts/gpu-vs-peers.sh folder: decode tokens/s per batch of qspec W4A16 (its
two runs, first and last, and their mean), llama.cpp CUDA Q4_0 (llama-batched-bench's S_TG),
PyTorch tinygemm W4A16 and PyTorch bf16 (peer_decode.py), qspec's ratio to each; prefill of one
512-token prompt (qspec's TTFT against llama-bench's pp512). Prints JSON.

    python3 scripts/gpu-vs-peers-summary.py OUT_DIR > RECORD.json
"""
import glob
import json
import re
import statistics
import sys

folder = sys.argv[1]


def qspec_run(name):
    path = glob.glob(f"{folder}/qspec-{name}/*.json")[0]
    record = json.load(open(path))
    decode = {row["batch"]: row for row in record["modes"]["w4a16"]["decode"]}
    prefill = {row["prompt_tokens"]: row for row in record["modes"]["w4a16"].get("ttft", [])}
    return record, decode, prefill


runs = {name: qspec_run(name) for name in ("a", "b")}
record_a = runs["a"][0]
batches = sorted(runs["a"][1])
# A plain step (step_ms: one graph replay a step, the host waiting on each), not the chained one the
# engine runs (a little faster): the conservative figure.
tok_s = lambda row: row["tokens_per_second"]

pytorch = {}
for line in open(f"{folder}/pytorch.jsonl"):
    if line.startswith("{"):
        row = json.loads(line)
        pytorch[(row["mode"], row["batch"])] = row["tok_s"]

llamacpp = {}
for line in open(f"{folder}/llamacpp-batched.log"):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 10 and cells[0].isdigit():
        llamacpp[int(cells[2])] = float(cells[7])  # B -> S_TG t/s
pp = tg = None
for line in open(f"{folder}/llamacpp-bench.md"):
    m = re.search(r"\|\s*(pp|tg)(\d+)\s*\|\s*([\d.]+) ± ([\d.]+)\s*\|", line)
    if m:
        if m.group(1) == "pp":
            pp = float(m.group(3))
        else:
            tg = float(m.group(3))

rows = []
for b in batches:
    qa, qb = tok_s(runs["a"][1][b]), tok_s(runs["b"][1][b])
    q = statistics.mean([qa, qb])
    row = {"batch": b, "qspec_w4a16_tok_s": round(q, 1), "qspec_runs_tok_s": [round(qa, 1), round(qb, 1)],
           "qspec_roofline_fraction": round(runs["b"][1][b]["roofline_fraction"], 3)}
    for key, value in (("llamacpp_q4_0_tok_s", llamacpp.get(b)), ("pytorch_tinygemm_w4a16_tok_s", pytorch.get(("w4a16", b))),
                       ("pytorch_bf16_tok_s", pytorch.get(("bf16", b)))):
        row[key] = value
        if value:
            row["x_" + key.replace("_tok_s", "")] = round(q / value, 2)
    rows.append(row)
prefill = runs["b"][2].get(512)
summary = {
    "benchmark": "gpu-vs-peers", "gpu": record_a.get("gpu"), "commit": record_a.get("commit"), "model": "llama3-8b (random weights)",
    "context": 512, "qspec_command": record_a.get("command"),
    "peers": {"llama.cpp": "llama-batched-bench -npp 512 -ntg 128 -npl 1,8,16,32,64 -ngl 99 -fa on (S_TG), llama-bench -p 512 -n 128 -fa 1 -r 3, CUDA Q4_0 GGUF with an f16 output layer (gen_random_gguf.py)",
              "pytorch": "peer_decode.py llama3-8b 512 1,8,16,32,64 bf16,w4a16 (CUDA graphs; tinygemm group 128)"},
    "decode": rows,
    "llamacpp_tg128_tok_s": tg,
    "prefill_512": {"qspec_tok_s": round(512 * 1000.0 / prefill["ttft_ms"], 1) if prefill and "ttft_ms" in prefill else None,
                    "llamacpp_pp512_tok_s": pp},
}
if summary["prefill_512"]["qspec_tok_s"] and pp:
    summary["prefill_512"]["x_llamacpp"] = round(summary["prefill_512"]["qspec_tok_s"] / pp, 2)
json.dump(summary, sys.stdout, indent=1)
print()
