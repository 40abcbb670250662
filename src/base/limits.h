// Upper bounds on the sizes a model directory may declare (config.json, tokenizer.json, GGUF).
// Each is far above any real model, and low enough that nothing sized from a value within
// bounds can overflow or exhaust memory before the tensors are checked.
#pragma once
#include <cstdint>

namespace qspec {

inline constexpr int64_t kMaxLayers = 1024;                  // Llama-3.1 405B: 126
inline constexpr int64_t kMaxHiddenSize = int64_t{1} << 16;  // 65536; 405B: 16384
inline constexpr int64_t kMaxIntermediateSize = int64_t{1} << 20;  // 405B: 53248
inline constexpr int64_t kMaxHeads = 1024;                   // query or key/value heads; 405B: 128
inline constexpr int64_t kMaxHeadDim = 1024;                 // the attention kernels' limit
// Token ids (and so vocabulary sizes) stay below this: the largest vocabularies are ~262K.
inline constexpr int64_t kMaxVocabSize = int64_t{1} << 22;   // 4,194,304
// Context length (max_position_embeddings, sliding_window): 16M tokens.
inline constexpr int64_t kMaxPositionEmbeddings = int64_t{1} << 24;

}  // namespace qspec
