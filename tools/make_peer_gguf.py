#!/usr/bin/env python3
"""Writes a small Hugging Face Llama checkpoint (safetensors, BF16/F16/F32, byte-level BPE
tokenizer) as a GGUF of llama.cpp's usual Q4_1 layout, for the side-by-side CPU benchmark against
llama.cpp (scripts/cpu-vs-llamacpp.sh) on a model that has no published GGUF (the bundled
gsm-synth-llama): the seven projections Q4_1, the embedding and output matrices Q8_0, norms F32;
q/k permuted to llama.cpp's RoPE layout as its convert_hf_to_gguf.py does. qspec then reads the
same blocks with `qspec convert gguf OUT.gguf DIR --keep-4bit`, so both engines run one set of
weights.

    python3 tools/make_peer_gguf.py GGUF_PY_DIR MODEL_DIR OUT.gguf

GGUF_PY_DIR is the gguf-py folder of llama.cpp's source (the tree of
../shared/peers/make-llamacpp-tree.sh has it at lc/gguf-py); numpy is needed.
"""
import json
import os
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def read_safetensors(path):
    """name -> float32 array, for every tensor of one .safetensors file."""
    with open(path, "rb") as f:
        (header_size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_size))
        base = 8 + header_size
        tensors = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info["dtype"] not in DTYPES:
                sys.exit(f"{path}: tensor {name} has dtype {info['dtype']} (BF16, F16 or F32 expected)")
            begin, end = info["data_offsets"]
            f.seek(base + begin)
            raw = np.frombuffer(f.read(end - begin), dtype=DTYPES[info["dtype"]])
            if info["dtype"] == "BF16":
                raw = (raw.astype(np.uint32) << 16).view(np.float32)
            tensors[name] = raw.astype(np.float32).reshape(info["shape"])
    return tensors


def read_checkpoint(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    tensors = {}
    for shard in shards:
        tensors.update(read_safetensors(os.path.join(model_dir, shard)))
    return tensors


def permute(w, heads, heads_kv):
    """HF's rotate-half q/k rows to llama.cpp's interleaved RoPE (convert_hf_to_gguf's permute)."""
    if heads_kv is not None and heads != heads_kv:
        heads = heads_kv
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    gguf_py, model_dir, out = sys.argv[1:]
    sys.path.insert(0, gguf_py)
    import gguf  # noqa: E402  (llama.cpp's gguf-py, from the path given)

    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    if config.get("model_type") != "llama":
        sys.exit(f"{model_dir}/config.json: model_type {config.get('model_type')!r} (only llama is written)")
    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        tokenizer = json.load(f)
    if tokenizer["model"]["type"] != "BPE":
        sys.exit(f"{model_dir}/tokenizer.json: a {tokenizer['model']['type']} tokenizer (byte-level BPE expected)")
    tensors = read_checkpoint(model_dir)
    heads, heads_kv = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim", hidden // heads)
    rope = config.get("rope_parameters", {}).get("rope_theta", config.get("rope_theta", 10000.0))

    writer = gguf.GGUFWriter(out, "llama")
    writer.add_name(os.path.basename(os.path.normpath(model_dir)))
    writer.add_block_count(layers)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    # The tokenizer: tokens by id, merges, special tokens typed as control.
    vocab = tokenizer["model"]["vocab"]
    tokens = [""] * len(vocab)
    for token, i in vocab.items():
        tokens[i] = token
    special = {t["id"] for t in tokenizer.get("added_tokens", []) if t.get("special")}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"].get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(len(tokens))])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(config.get("bos_token_id", 0))
    writer.add_eos_token_id(config.get("eos_token_id", 0))

    def add(name, array, qtype):
        data = gguf.quants.quantize(array, qtype) if qtype != gguf.GGMLQuantizationType.F32 else array
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)

    Q4_1, Q8_0, F32 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F32
    add("token_embd.weight", tensors["model.embed_tokens.weight"], Q8_0)
    for l in range(layers):
        p = f"model.layers.{l}."
        add(f"blk.{l}.attn_norm.weight", tensors[p + "input_layernorm.weight"], F32)
        add(f"blk.{l}.attn_q.weight", permute(tensors[p + "self_attn.q_proj.weight"], heads, heads), Q4_1)
        add(f"blk.{l}.attn_k.weight", permute(tensors[p + "self_attn.k_proj.weight"], heads, heads_kv), Q4_1)
        add(f"blk.{l}.attn_v.weight", tensors[p + "self_attn.v_proj.weight"], Q4_1)
        add(f"blk.{l}.attn_output.weight", tensors[p + "self_attn.o_proj.weight"], Q4_1)
        add(f"blk.{l}.ffn_norm.weight", tensors[p + "post_attention_layernorm.weight"], F32)
        add(f"blk.{l}.ffn_gate.weight", tensors[p + "mlp.gate_proj.weight"], Q4_1)
        add(f"blk.{l}.ffn_up.weight", tensors[p + "mlp.up_proj.weight"], Q4_1)
        add(f"blk.{l}.ffn_down.weight", tensors[p + "mlp.down_proj.weight"], Q4_1)
    add("output_norm.weight", tensors["model.norm.weight"], F32)
    if not config.get("tie_word_embeddings", False):
        add("output.weight", tensors["lm_head.weight"], Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
