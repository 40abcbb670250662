#!/usr/bin/env python3
"""Small GGUF fixtures for tests/unit/test_gguf.cpp, with reference values from the `gguf`
package (llama.cpp's own Python reader/writer), so the C++ importer is checked against an
independent implementation bit for bit.

    pip install gguf numpy safetensors
    python3 tools/make_gguf_fixtures.py tests/data/gguf

Writes into OUT:
  quant-types.gguf                  one [2, 256] tensor per ggml type the importer supports
                                    (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)
  quant-types.expected.safetensors  their values dequantized by gguf.quants.dequantize (F32)
  tiny-llama.gguf                   a 2-layer llama (dim 32, 4 heads, 2 kv heads) with mixed
                                    tensor types and a byte-level BPE (gpt2, pre "smollm")
                                    tokenizer; q/k rows permuted as convert_hf_to_gguf does
  tiny-llama.expected.safetensors   the Hugging Face tensors the importer must produce: the
                                    dequantized GGUF tensors with the q/k permutation undone

Types the package cannot quantize (Q4_K, Q6_K) are written as random blocks whose f16 scales
are set to sane finite values; the package's dequantize is the reference for them too.
Everything is seeded, so reruns reproduce the same bytes.
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize
from safetensors.numpy import save_file

RNG = np.random.default_rng(1234)


def random_k_blocks(qtype, rows, cols):
    """Random raw blocks of a K-quant type with finite, moderate f16 scales."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // block_size
    raw = RNG.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    if qtype == T.Q4_K:  # d, dmin, scales[12], qs[128]
        d = RNG.uniform(-0.02, 0.02, n_blocks).astype(np.float16)
        dmin = RNG.uniform(0.0, 0.02, n_blocks).astype(np.float16)
        raw[:, 0:2] = d.view(np.uint8).reshape(n_blocks, 2)
        raw[:, 2:4] = dmin.view(np.uint8).reshape(n_blocks, 2)
    elif qtype == T.Q6_K:  # ql[128], qh[64], scales[16], d
        d = RNG.uniform(-0.002, 0.002, n_blocks).astype(np.float16)
        raw[:, 208:210] = d.view(np.uint8).reshape(n_blocks, 2)
    else:
        raise ValueError(qtype)
    return raw.reshape(rows, cols // block_size * type_size)


def encode(values, qtype):
    """(raw array for GGUFWriter.add_tensor, raw_dtype or None, dequantized float32 reference)."""
    if qtype == T.F32:
        data = values.astype(np.float32)
        return data, None, data.copy()
    if qtype == T.F16:
        data = values.astype(np.float16)
        return data, None, data.astype(np.float32)
    rows, cols = values.shape
    if qtype in (T.Q4_K, T.Q6_K):
        raw = random_k_blocks(qtype, rows, cols)
    else:
        raw = quantize(values.astype(np.float32), qtype)
    reference = dequantize(raw, qtype).astype(np.float32).reshape(rows, cols)
    return raw, qtype, reference


def add(writer, name, values, qtype):
    data, raw_dtype, reference = encode(values, qtype)
    if raw_dtype is None:
        writer.add_tensor(name, data)
    else:
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    return reference


def finish(writer):
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def quant_types(out):
    writer = gguf.GGUFWriter(os.path.join(out, "quant-types.gguf"), arch="test")
    expected = {}
    for qtype in (T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q6_K):
        values = RNG.standard_normal((2, 256)).astype(np.float32)
        if qtype == T.F16:  # exercise subnormals, signed zero and the largest half
            values[0, :6] = [0.0, -0.0, 6e-8, -3e-5, 65504.0, 1e-3]
        if qtype == T.BF16:
            values[0, :3] = [0.0, -0.0, 1e-30]
        name = qtype.name.lower()
        expected[name] = add(writer, name, values, qtype)
    finish(writer)
    save_file(expected, os.path.join(out, "quant-types.expected.safetensors"))


def bytes_to_unicode():
    """GPT-2's byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def permute(w, n_head):
    """convert_hf_to_gguf's LlamaModel.permute (rotate_half layout -> interleaved)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head):
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_llama(out):
    dim, ffn, layers, heads, kv_heads = 32, 64, 2, 4, 2
    head_dim = dim // heads

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    alphabet = bytes_to_unicode()
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    tokens = specials + alphabet + ["Ġt", "he", "Ġthe", "in", "Ġa", "<tool>"]
    types = [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (len(tokens) - 4) + \
        [gguf.TokenType.USER_DEFINED]
    vocab = len(tokens)

    writer = gguf.GGUFWriter(os.path.join(out, "tiny-llama.gguf"), arch="llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(256)
    writer.add_embedding_length(dim)
    writer.add_feed_forward_length(ffn)
    writer.add_block_count(layers)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(100000.0)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")

    def w(*shape, scale=0.2):
        return (RNG.standard_normal(shape) * scale).astype(np.float32)

    expected = {}
    expected["model.embed_tokens.weight"] = add(writer, "token_embd.weight", w(vocab, dim), T.Q8_0)
    plan = [
        dict(q=T.Q4_0, k=T.Q4_1, v=T.F16, o=T.BF16, gate=T.Q8_0, up=T.F32, down=T.Q4_0),
        dict(q=T.BF16, k=T.Q8_0, v=T.Q4_1, o=T.F16, gate=T.Q4_1, up=T.BF16, down=T.Q8_0),
    ]
    for layer, types_of in enumerate(plan):
        g, h = f"blk.{layer}.", f"model.layers.{layer}."
        expected[h + "input_layernorm.weight"] = add(writer, g + "attn_norm.weight", 1 + w(dim), T.F32)
        q = w(heads * head_dim, dim)
        k = w(kv_heads * head_dim, dim)
        expected[h + "self_attn.q_proj.weight"] = unpermute(
            add(writer, g + "attn_q.weight", permute(q, heads), types_of["q"]), heads)
        expected[h + "self_attn.k_proj.weight"] = unpermute(
            add(writer, g + "attn_k.weight", permute(k, kv_heads), types_of["k"]), kv_heads)
        expected[h + "self_attn.v_proj.weight"] = add(writer, g + "attn_v.weight", w(kv_heads * head_dim, dim), types_of["v"])
        expected[h + "self_attn.o_proj.weight"] = add(writer, g + "attn_output.weight", w(dim, dim), types_of["o"])
        expected[h + "post_attention_layernorm.weight"] = add(writer, g + "ffn_norm.weight", 1 + w(dim), T.F32)
        expected[h + "mlp.gate_proj.weight"] = add(writer, g + "ffn_gate.weight", w(ffn, dim), types_of["gate"])
        expected[h + "mlp.up_proj.weight"] = add(writer, g + "ffn_up.weight", w(ffn, dim), types_of["up"])
        expected[h + "mlp.down_proj.weight"] = add(writer, g + "ffn_down.weight", w(dim, ffn), types_of["down"])
    expected["model.norm.weight"] = add(writer, "output_norm.weight", 1 + w(dim), T.F32)
    expected["lm_head.weight"] = add(writer, "output.weight", w(vocab, dim), T.F16)
    finish(writer)
    save_file({k: np.ascontiguousarray(v) for k, v in expected.items()},
              os.path.join(out, "tiny-llama.expected.safetensors"))


def main(out):
    os.makedirs(out, exist_ok=True)
    quant_types(out)
    tiny_llama(out)
    for name in sorted(os.listdir(out)):
        print(f"{os.path.getsize(os.path.join(out, name)):8d}  {name}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/gguf")
