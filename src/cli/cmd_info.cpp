// qspec info MODEL: a model directory's architecture, sizes, layer recipe, weights and KV cache.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace qspec::cli {
namespace {

void run_info(const std::string& model_dir) {
  auto model = LlamaModel::load(model_dir);
  const ModelConfig& c = model->config();
  std::printf("model:          %s\n", model_dir.c_str());
  std::printf("architecture:   %s\n", c.architecture_name.c_str());
  std::printf("parameters:     %lld (%.2f M)\n", static_cast<long long>(c.parameter_count()),
              static_cast<double>(c.parameter_count()) / 1e6);
  std::printf("layers:         %lld\n", static_cast<long long>(c.num_layers));
  std::printf("hidden:         %lld (intermediate %lld)\n", static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.intermediate_size));
  std::printf("heads:          %lld query, %lld key/value, head_dim %lld\n", static_cast<long long>(c.num_heads),
              static_cast<long long>(c.num_kv_heads), static_cast<long long>(c.head_dim));
  std::printf("vocab:          %lld\n", static_cast<long long>(c.vocab_size));
  std::printf("context:        %lld\n", static_cast<long long>(c.max_position_embeddings));
  std::printf("rope:           %s, theta %g, factor %g\n", c.rope.type.c_str(), c.rope.theta, c.rope.factor);
  std::printf("rms_norm_eps:   %g\n", c.rms_norm_eps);
  std::printf("tied embedding: %s\n", c.tie_word_embeddings ? "yes" : "no");
  if (c.rope_local)
    std::printf("rope (sliding): %s, theta %g, factor %g\n", c.rope_local->type.c_str(), c.rope_local->theta,
                c.rope_local->factor);
  if (c.sliding_window) {
    int64_t sliding = 0;
    for (int64_t l = 0; l < c.num_layers; ++l) sliding += c.layer_window(l) > 0;
    std::printf("sliding window: %lld (%lld of %lld layers)\n", static_cast<long long>(*c.sliding_window),
                static_cast<long long>(sliding), static_cast<long long>(c.num_layers));
  }
  const LayerRecipe recipe = c.recipe();
  std::printf("layer recipe:   %s MLP%s%s%s%s\n", recipe.activation == MlpActivation::gelu_tanh ? "GeGLU (tanh)" : "SwiGLU",
              recipe.qk_norm ? ", q/k norms" : "", recipe.norm_adds_one ? ", (1 + w) norms" : "",
              recipe.output_norms ? ", attention/MLP output norms" : "",
              recipe.scale_embeddings ? ", embeddings x sqrt(hidden)" : "");
  if (c.query_pre_attn_scalar) std::printf("attention:      scale %g^-1/2\n", *c.query_pre_attn_scalar);
  if (c.final_logit_softcapping) std::printf("logit softcap:  %g\n", *c.final_logit_softcapping);
  std::printf("weights:        %s, %.2f MiB read per token\n", model->weight_dtype().c_str(),
              static_cast<double>(model->weight_bytes()) / (1 << 20));
  if (const cpu::Int8BlockMatrix* head = model->lm_head_int8())
    std::printf("lm_head (cpu):  int8 blocks of %lld, exactly the checkpoint's values, %.2f MiB\n",
                static_cast<long long>(cpu::Int8BlockMatrix::kBlock), static_cast<double>(head->bytes()) / (1 << 20));
  const double kv_bytes_per_token = 2.0 * static_cast<double>(c.num_layers * c.kv_dim()) * sizeof(float);
  std::printf("kv cache:       %.1f KiB per token (f32), %.1f MiB at full context\n", kv_bytes_per_token / 1024,
              kv_bytes_per_token * static_cast<double>(c.max_position_embeddings) / (1 << 20));
  if (model->has_quantized_weights()) {
    const QuantizationInfo& info = model->quantization();
    std::printf("quantization:   %s, %.2f MiB of quantized projections\n", model->quantized_format().c_str(),
                static_cast<double>(model->quantized_weight_bytes()) / (1 << 20));
    if (info.details.contains("calibration")) {
      const auto& calibration = info.details["calibration"];
      std::printf("calibration:    %s, %s sequences, %s tokens\n", calibration.value("source", "?").c_str(),
                  calibration.value("sequences", nlohmann::json()).dump().c_str(),
                  calibration.value("tokens", nlohmann::json()).dump().c_str());
    }
    if (info.details.contains("gptq")) std::printf("gptq:           %s\n", info.details["gptq"].dump().c_str());
    if (model->has_arc()) {
      int64_t tail = 0, total_k = 0, capped = 0;
      for (const QuantizedLayerWeights& layer : model->quantized_layers())
        for (const ArcSite& site : layer.sites) {
          tail += site.tail;
          total_k += static_cast<int64_t>(site.order.size());
          capped += site.capped;
        }
      const auto& arc = info.details["arc"];
      std::printf("arc:            tau %s x max, %lld augmented columns (%.1f%% of K), %lld capped sites\n",
                  arc.value("tau_factor", nlohmann::json()).dump().c_str(), static_cast<long long>(tail),
                  100.0 * static_cast<double>(tail) / static_cast<double>(total_k), static_cast<long long>(capped));
    }
  }
  auto tokenizer = Tokenizer::load(model_dir);
  tokenizer->check_model_vocab(c.vocab_size, model_dir);
  std::printf("tokenizer:      %d tokens, bos %s, eos", tokenizer->vocab_size(),
              tokenizer->bos_id ? std::to_string(*tokenizer->bos_id).c_str() : "none");
  for (int32_t id : tokenizer->eos_ids) std::printf(" %d", id);
  std::printf("\n");
}

}  // namespace

void register_info(CLI::App& app) {
  auto model_dir = std::make_shared<std::string>();
  CLI::App* command = app.add_subcommand("info", "Show a model's architecture, size and memory");
  add_model_argument(command, *model_dir);
  command->callback([model_dir] { run_info(*model_dir); });
}

}  // namespace qspec::cli
