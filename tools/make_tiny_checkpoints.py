#!/usr/bin/env python3
"""Tiny randomly initialised checkpoints for architectures without real weights here, with
fp32 logits from transformers as goldens.

Run where PyTorch + transformers are installed (the GPU machine has both):
    python3 tools/make_tiny_checkpoints.py tests/data/tiny
Each OUT/<name>/ gets config.json, model.safetensors (in the listed dtype) and golden.json
({"prompts": [[ids...]], "logits": [[[vocab floats] per position] per prompt]}). The logits
come from the saved weights upcast to float32 (eager attention), so a float32 engine should
match them to ~1e-5 relative.
"""
import json
import os
import sys

import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
              max_position_embeddings=128, bos_token_id=1, eos_token_id=2)

V5 = int(transformers.__version__.split(".")[0]) >= 5

def rope(theta, scaling=None):
    """RoPE keys in the spelling of the installed transformers (v5: rope_parameters)."""
    if V5:
        params = {"rope_type": "default", "rope_theta": theta}
        params.update(scaling or {})
        return {"rope_parameters": params}
    return {"rope_theta": theta, **({"rope_scaling": scaling} if scaling else {})}

def variants():
    yield ("llama3-rope", torch.float32, LlamaForCausalLM, LlamaConfig(
        **COMMON, head_dim=16, tie_word_embeddings=False,
        **rope(500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 32})))
    yield ("llama-yarn", torch.float32, LlamaForCausalLM, LlamaConfig(
        **COMMON, head_dim=16, **rope(10000.0, {"rope_type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 32})))
    yield ("llama-linear-bias", torch.bfloat16, LlamaForCausalLM, LlamaConfig(
        **COMMON, attention_bias=True, mlp_bias=True,
        **rope(10000.0, {"rope_type": "linear", "factor": 2.0})))
    yield ("qwen2-tied", torch.bfloat16, Qwen2ForCausalLM, Qwen2Config(
        **COMMON, tie_word_embeddings=True, use_sliding_window=False, **rope(1000000.0)))
    yield ("mistral-swa", torch.float16, MistralForCausalLM, MistralConfig(
        **COMMON, head_dim=16, sliding_window=8, **rope(10000.0)))

def main(out_root):
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, COMMON["vocab_size"], (n,), generator=generator).tolist()
               for n in (1, 7, 29)]
    for name, dtype, model_class, config in variants():
        config._attn_implementation = "eager"
        model = model_class(config)
        # Larger-than-default init so the logits are far from uniform and errors show.
        with torch.no_grad():
            for param_name, param in model.named_parameters():
                if param_name.endswith("norm.weight"):
                    param.uniform_(0.5, 1.5)
                elif param_name.endswith("bias"):
                    param.normal_(0.0, 0.1)
                else:
                    param.normal_(0.0, 0.08)
        out_dir = os.path.join(out_root, name)
        model.to(dtype).save_pretrained(out_dir, safe_serialization=True)
        reloaded = model_class.from_pretrained(out_dir, dtype=torch.float32,
                                               attn_implementation="eager").eval()
        logits = []
        with torch.no_grad():
            for prompt in prompts:
                result = reloaded(torch.tensor([prompt]), use_cache=False).logits[0]
                logits.append(result.float().tolist())
        with open(os.path.join(out_dir, "golden.json"), "w") as f:
            json.dump({"generator": f"transformers {transformers.__version__}, torch {torch.__version__}",
                       "dtype": str(dtype), "prompts": prompts, "logits": logits}, f)
        print(name, dtype, "->", out_dir)

if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/tiny")
