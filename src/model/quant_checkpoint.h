// qspec 4-bit checkpoints: a Hugging Face directory whose projections are stored as 4-bit
// codes and scales, described by a JSON manifest.
//
//   qspec_quant.json   {"qspec_quantization": 1, "format": "int4", "group_size": 64,
//                       "method": "gptq", "details": {method options, calibration source and
//                       size, ARC parameters and per-site S}, "tool": ..., "source": ...,
//                       "tensor_formats": {projection name: {"format": "int8-group",
//                       "group_size": 32}, ...}}   (optional: projections stored in another
//                       format than "format", today int8-group only: the 8-bit tensors of a
//                       GGUF kept exactly by `qspec convert gguf --keep-4bit`)
//   model.safetensors  embedding, norms, lm_head and biases as loaded (BF16/F16/F32), and per
//                      projection P (e.g. model.layers.0.self_attn.q_proj.weight):
//                        P.qcodes        U8 [rows, code bytes of K + tail]
//                        P.qscales       U8 [rows, scale bytes of K + tail]
//                        P.tensor_scale  F32 [1] (nvfp4 only)
//                      and per ARC-calibrated site: model.layers.L.arc.SITE.order I32 [K].
//   config.json, tokenizer files and anything else of the source directory, copied.
// The codes and scales are the RowFormat storage of quant/formats.h, row by row.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "io/quant_manifest.h"  // kQuantManifestFile, kQuantManifestVersion, kQuantMethods
#include "quant/formats.h"

namespace qspec {


// Reads and checks the manifest's top-level fields; errors name the file and field.
nlohmann::json read_quant_manifest(const std::string& path);

// The format and group of one projection in a manifest: its "tensor_formats" entry when it has
// one, else the manifest's "format" and "group_size".
struct TensorFormat {
  quant::Format format;
  int64_t group_size;
};
TensorFormat manifest_tensor_format(const nlohmann::json& manifest, const std::string& tensor);

}  // namespace qspec
