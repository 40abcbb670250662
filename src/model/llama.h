// A Llama-family decoder (Llama, Qwen2, Mistral, Qwen3, Gemma 3) bound to a checkpoint's
// tensors, and its CPU forward pass; the families differ only by their LayerRecipe
// (io/model_config.h) and per-layer attention (window, RoPE).
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "model/draft_skip.h"
#include "model/draft_vocab.h"
#include "model/kv_storage.h"
#include "ops/attention.h"
#include "ops/int8_linear.h"
#include "ops/linear.h"
#include "ops/quantized_linear.h"
#include "quant/hadamard.h"
#include "quant/quantized_linear.h"

namespace qspec {

// The attention's shape of `layer` in a pass of `mode` (CPU and GPU): the model's heads, scale and
// the layer's sliding window, narrowed by a QSpec draft's sparse view of the cache
// (RunMode::kv_window / kv_sinks) when the mode has one.
cpu::AttentionShape attention_shape(const ModelConfig& config, int64_t layer, int64_t kv_window = 0,
                                    int64_t kv_sinks = 0);
inline cpu::AttentionShape attention_shape(const ModelConfig& config, int64_t layer, const RunMode& mode) {
  return attention_shape(config, layer, mode.kv_window, mode.kv_sinks);
}

// Keys and values of one sequence, contiguous per layer: [capacity, kv_dim] rows (one block as
// large as the cache) in the cache format (f32 rows, or the 8-bit cache's planes).
class KvCache {
 public:
  KvCache(int64_t layers, int64_t capacity, int64_t num_kv_heads, int64_t head_dim,
          KvCacheFormat format = KvCacheFormat::f16);
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  KvCacheFormat format() const { return storage_.format(); }
  size_t bytes() const { return storage_.bytes(); }
  void set_length(int64_t length);  // truncate (e.g. roll back), never grow past written data
  float* keys(int64_t layer) { return storage_.keys(layer); }  // format f16 only
  float* values(int64_t layer) { return storage_.values(layer); }
  KvBlocks blocks();

 private:
  friend class LlamaModel;
  int64_t capacity_;
  int64_t length_ = 0;
  KvStorage storage_;
};

// One sequence's part of a batched forward pass (LlamaModel::forward_batch).
struct SequenceChunk {
  std::span<const int32_t> tokens;
  int64_t start = 0;  // position of tokens[0]: K/V rows start.. are written, rows < start read
  KvBlocks kv;
  enum class Logits : uint8_t { none, last, all } logits = Logits::last;
};

// Norm weights are stored as the factor they multiply by: a Gemma (1 + w) norm holds 1 + w.
struct LayerWeights {
  std::vector<float> attention_norm, mlp_norm;
  std::vector<float> q_norm, k_norm;                   // [head_dim], recipe.qk_norm
  std::vector<float> attention_out_norm, mlp_out_norm;  // [hidden], recipe.output_norms
  WeightMatrix q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
  std::vector<float> q_bias, k_bias, v_bias, o_bias, gate_bias, up_bias, down_bias;
};

// The four places where activations enter linear layers; each is quantized once per mode
// and feeds every projection listed.
enum class LinearSite : uint8_t {
  attention_in,   // rmsnorm(x) -> q_proj, k_proj, v_proj
  attention_out,  // attention output -> o_proj
  mlp_in,         // rmsnorm(x) -> gate_proj, up_proj
  mlp_out,        // silu(gate) * up -> down_proj
};
inline constexpr int kLinearSites = 4;
std::string_view linear_site_name(LinearSite site);  // "attn_in", "attn_out", "mlp_in", "mlp_out"

// ARCQuant's offline calibration of one site (see model/quantize.h for how it is found).
// The site's input is reordered so channel j of the reordered input is input channel
// order[j] (ascending calibration abs-max: the outliers are last), and every weight of the
// site is stored reordered and augmented to K + tail columns: [W_perm | W_perm[:, K-tail:K]].
// A mode with 4-bit activations and ARC gives the last S reordered channels residual
// channels (S = outliers(format) <= tail; the unused first tail - S augmented columns see
// zero activations); every other mode reads only the first K columns.
struct ArcSite {
  std::vector<int32_t> order;  // empty: no ARC calibration (identity, tail 0)
  int64_t tail = 0;            // augmented columns, a multiple of the weight format's block
  int64_t outliers_int4 = 0, outliers_nvfp4 = 0, outliers_mxfp4 = 0;  // S per 4-bit format
  // Calibration statistics, for reports: the largest abs value M, the channels above
  // tau = 2^-3 M, and whether S was capped.
  float max_abs = 0.0f;
  int64_t above_tau = 0;
  bool capped = false;

  bool calibrated() const { return !order.empty(); }
  int64_t outliers(quant::Format activation_format) const;  // throws for non-ARC formats
};

// The seven projections as 4-bit weights (embedding, norms and lm_head stay as loaded), and
// the ARC calibration of the four sites that feed them.
struct QuantizedLayerWeights {
  QuantizedMatrix q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
  ArcSite sites[kLinearSites];
};

// What produced the 4-bit weights (written to and read from qspec_quant.json).
struct QuantizationInfo {
  quant::Format format = quant::Format::int4;
  int64_t group_size = 0;       // int4 groups along K (0 for the other formats)
  std::string method = "rtn";   // "rtn" or "gptq"
  nlohmann::json details;       // method options, calibration source and size, ARC summary
  std::string describe() const;  // "int4 g64 gptq + arc"
};

// Sees every site's input during a forward pass (before any activation quantization);
// calibration collects statistics through it.
class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  virtual void observe(int64_t layer, LinearSite site, const float* input, int64_t tokens, int64_t k) = 0;
};

// A QSpec draft's lm_head over a vocabulary subset (RunMode::vocab_subset): the lm_head rows of
// the first rows() ids of the model's draft vocabulary table, copied contiguously in the
// lm_head's own storage (int8 blocks, bf16 or f32), so a draft step reads rows() rows of it.
struct DraftHead {
  std::vector<int32_t> ids;  // row j scores token ids[j]
  WeightMatrix weight;       // [rows, hidden], a view of `bf16` or its own f32 copy
  std::vector<uint16_t> bf16;
  std::optional<cpu::Int8BlockMatrix> int8;  // set when the lm_head is int8 blocks
  int64_t rows() const { return static_cast<int64_t>(ids.size()); }
  size_t bytes() const;  // what a draft step reads of it
};

class LlamaModel {
 public:
  // Loads DIR (config.json + safetensors). Every tensor's presence, dtype and shape is
  // checked against the config; errors name the tensor.
  // read_draft_tables: also read DIR/kDraftVocabFile and DIR/kDraftSkipFile when present
  // (tune-draft, which remakes them, does not).
  static std::unique_ptr<LlamaModel> load(const std::string& dir, bool read_draft_tables = true);
  // A model of `config`'s shapes whose 4-bit weights (`quantization`) live elsewhere: an engine
  // over a backend built around a synthetic full-size GPU model (Engine's backend constructor;
  // `qspec bench --replay`) reads its config and format from it. Its forward passes throw.
  static std::unique_ptr<LlamaModel> without_weights(const ModelConfig& config, QuantizationInfo quantization);

  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }
  // Bytes of weight data touched by one forward pass (for bandwidth figures).
  size_t weight_bytes() const { return weight_bytes_; }
  std::string weight_dtype() const;

  // capacity 0: max_position_embeddings.
  KvCache new_cache(int64_t capacity = 0, KvCacheFormat format = KvCacheFormat::f16) const;
  const WeightMatrix& embedding() const { return embedding_; }
  // Token `id`'s input row [hidden] as the forward pass starts from it: the embedding row, times
  // sqrt(hidden) rounded as transformers rounds it where the family scales (Gemma). The GPU
  // model's embedding table holds these rows.
  void input_embedding(int32_t id, float* row) const;
  const WeightMatrix& lm_head() const { return lm_head_; }
  // The lm_head as int8 blocks when it is exactly that (a GGUF's Q8_0 output matrix converted to
  // f32, as SmolLM2's): the CPU forward pass reads it instead of the f32 matrix, with the same
  // logits bit for bit. Null otherwise, or when QSPEC_CPU_LM_HEAD=f32 was set at load.
  const cpu::Int8BlockMatrix* lm_head_int8() const { return lm_head_int8_ ? &*lm_head_int8_ : nullptr; }
  const std::vector<float>& final_norm() const { return final_norm_; }

  // The draft vocabulary table (model/draft_vocab.h): read at load from DIR/kDraftVocabFile when
  // there is one (an error names the file and field when it was made for another model), or
  // installed with set_draft_vocab (checked the same way); null without one.
  const DraftVocabTable* draft_vocab() const { return draft_vocab_ ? &*draft_vocab_ : nullptr; }
  void set_draft_vocab(DraftVocabTable table, const std::string& source = "draft vocabulary table");
  // The lm_head of a draft with a vocabulary subset of n ids: made on first use for each n and
  // kept (thread-safe). Throws naming the table file when the model has no table (and how to
  // make one) or n is outside kMinDraftVocab..its length.
  std::shared_ptr<const DraftHead> draft_head(int64_t n) const;
  // draft_head's checks alone (a GPU run keeps its own copy of the rows).
  void check_draft_vocab(int64_t n) const;

  // The draft skip table (model/draft_skip.h): read at load from DIR/kDraftSkipFile when there is
  // one (an error names the file and field when it was made for another model), or installed
  // with set_draft_skip (checked the same way); null without one.
  const DraftSkipTable* draft_skip() const { return draft_skip_ ? &*draft_skip_ : nullptr; }
  void set_draft_skip(DraftSkipTable table, const std::string& source = "draft skip table");
  // Throws naming the table file when the model has no table (and how to make one) or n is
  // outside 1..its length.
  void check_draft_skip(int64_t n) const;
  // The layers a pass with RunMode::skip_layers = n skips ([num_layers], true = skipped): the
  // first n of the table's order; none for n = 0. Throws as check_draft_skip.
  std::vector<bool> skipped_layers(int64_t n) const;

  // Runs `tokens` at positions cache.length() ... and appends their K/V. Writes logits for
  // the last token ([vocab]) or, with all_logits, for every token ([tokens, vocab]).
  // `mode` picks the weights (checkpoint or 4-bit) and how activations enter every linear
  // layer; the KV cache and all other weights are shared by every mode.
  void forward(std::span<const int32_t> tokens, KvCache& cache, std::vector<float>& logits,
               bool all_logits = false, const RunMode& mode = {}, ForwardObserver* observer = nullptr) const;
  // One pass over several sequences' chunks (continuous batching): the linear layers see all
  // their tokens as one matrix, attention runs per sequence over its own K/V. Every row is
  // computed exactly as it would be alone (per-token activation quantization, per-row dot
  // products, per-query attention), so batch composition never changes a sequence's logits.
  // Logit rows are appended chunk by chunk as each chunk's `logits` asks ([rows, vocab]).
  void forward_batch(std::span<const SequenceChunk> chunks, std::vector<float>& logits, const RunMode& mode = {},
                     ForwardObserver* observer = nullptr) const;

  // Quantizes the seven projections of every layer to 4 bits (round to nearest, no ARC),
  // kept beside the checkpoint weights so W16A16 and the 4-bit modes run from one loaded
  // model. group_size 0 picks auto_group_size(). model/quantize.h has GPTQ and ARC.
  void quantize_weights(quant::Format format, int64_t group_size = 0);
  // The int4 group size for this model: 128 (the usual) when it divides every linear
  // layer's K, else the largest of 64, 32 that does (gsm-synth-llama's intermediate size is
  // 704 = 11 x 64). Throws when none does.
  int64_t auto_group_size() const;
  bool has_quantized_weights() const { return !quantized_layers_.empty() || weightless_; }
  // Whether the checkpoint weights are present (a qspec 4-bit checkpoint has only the
  // quantized ones, so it runs every mode except w16a16).
  bool has_checkpoint_weights() const { return !loaded_from_quantized_; }
  bool has_arc() const;
  // "int4 g128 rtn", "nvfp4 gptq + arc", ...; empty without quantized weights.
  std::string quantized_format() const;
  const QuantizationInfo& quantization() const { return quantization_; }
  const std::vector<QuantizedLayerWeights>& quantized_layers() const { return quantized_layers_; }
  size_t quantized_weight_bytes() const;

  // Installs 4-bit weights made elsewhere (model/quantize.cpp); checks every shape.
  void set_quantized_weights(std::vector<QuantizedLayerWeights> layers, QuantizationInfo info);
  // QuaRot-style rotation (quant/hadamard.h has the recipe): folds every RMSNorm weight into
  // the projections after it, rotates the residual stream by a randomized Hadamard Q (seed)
  // and the down_proj input by Q2 (seed + 1, applied online in every forward pass). The
  // model computes the same function (W16A16 logits move only by f32 rounding) while
  // activation outliers spread over all channels, which 4-bit activations need with
  // per-channel int4 weights. Call before quantizing; the 16-bit weights become f32 copies.
  void apply_hadamard_rotation(uint64_t seed);
  bool rotated() const { return rotated_; }
  uint64_t rotation_seed() const { return rotation_seed_; }

  // Layer-by-layer calibration (GPTQ) runs each freshly quantized layer before quantizing the
  // next: installs layer l's 4-bit weights alone. Finish with set_quantized_weights.
  void set_quantized_layer_for_calibration(int64_t l, QuantizedLayerWeights layer);
  // Checkpoint weights of layer l (for quantizers).
  const LayerWeights& layer_weights(int64_t l) const { return layers_[static_cast<size_t>(l)]; }

  // Writes a qspec 4-bit checkpoint: OUT_DIR/model.safetensors (embedding, norms, lm_head as
  // loaded; codes, scales and ARC orders), qspec_quant.json (the manifest) and the input
  // directory's config and tokenizer files. OUT_DIR must not exist; it appears complete or
  // not at all (written beside it, then renamed).
  void save_quantized(const std::string& out_dir, const nlohmann::json& manifest_extra = {}) const;

  // Scratch buffers of one forward pass.
  struct Workspace {
    std::vector<float> normed, q, k, v, attn, gate, up, projected, site_input, site_scratch;
    cpu::Int8Activations int8;  // a site's input in mode w4a8 (the integer kernels' codes)
  };
  // Tokens [first, first + count) of a batch belong to one sequence whose K/V is `kv`.
  struct Segment {
    int64_t first = 0, count = 0;
    KvBlocks kv;
  };
  Workspace make_workspace(int64_t tokens) const;
  // One decoder layer over `count` tokens in place on x [count, hidden]: K/V of positions
  // positions[0..count) go into cache rows start..start+count of layer l (the cache length is
  // not touched). Used by forward and by layer-by-layer calibration (GPTQ).
  void run_layer(int64_t l, float* x, int64_t count, const int32_t* positions, KvCache& cache,
                 const RunMode& mode, ForwardObserver* observer, Workspace& workspace) const;
  // The same over a batch of sequences (positions[t] is token t's position in its sequence).
  void run_layer(int64_t l, float* x, int64_t count, const int32_t* positions, std::span<const Segment> segments,
                 const RunMode& mode, ForwardObserver* observer, Workspace& workspace) const;
  // The end of a forward pass: the final norm and the lm_head (the mode's vocabulary subset, if
  // any) over the `rows` residual rows x [rows, hidden], into logits [rows, vocab]. Used by
  // forward and by the layer skip search (which runs the layers itself).
  void output_logits(const float* x, int64_t rows, const RunMode& mode, Workspace& workspace,
                     std::vector<float>& logits) const;

 private:
  LlamaModel() = default;
  void bind_weights();
  void bind_quantized_weights(const nlohmann::json& manifest);
  void set_rotation_from_manifest(uint64_t seed);
  // The input of a site's projections in the mode: as is (checkpoint weights), or reordered,
  // quantized and ARC-augmented to [count, K + tail] for the 4-bit weights; in mode w4a8 on a
  // site without ARC calibration, int8 codes for the integer kernels instead (values null).
  struct SiteInput {
    const float* values = nullptr;
    const cpu::Int8Activations* int8 = nullptr;
  };
  SiteInput site_input(int64_t l, LinearSite site, const RunMode& mode, float* x, int64_t count, int64_t k,
                       Workspace& workspace) const;

  std::string dir_;
  ModelConfig config_;
  bool weightless_ = false;  // without_weights: config and format only
  Checkpoint checkpoint_;
  WeightMatrix embedding_, lm_head_;
  std::optional<cpu::Int8BlockMatrix> lm_head_int8_;
  size_t lm_head_bytes_ = 0;  // the lm_head's share of weight_bytes_
  void bind_lm_head_int8();  // sets lm_head_int8_ from lm_head_, and its share of weight_bytes_
  std::optional<DraftVocabTable> draft_vocab_;
  std::optional<DraftSkipTable> draft_skip_;
  // draft_head's copies by n, behind a pointer so the model stays movable.
  struct DraftHeads {
    std::mutex mutex;
    std::map<int64_t, std::shared_ptr<const DraftHead>> by_rows;
  };
  std::unique_ptr<DraftHeads> draft_heads_ = std::make_unique<DraftHeads>();
  std::vector<float> final_norm_;
  std::vector<LayerWeights> layers_;
  std::vector<QuantizedLayerWeights> quantized_layers_;
  QuantizationInfo quantization_;
  bool loaded_from_quantized_ = false;
  bool rotated_ = false;
  uint64_t rotation_seed_ = 0;
  quant::HadamardRotation mlp_rotation_;  // Q2, on down_proj's input
  LayerRecipe recipe_;
  std::vector<RopeTables> layer_rope_;  // per layer (sliding and full layers may differ)
  // Gemma's embedding multiplier sqrt(hidden), rounded to the embedding's checkpoint dtype as
  // transformers does; the scaled rows are rounded to that dtype too.
  float embed_scale_ = 1.0f;
  DType embedding_dtype_ = DType::F32;
  size_t weight_bytes_ = 0;
};

}  // namespace qspec
