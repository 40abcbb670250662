#!/usr/bin/env python3
"""Writes bench/workloads.json: prompt and output lengths (in tokens) of the first requests of
GSM8K, HumanEval, MBPP and MT-Bench, the datasets of the QSpec paper's Tables 4 and 6, for
`qspec bench --device cuda --workloads ...` (synthetic full-size models have no tokenizer, so the
lengths are what a Llama-3-class BPE gives English and code: about 4 characters a token).
Only lengths leave the datasets (no text). Sources and licences are recorded in the file.

usage: tools/make_workloads.py DATA_DIR [OUT] [--requests N]
  DATA_DIR holds gsm8k_test.jsonl, HumanEval.jsonl, mbpp.jsonl, mt_bench_question.jsonl
"""
import argparse
import json
import math
import os

CHARS_PER_TOKEN = 4.0
MT_BENCH_OUTPUT_TOKENS = 256  # MT-Bench has no reference answers: a typical chat reply length


def tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir")
    parser.add_argument("out", nargs="?", default="bench/workloads.json")
    parser.add_argument("--requests", type=int, default=256)
    args = parser.parse_args()
    n = args.requests
    d = args.data_dir
    workloads = {}
    gsm = read_jsonl(os.path.join(d, "gsm8k_test.jsonl"))[:n]
    workloads["gsm8k"] = {
        "source": "GSM8K test split (openai/grade-school-math), MIT licence",
        "prompt": "'Question: {question}\\nAnswer:'", "output": "the reference solution",
        "requests": [[tokens("Question: " + r["question"] + "\nAnswer:"), tokens(r["answer"])] for r in gsm]}
    humaneval = read_jsonl(os.path.join(d, "HumanEval.jsonl"))[:n]
    workloads["humaneval"] = {
        "source": "HumanEval (openai/human-eval), MIT licence",
        "prompt": "the function signature and docstring", "output": "the canonical solution",
        "requests": [[tokens(r["prompt"]), tokens(r["canonical_solution"])] for r in humaneval]}
    mbpp = read_jsonl(os.path.join(d, "mbpp.jsonl"))[:n]
    workloads["mbpp"] = {
        "source": "MBPP (google-research/mbpp), CC BY 4.0",
        "prompt": "the task text and its three tests", "output": "the reference code",
        "requests": [[tokens(r["text"] + "\n" + "\n".join(r["test_list"])), tokens(r["code"])] for r in mbpp]}
    mt = read_jsonl(os.path.join(d, "mt_bench_question.jsonl"))[:n]
    workloads["mt-bench"] = {
        "source": "MT-Bench questions (lm-sys/FastChat), Apache-2.0",
        "prompt": "the first turn", "output": f"{MT_BENCH_OUTPUT_TOKENS} tokens (no reference answers)",
        "requests": [[tokens(r["turns"][0]), MT_BENCH_OUTPUT_TOKENS] for r in mt]}
    out = {"generator": "tools/make_workloads.py", "chars_per_token": CHARS_PER_TOKEN, "workloads": workloads}
    with open(args.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    for name, w in workloads.items():
        p = [r[0] for r in w["requests"]]
        o = [r[1] for r in w["requests"]]
        print(f"{name:10s} {len(p):4d} requests, prompt mean {sum(p) / len(p):6.1f} max {max(p):5d}, "
              f"output mean {sum(o) / len(o):6.1f} max {max(o):5d} tokens")


if __name__ == "__main__":
    main()
