// Importers that turn other formats into a Hugging Face style directory (config.json,
// model.safetensors, tokenizer.json, tokenizer_config.json, generation_config.json), so
// every model runs through the same loading path.
#pragma once
#include <functional>
#include <string>

namespace qspec {

// Progress callback: (done, total) units of work; may be empty.
using ProgressFn = std::function<void(size_t done, size_t total)>;

// llama2.c checkpoint (legacy v0 format, as stories260K.bin) + its tokenizer.bin. Weights
// are stored F32, wq/wk rows permuted from llama2.c's interleaved RoPE pairs to the
// rotate_half layout; the tokenizer becomes a sentencepiece-style BPE tokenizer.json.
void convert_llama2c(const std::string& model_bin, const std::string& tokenizer_bin,
                     const std::string& out_dir, const ProgressFn& progress = {});

// GGUF v3 or v2 (llama or gemma3 architecture): tensors dequantized exactly as llama.cpp
// defines the types (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K) and stored as F32,
// which holds every dequantized value exactly (BF16 would round them); llama q/k rows permuted
// back to the rotate_half layout; Gemma 3 norms shifted back from llama.cpp's 1 + w to w;
// tokenizer metadata turned into tokenizer.json. Errors (qspec::Error)
// name the file and the key, tensor, type or architecture at fault.
//
// With keep_4bit, the seven projections of every layer (Q4_0, Q4_1 or Q4_K) are not dequantized:
// their blocks become the engine's int4-asym weights, group 32 (gguf_to_int4_asym), and OUT_DIR is
// a qspec 4-bit checkpoint (model/quant_checkpoint.h, method "gguf") whose W4A16 weights equal
// ggml's dequantization bit for bit. The other tensors are stored F32 as above. A projection of
// a 5-, 6- or 8-bit type (the Q5_0 / Q6_K / Q8_0 tensors a Q4_K_M file mixes in) is kept exactly
// too, as int8-group weights (gguf_to_int8_group; the manifest's "tensor_formats"), so the
// checkpoint runs at the quality llama.cpp runs the file; with all_4bit it is instead
// dequantized and re-quantized into the same int4-asym g32 format on the grids of least squared
// error (quant::BlockFit::mse), one 4-bit format for every projection (what the GPU kernels
// take today). Projections of any other type are re-quantized so either way. The manifest counts
// the projections kept and re-quantized per ggml type.
struct GgufConvertOptions {
  bool keep_4bit = false;
  bool all_4bit = false;  // keep_4bit only: no int8-group tensors
};
void convert_gguf(const std::string& gguf_path, const std::string& out_dir,
                  const ProgressFn& progress = {}, const GgufConvertOptions& options = {});

}  // namespace qspec
