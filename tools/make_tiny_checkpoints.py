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
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

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

def gemma3_rope(global_theta, local_theta, scaling=None):
    """Gemma 3's two RoPEs: v5 nests them per layer type, v4 has rope_local_base_freq."""
    if V5:
        full = {"rope_type": "default", "rope_theta": global_theta}
        full.update(scaling or {})
        return {"rope_parameters": {"full_attention": full,
                                    "sliding_attention": {"rope_type": "default",
                                                          "rope_theta": local_theta}}}
    return {"rope_theta": global_theta, "rope_local_base_freq": local_theta,
            **({"rope_scaling": scaling} if scaling else {})}

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
    # Qwen3: per-head q/k RMSNorm, head_dim 24 != hidden / heads (16), tied embeddings.
    yield ("qwen3-qknorm", torch.bfloat16, Qwen3ForCausalLM, Qwen3Config(
        **COMMON, head_dim=24, tie_word_embeddings=True, use_sliding_window=False,
        **rope(1000000.0)))
    # Gemma 3: 5 layers, sliding (window 8, shorter than the 29-token prompt) except layer 2
    # (layer_types), linear RoPE scaling on the global layer only, query_pre_attn_scalar 20
    # (!= head_dim 32), final logit soft-capping, tied embeddings. float32, so the embedding
    # scale sqrt(hidden) is the same float32 value in transformers and qspec.
    gemma_common = {**COMMON, "num_hidden_layers": 5}
    yield ("gemma3-swa", torch.float32, Gemma3ForCausalLM, Gemma3TextConfig(
        **gemma_common, head_dim=32, sliding_window=8, query_pre_attn_scalar=20,
        final_logit_softcapping=30.0, attn_logit_softcapping=None, tie_word_embeddings=True,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention", "sliding_attention"],
        hidden_activation="gelu_pytorch_tanh",
        **gemma3_rope(1000000.0, 10000.0, {"rope_type": "linear", "factor": 4.0})))
    # Gemma 3 at head_dim 256 (Gemma 3 270M's heads: 4 query heads on 1 KV head,
    # query_pre_attn_scalar = head_dim, no RoPE scaling), the width of the GPU's widest attention
    # kernels: a sliding layer (window 8) then a full one, bf16 weights (~0.8 MB).
    yield ("gemma3-hd256", torch.bfloat16, Gemma3ForCausalLM, Gemma3TextConfig(
        **{**COMMON, "num_hidden_layers": 2, "num_key_value_heads": 1}, head_dim=256,
        sliding_window=8, query_pre_attn_scalar=256, final_logit_softcapping=30.0,
        attn_logit_softcapping=None, tie_word_embeddings=True,
        layer_types=["sliding_attention", "full_attention"], hidden_activation="gelu_pytorch_tanh",
        **gemma3_rope(1000000.0, 10000.0)))

def main(out_root, only=None):
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, COMMON["vocab_size"], (n,), generator=generator).tolist()
               for n in (1, 7, 29)]
    for name, dtype, model_class, config in variants():
        if only and name not in only:
            continue
        config._attn_implementation = "eager"
        model = model_class(config)
        # Larger-than-default init so the logits are far from uniform and errors show.
        with torch.no_grad():
            for param_name, param in model.named_parameters():
                if param_name.endswith("norm.weight") and "Gemma" in model_class.__name__:
                    param.uniform_(-0.5, 0.5)  # Gemma multiplies by (1 + w)
                elif param_name.endswith("norm.weight"):
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
    # python3 tools/make_tiny_checkpoints.py [OUT [NAME ...]]: NAMEs remake only those variants.
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/tiny", set(sys.argv[2:]))
