#!/usr/bin/env python3
"""Float64 reference logits for the bundled gsm-synth-llama checkpoint (numpy only).

golden_fp32.json was made by PyTorch; its last-position logits differ from an exact
evaluation of the same bf16 weights by up to ~7.5e-3 absolute (1.3e-2 relative on small
logits), more than fp32 rounding explains. This script evaluates the model in float64 with
plain numpy, independently of qspec and of PyTorch, so the C++ engine can be held to a
tight bound (its f32 result must be within 1e-4 of the logit scale).

    pip install numpy
    python3 tools/make_gsm_reference_logits.py models/gsm-synth-llama tests/data/gsm/reference_logits_f64.json

Writes, for each of the 16 golden prompts, its ids and all last-position logits.
"""
import glob
import json
import struct
import sys

import numpy as np


def load_bf16_safetensors(model_dir):
    weights = {}
    for path in sorted(glob.glob(model_dir + "/*.safetensors")):
        blob = open(path, "rb").read()
        header_len = struct.unpack("<Q", blob[:8])[0]
        header = json.loads(blob[8:8 + header_len])
        base = 8 + header_len
        for name, info in header.items():
            if name == "__metadata__":
                continue
            assert info["dtype"] == "BF16", (path, name, info["dtype"])
            begin, end = info["data_offsets"]
            raw = np.frombuffer(blob[base + begin:base + end], dtype=np.uint16)
            values = (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
            weights[name] = values.reshape(info["shape"])
    return weights


def main(model_dir, out_path):
    cfg = json.load(open(model_dir + "/config.json"))
    assert cfg.get("rope_parameters", {}).get("rope_type", "default") == "default"
    theta = cfg.get("rope_parameters", {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
    weights = load_bf16_safetensors(model_dir)
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim, eps = cfg["head_dim"], cfg["rms_norm_eps"]
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2) / head_dim))

    def rmsnorm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def rope(x):
        angles = np.arange(x.shape[0])[:, None] * inv_freq[None, :]
        cos = np.concatenate([np.cos(angles)] * 2, -1)[:, None, :]
        sin = np.concatenate([np.sin(angles)] * 2, -1)[:, None, :]
        half = head_dim // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
        return x * cos + rotated * sin

    def last_logits(ids):
        tokens = len(ids)
        x = weights["model.embed_tokens.weight"][ids]
        for layer in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            h = rmsnorm(x, weights[p + "input_layernorm.weight"])
            q = rope((h @ weights[p + "self_attn.q_proj.weight"].T).reshape(tokens, heads, head_dim))
            k = rope((h @ weights[p + "self_attn.k_proj.weight"].T).reshape(tokens, kv_heads, head_dim))
            v = (h @ weights[p + "self_attn.v_proj.weight"].T).reshape(tokens, kv_heads, head_dim)
            k = np.repeat(k, heads // kv_heads, 1)
            v = np.repeat(v, heads // kv_heads, 1)
            scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(head_dim)
            scores = scores + np.triu(np.full((tokens, tokens), -np.inf), 1)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            attn = np.einsum("hts,shd->thd", probs, v).reshape(tokens, heads * head_dim)
            x = x + attn @ weights[p + "self_attn.o_proj.weight"].T
            h = rmsnorm(x, weights[p + "post_attention_layernorm.weight"])
            gate = h @ weights[p + "mlp.gate_proj.weight"].T
            up = h @ weights[p + "mlp.up_proj.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ weights[p + "mlp.down_proj.weight"].T
        x = rmsnorm(x, weights["model.norm.weight"])
        return x[-1] @ weights["lm_head.weight"].T

    goldens = json.load(open(model_dir + "/golden_fp32.json"))
    out = []
    for golden in goldens:
        logits = last_logits(golden["prompt_ids"])
        gap = np.abs(logits[golden["last_logits_top5_ids"]] - np.array(golden["last_logits_top5"]))
        print(f"{len(golden['prompt_ids'])} tokens: golden_fp32 top-5 vs float64 max abs diff {gap.max():.2e}")
        out.append({"prompt_ids": golden["prompt_ids"], "last_logits": [float(v) for v in logits]})
    with open(out_path, "w") as f:
        json.dump({"source": "tools/make_gsm_reference_logits.py (numpy float64)", "prompts": out}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
