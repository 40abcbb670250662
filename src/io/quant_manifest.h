// The manifest of a qspec 4-bit checkpoint (qspec_quant.json; model/quant_checkpoint.h reads it):
// its file name, version and the known methods, here so that importers below model/ (the GGUF
// importer's --keep-4bit) write the same ones.
#pragma once

namespace qspec {

inline constexpr const char* kQuantManifestFile = "qspec_quant.json";
inline constexpr int kQuantManifestVersion = 1;
// How the 4-bit weights were made: round to nearest, GPTQ, or imported from a GGUF file's own
// 4-bit blocks (qspec convert gguf --keep-4bit).
inline constexpr const char* kQuantMethods[] = {"rtn", "gptq", "gguf"};
// The manifest's optional map from projection name to {"format", "group_size"}: projections
// stored in another format than the checkpoint's (the 8-bit tensors of an imported GGUF).
inline constexpr const char* kQuantTensorFormatsField = "tensor_formats";

}  // namespace qspec
