#include "model/cuda/llama_gpu.h"

#include <algorithm>
#include <cstring>

#include "base/dtype.h"
#include "gemm/w4a16_pack.h"
#include "ops/cuda/device_info.h"
#include "ops/cuda/ops.h"
#include "qspec/error.h"

namespace qspec {
namespace {

using cuda::DeviceMemory;
using cuda::f16_bits;

template <typename T>
DeviceMemory upload(const std::vector<T>& host, const std::string& what) {
  try {
    DeviceMemory memory(std::max<size_t>(host.size() * sizeof(T), 16));
    cuda::copy_to_device(memory.get(), host.data(), host.size() * sizeof(T));
    return memory;
  } catch (const Error& error) {
    fail("GPU model: uploading ", what, " (", host.size() * sizeof(T), " bytes): ", error.what());
  }
}

// A checkpoint matrix (bf16 or f32) as f16 [rows, cols]. Values beyond the f16 range saturate
// (a checkpoint that needs them does not run in f16; the W16A16 greedy test would show it).
std::vector<f16_bits> to_f16(const WeightMatrix& weight) {
  std::vector<f16_bits> out(static_cast<size_t>(weight.rows * weight.cols));
  std::vector<float> row(static_cast<size_t>(weight.cols));
  for (int64_t r = 0; r < weight.rows; ++r) {
    weight.row_to_f32(r, row.data());
    for (int64_t c = 0; c < weight.cols; ++c) out[static_cast<size_t>(r * weight.cols + c)] = f32_to_f16(row[c]);
  }
  return out;
}

// One projection on the device: f16 weights (cuBLAS) or packed 4-bit weights.
struct Linear {
  int64_t n = 0, k = 0;
  DeviceMemory w16;             // f16 [n, k] (W16A16)
  DeviceMemory codes, scales;   // gemm/w4a16_pack.h layout (W4A16)
  cuda::W4A16Weights view{};
  bool quantized = false;
};

Linear make_linear(const WeightMatrix& weight) {
  Linear linear;
  linear.n = weight.rows;
  linear.k = weight.cols;
  linear.w16 = upload(to_f16(weight), weight.name);
  return linear;
}

Linear make_linear(const QuantizedMatrix& weight) {
  const gemm::W4A16Packed packed = gemm::pack_w4a16(weight);
  Linear linear;
  linear.n = packed.n;
  linear.k = packed.k;
  linear.quantized = true;
  linear.codes = upload(packed.codes, weight.name + " codes");
  linear.scales = upload(packed.scales, weight.name + " scales");
  linear.view = {linear.codes.get(), linear.scales.get(), packed.n, packed.k, packed.group};
  return linear;
}

struct Layer {
  DeviceMemory attention_norm, mlp_norm;  // f32
  Linear q, k, v, o, gate, up, down;
};

}  // namespace

struct GpuLlama::State {
  ModelConfig config;
  bool quantized = false;
  int64_t capacity = 0, max_blocks = 0;
  void* stream = nullptr;
  std::unique_ptr<cuda::Blas> blas;
  DeviceMemory embedding, final_norm, inv_freq;  // f16 [vocab, hidden], f32, f32
  float rope_scaling = 1.0f;
  Linear lm_head;
  std::vector<Layer> layers;
  std::vector<DeviceMemory> k_pools, v_pools;
  DeviceMemory block_table;
  // Scratch for up to `capacity` tokens.
  DeviceMemory ids, positions, query_start, context_len, x, normed, q, k, v, attn, proj, gate, up, act, logits,
      next_id, gemm_workspace, attention_workspace;
  size_t gemm_workspace_bytes = 0, attention_workspace_bytes = 0;

  ~State() {
    if (stream != nullptr) cuda::destroy_stream(stream);
  }

  void gemm(const Linear& linear, const f16_bits* x_in, int64_t m, f16_bits* y) {
    if (linear.quantized) {
      cuda::w4a16_gemm(*blas, x_in, m, linear.k, linear.view, y, linear.n, gemm_workspace.get(), gemm_workspace_bytes,
                       stream);
    } else {
      cuda::linear_w16(*blas, x_in, m, linear.k, linear.w16.as<uint16_t>(), linear.n, y, cuda::Dtype16::f16, stream);
    }
  }
};

GpuLlama::GpuLlama(const LlamaModel& model, const RunMode& mode, int64_t max_tokens) : state_(std::make_unique<State>()) {
  const ModelConfig& c = model.config();
  QSPEC_CHECK(cuda::device_count() > 0, "GPU model: no CUDA GPU is visible");
  QSPEC_CHECK(cuda::compute_capability() >= 80, "GPU model: ", cuda::device_name(), " is sm_",
              cuda::compute_capability(), "; the CUDA backend needs sm_80 or newer");
  QSPEC_CHECK(mode.name == "w16a16" || mode.name == "w4a16", "GPU model: mode ", mode.name,
              " is not on the GPU yet (w16a16, w4a16)");
  QSPEC_CHECK(!c.attention_bias && !c.attention_output_bias && !c.mlp_bias,
              "GPU model: linear biases (Qwen2, Llama attention_bias) are not on the GPU yet");
  QSPEC_CHECK(!model.rotated(), "GPU model: Hadamard-rotated models are not on the GPU yet");
  QSPEC_CHECK(c.head_dim == 32 || c.head_dim == 64 || c.head_dim == 128, "GPU model: head_dim ", c.head_dim,
              " (the attention kernels take 32, 64, 128)");
  QSPEC_CHECK(c.hidden_size % 8 == 0 && c.intermediate_size % 8 == 0 && c.q_dim() % 8 == 0 && c.kv_dim() % 8 == 0,
              "GPU model: hidden, intermediate and head sizes must be multiples of 8");
  QSPEC_CHECK(max_tokens > 0 && max_tokens <= c.max_position_embeddings, "GPU model: max_tokens ", max_tokens,
              " outside 1..", c.max_position_embeddings);
  State& s = *state_;
  s.config = c;
  s.quantized = mode.quantized_weights;
  if (s.quantized) {
    QSPEC_CHECK(model.has_quantized_weights(), "GPU model: mode w4a16 needs 4-bit weights (quantize the model first)");
    QSPEC_CHECK(!model.has_arc(), "GPU model: ARC-calibrated weights (reordered inputs) are not on the GPU yet");
  } else {
    QSPEC_CHECK(model.has_checkpoint_weights(), "GPU model: mode w16a16 needs the checkpoint's 16-bit weights");
  }
  s.capacity = max_tokens;
  s.stream = cuda::create_stream();
  s.blas = std::make_unique<cuda::Blas>();

  s.embedding = upload(to_f16(model.embedding()), "embedding");
  s.final_norm = upload(model.final_norm(), "final norm");
  const RopeTables rope = rope_tables(c);
  s.inv_freq = upload(rope.inv_freq, "rope inv_freq");
  s.rope_scaling = rope.attention_scaling;
  s.lm_head = make_linear(model.lm_head());
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = model.layer_weights(l);
    Layer layer;
    layer.attention_norm = upload(w.attention_norm, "layer norm");
    layer.mlp_norm = upload(w.mlp_norm, "layer norm");
    if (s.quantized) {
      const QuantizedLayerWeights& qw = model.quantized_layers()[static_cast<size_t>(l)];
      layer.q = make_linear(qw.q_proj);
      layer.k = make_linear(qw.k_proj);
      layer.v = make_linear(qw.v_proj);
      layer.o = make_linear(qw.o_proj);
      layer.gate = make_linear(qw.gate_proj);
      layer.up = make_linear(qw.up_proj);
      layer.down = make_linear(qw.down_proj);
    } else {
      layer.q = make_linear(w.q_proj);
      layer.k = make_linear(w.k_proj);
      layer.v = make_linear(w.v_proj);
      layer.o = make_linear(w.o_proj);
      layer.gate = make_linear(w.gate_proj);
      layer.up = make_linear(w.up_proj);
      layer.down = make_linear(w.down_proj);
    }
    s.layers.push_back(std::move(layer));
  }

  // Paged KV cache of one sequence: blocks 0..max_blocks-1 in order.
  s.max_blocks = (max_tokens + cuda::kKvBlockSize - 1) / cuda::kKvBlockSize;
  const size_t pool_bytes = static_cast<size_t>(s.max_blocks * cuda::kKvBlockSize * c.kv_dim()) * 2;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    s.k_pools.emplace_back(pool_bytes);
    s.v_pools.emplace_back(pool_bytes);
  }
  std::vector<int32_t> table(static_cast<size_t>(s.max_blocks));
  for (int64_t b = 0; b < s.max_blocks; ++b) table[static_cast<size_t>(b)] = static_cast<int32_t>(b);
  s.block_table = upload(table, "block table");

  const size_t t = static_cast<size_t>(max_tokens);
  s.ids = DeviceMemory(t * 4);
  s.positions = DeviceMemory(t * 4);
  s.query_start = DeviceMemory(16);
  s.context_len = DeviceMemory(16);
  s.x = DeviceMemory(t * c.hidden_size * 2);
  s.normed = DeviceMemory(t * c.hidden_size * 2);
  s.q = DeviceMemory(t * c.q_dim() * 2);
  s.k = DeviceMemory(t * c.kv_dim() * 2);
  s.v = DeviceMemory(t * c.kv_dim() * 2);
  s.attn = DeviceMemory(t * c.q_dim() * 2);
  s.proj = DeviceMemory(t * c.hidden_size * 2);
  s.gate = DeviceMemory(t * c.intermediate_size * 2);
  s.up = DeviceMemory(t * c.intermediate_size * 2);
  s.act = DeviceMemory(t * c.intermediate_size * 2);
  s.logits = DeviceMemory(static_cast<size_t>(c.vocab_size) * 2);
  s.next_id = DeviceMemory(16);
  // GEMM workspace: the largest any projection needs at any token count up to max_tokens.
  for (const Layer& layer : s.layers)
    for (const Linear* linear : {&layer.q, &layer.k, &layer.v, &layer.o, &layer.gate, &layer.up, &layer.down})
      if (linear->quantized)
        for (int64_t m : {int64_t{1}, std::min<int64_t>(max_tokens, 64), max_tokens})
          s.gemm_workspace_bytes =
              std::max(s.gemm_workspace_bytes, cuda::w4a16_workspace_bytes(m, linear->n, linear->k));
  if (s.gemm_workspace_bytes > 0) {
    s.gemm_workspace = DeviceMemory(s.gemm_workspace_bytes);
    cuda::w4a16_workspace_init(s.gemm_workspace.get(), s.gemm_workspace_bytes, s.stream);
  }
  s.attention_workspace_bytes = cuda::attention_workspace_bytes(max_tokens, c.num_heads, c.head_dim, max_tokens);
  s.attention_workspace = DeviceMemory(s.attention_workspace_bytes);
  cuda::stream_synchronize(s.stream);
}

GpuLlama::~GpuLlama() = default;

size_t GpuLlama::device_bytes() const {
  size_t total = 0;
  const State& s = *state_;
  auto add = [&](const DeviceMemory& m) { total += m.bytes(); };
  for (const DeviceMemory* m : {&s.embedding, &s.final_norm, &s.inv_freq, &s.block_table, &s.ids, &s.positions, &s.x,
                                &s.normed, &s.q, &s.k, &s.v, &s.attn, &s.proj, &s.gate, &s.up, &s.act, &s.logits,
                                &s.gemm_workspace, &s.attention_workspace})
    add(*m);
  auto add_linear = [&](const Linear& l) {
    add(l.w16);
    add(l.codes);
    add(l.scales);
  };
  add_linear(s.lm_head);
  for (const Layer& layer : s.layers)
    for (const Linear* linear : {&layer.q, &layer.k, &layer.v, &layer.o, &layer.gate, &layer.up, &layer.down})
      add_linear(*linear);
  for (const DeviceMemory& m : s.k_pools) add(m);
  for (const DeviceMemory& m : s.v_pools) add(m);
  return total;
}

int32_t GpuLlama::forward(std::span<const int32_t> tokens) {
  State& s = *state_;
  const ModelConfig& c = s.config;
  const int64_t count = static_cast<int64_t>(tokens.size());
  QSPEC_CHECK(count > 0, "GPU forward: no tokens");
  QSPEC_CHECK(length_ + count <= s.capacity, "GPU forward: ", length_ + count, " tokens exceed the GPU KV cache of ",
              s.capacity);
  for (int32_t id : tokens)
    QSPEC_CHECK(id >= 0 && id < c.vocab_size, "GPU forward: token id ", id, " outside the vocabulary [0, ",
                c.vocab_size, ")");
  const int64_t start = length_, hidden = c.hidden_size, q_dim = c.q_dim(), kv_dim = c.kv_dim(),
                inter = c.intermediate_size;
  std::vector<int32_t> positions(static_cast<size_t>(count));
  for (int64_t t = 0; t < count; ++t) positions[static_cast<size_t>(t)] = static_cast<int32_t>(start + t);
  const int32_t query_start[2] = {0, static_cast<int32_t>(count)};
  const int32_t context_len = static_cast<int32_t>(start + count);
  // Synchronous copies: the stream is idle (every forward ends with a synchronize).
  cuda::copy_to_device(s.ids.get(), tokens.data(), tokens.size() * 4);
  cuda::copy_to_device(s.positions.get(), positions.data(), positions.size() * 4);
  cuda::copy_to_device(s.query_start.get(), query_start, sizeof query_start);
  cuda::copy_to_device(s.context_len.get(), &context_len, sizeof context_len);

  void* stream = s.stream;
  auto* x = s.x.as<f16_bits>();
  auto* normed = s.normed.as<f16_bits>();
  auto* q = s.q.as<f16_bits>();
  auto* k = s.k.as<f16_bits>();
  auto* v = s.v.as<f16_bits>();
  auto* attn = s.attn.as<f16_bits>();
  auto* proj = s.proj.as<f16_bits>();
  const float eps = static_cast<float>(c.rms_norm_eps);
  const cpu::AttentionShape shape{c.num_heads, c.num_kv_heads, c.head_dim, c.sliding_window.value_or(0)};
  cuda::QueryBatch batch;
  batch.num_seqs = 1;
  batch.num_tokens = count;
  batch.query_start = s.query_start.as<int32_t>();
  batch.positions = s.positions.as<int32_t>();
  batch.max_query_len = count;
  batch.max_context = start + count;

  cuda::embedding(s.ids.as<int32_t>(), count, s.embedding.as<f16_bits>(), c.vocab_size, hidden, x, stream);
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const Layer& layer = s.layers[l];
    const cuda::PagedKv kv{s.k_pools[l].as<f16_bits>(), s.v_pools[l].as<f16_bits>(), s.block_table.as<int32_t>(),
                           s.max_blocks};
    // Attention block.
    cuda::rmsnorm(x, layer.attention_norm.as<float>(), count, hidden, eps, normed, stream);
    s.gemm(layer.q, normed, count, q);
    s.gemm(layer.k, normed, count, k);
    s.gemm(layer.v, normed, count, v);
    cuda::rope(q, count, c.num_heads, c.head_dim, q_dim, s.positions.as<int32_t>(), s.inv_freq.as<float>(),
               s.rope_scaling, stream);
    cuda::rope(k, count, c.num_kv_heads, c.head_dim, kv_dim, s.positions.as<int32_t>(), s.inv_freq.as<float>(),
               s.rope_scaling, stream);
    cuda::paged_kv_write(k, v, kv_dim, batch, kv, c.num_kv_heads, c.head_dim, stream);
    if (count == 1)
      cuda::paged_attention_decode(q, q_dim, 1, s.context_len.as<int32_t>(), start + 1, kv, shape, attn, q_dim,
                                   s.attention_workspace.get(), s.attention_workspace_bytes, stream);
    else
      cuda::paged_attention_prefill(q, q_dim, batch, kv, shape, attn, q_dim, s.attention_workspace.get(),
                                    s.attention_workspace_bytes, stream);
    s.gemm(layer.o, attn, count, proj);
    // MLP block: residual += o, normed = rmsnorm(residual) in one pass.
    cuda::add_rmsnorm(x, proj, layer.mlp_norm.as<float>(), count, hidden, eps, normed, stream);
    s.gemm(layer.gate, normed, count, s.gate.as<f16_bits>());
    s.gemm(layer.up, normed, count, s.up.as<f16_bits>());
    cuda::silu_mul(s.gate.as<f16_bits>(), s.up.as<f16_bits>(), count, inter, inter, s.act.as<f16_bits>(), stream);
    s.gemm(layer.down, s.act.as<f16_bits>(), count, proj);
    cuda::add(x, proj, count * hidden, x, stream);
  }
  // Logits of the last token only.
  const f16_bits* last = x + (count - 1) * hidden;
  cuda::rmsnorm(last, s.final_norm.as<float>(), 1, hidden, eps, normed, stream);
  s.gemm(s.lm_head, normed, 1, s.logits.as<f16_bits>());
  cuda::argmax_f16(s.logits.as<f16_bits>(), 1, c.vocab_size, s.next_id.as<int32_t>(), stream);
  cuda::stream_synchronize(stream);
  int32_t next = 0;
  cuda::copy_to_host(&next, s.next_id.get(), sizeof next);
  length_ = start + count;
  return next;
}

std::vector<float> GpuLlama::logits() const {
  const State& s = *state_;
  std::vector<f16_bits> bits(static_cast<size_t>(s.config.vocab_size));
  cuda::copy_to_host(bits.data(), s.logits.get(), bits.size() * 2);
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = f16_to_f32(bits[i]);
  return out;
}

std::vector<int32_t> gpu_greedy_generate(GpuLlama& gpu, std::span<const int32_t> prompt, int64_t max_new_tokens,
                                         const std::vector<int32_t>& eos_ids) {
  gpu.reset();
  std::vector<int32_t> ids;
  if (max_new_tokens <= 0) return ids;
  int32_t next = gpu.forward(prompt);
  while (true) {
    ids.push_back(next);
    if (std::find(eos_ids.begin(), eos_ids.end(), next) != eos_ids.end()) break;
    if (static_cast<int64_t>(ids.size()) >= max_new_tokens) break;
    next = gpu.forward(std::span<const int32_t>(&next, 1));
  }
  return ids;
}

}  // namespace qspec
