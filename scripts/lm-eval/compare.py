"""Checks an lm-eval run against `qspec serve` (scripts/lm-eval.sh) with qspec's own numbers.

  * the multiple-choice task (--tasks PREFIX: PREFIX_mc, default gsm_synth_mc): every logged loglikelihood equals qspec's own scoring of the same text,
    `qspec eval ppl` (one window, the same mode): nll(context) - nll(context + continuation),
    within --tolerance (1e-3), for the first --docs documents;
  * the generation task (PREFIX_gen): strict and flexible exact match equal `qspec eval gsm`'s on
    the same problems, and the first --gen-docs answers equal `qspec generate`'s greedy text of the
    same prompt (cut at the task's stop string).

Exits 1 on any difference.

    python scripts/lm-eval/compare.py --qspec build/qspec --model models/gsm-synth-llama \
        --mode w4a16 --lm-eval-dir OUT/lm-eval --eval-gsm OUT/eval-gsm.json
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

STOP = "\nQuestion:"  # the generation tasks' until (scripts/lm-eval/gsm_synth_gen.yaml)


def nll(args, text, cache={}):
    """`qspec eval ppl`'s summed negative log-likelihood of text (every token after the first)."""
    if text not in cache:
        with tempfile.TemporaryDirectory() as tmp:
            data, out = os.path.join(tmp, "text.txt"), os.path.join(tmp, "ppl.json")
            with open(data, "w") as f:
                f.write(text)
            subprocess.run([args.qspec, "eval", "ppl", args.model, "--data", data, "--modes", args.mode,
                            "--context", str(args.context), "-o", out], check=True, capture_output=True)
            with open(out) as f:
                result = json.load(f)["results"][0]
        assert result["windows"] == 1, result
        cache[text] = result["nll_sum"]
    return cache[text]


def latest(pattern):
    files = sorted(glob.glob(pattern))
    if not files:
        sys.exit(f"compare: nothing matches {pattern}")
    return files[-1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--qspec", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--mode", default="w4a16")
    parser.add_argument("--context", type=int, default=1024, help="eval ppl's window (>= every text)")
    parser.add_argument("--lm-eval-dir", required=True, help="lm-eval's --output_path")
    parser.add_argument("--eval-gsm", required=True, help="`qspec eval gsm -o` report of the same problems")
    parser.add_argument("--tasks", default="gsm_synth", help="the tasks' prefix: PREFIX_mc and PREFIX_gen")
    parser.add_argument("--docs", type=int, default=50, help="multiple-choice documents to rescore")
    parser.add_argument("--gen-docs", type=int, default=5, help="generated answers to compare with qspec generate")
    parser.add_argument("--max-gen-toks", type=int, default=160, help="the generation task's max_gen_toks")
    parser.add_argument("--tolerance", type=float, default=1e-3)
    args = parser.parse_args()
    ok = True

    worst, pairs = 0.0, 0
    with open(latest(os.path.join(args.lm_eval_dir, "*", f"samples_{args.tasks}_mc_*.jsonl"))) as f:
        samples = [json.loads(line) for line in f][: args.docs]
    for sample in samples:
        for argument, response in zip(sample["arguments"].values(), sample["resps"]):
            context, continuation = argument["arg_0"], argument["arg_1"]
            served = float(response[0][0])
            own = nll(args, context) - nll(args, context + continuation)
            worst = max(worst, abs(served - own))
            pairs += 1
            if abs(served - own) > args.tolerance:
                ok = False
                print(f"MISMATCH doc {sample['doc_id']} {continuation!r}: lm-eval {served:.6f}, qspec {own:.6f}")
    print(f"{args.tasks}_mc: {pairs} loglikelihoods of {len(samples)} documents; largest |lm-eval - qspec eval ppl| "
          f"= {worst:.2e} (tolerance {args.tolerance:g})")

    same_text = 0
    with open(latest(os.path.join(args.lm_eval_dir, "*", f"samples_{args.tasks}_gen_*.jsonl"))) as f:
        generations = [json.loads(line) for line in f][: args.gen_docs]
    for sample in generations:
        prompt = sample["arguments"]["gen_args_0"]["arg_0"]
        served = sample["resps"][0][0]
        out = subprocess.run([args.qspec, "generate", args.model, "--mode", args.mode, "-n", str(args.max_gen_toks),
                              "-p", prompt], check=True, capture_output=True, text=True).stdout
        assert out.startswith(prompt) and out.endswith("\n"), out[:200]
        own = out[len(prompt):-1].split(STOP)[0]
        if own == served:
            same_text += 1
        else:
            ok = False
            print(f"MISMATCH generation doc {sample['doc_id']}: lm-eval {served[:80]!r}, qspec generate {own[:80]!r}")
    print(f"{args.tasks}_gen: {same_text}/{len(generations)} answers equal `qspec generate`'s greedy text")

    with open(latest(os.path.join(args.lm_eval_dir, "*", "results_*.json"))) as f:
        results = json.load(f)["results"]
    generated = results[f"{args.tasks}_gen"]
    with open(args.eval_gsm) as f:
        report = json.load(f)
    row = next(r for r in report["results"] if r["mode"] == args.mode)
    problems = row["problems"]
    for name, key, field in (("strict", "exact_match,strict-match", "solved"),
                             ("flexible", "exact_match,flexible-extract", "solved_flexible")):
        theirs = round(generated[key] * generated["sample_len"])
        ours = row[field]
        same = theirs == ours and generated["sample_len"] == problems
        ok = ok and same
        print(f"{args.tasks}_gen {name}: lm-eval {theirs}/{generated['sample_len']}, qspec eval gsm {ours}/{problems}"
              f" {'(equal)' if same else 'DIFFERENT'}")
    mc = results[f"{args.tasks}_mc"]
    print(f"{args.tasks}_mc: acc {mc['acc,none']:.4f}, acc_norm {mc['acc_norm,none']:.4f} ({mc['sample_len']} documents)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
