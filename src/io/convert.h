// Importers that turn other formats into a Hugging Face style directory (config.json,
// model.safetensors, tokenizer.json, tokenizer_config.json, generation_config.json), so
// every model runs through the same loading path.
#pragma once
#include <functional>
#include <string>

namespace qspec {

// Progress callback: (done, total) units of work; may be empty.
using ProgressFn = std::function<void(size_t done, size_t total)>;

// llama2.c checkpoint (legacy v0 format, as stories260K.bin) + its tokenizer.bin.
void convert_llama2c(const std::string& model_bin, const std::string& tokenizer_bin,
                     const std::string& out_dir, const ProgressFn& progress = {});

// GGUF v3 (llama architecture): tensors dequantized to F32/BF16 exactly as llama.cpp
// defines the types; tokenizer metadata turned into tokenizer.json.
void convert_gguf(const std::string& gguf_path, const std::string& out_dir,
                  const ProgressFn& progress = {});

}  // namespace qspec
