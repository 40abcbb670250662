#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "io/convert.h"

namespace qspec::cli {

void register_convert(CLI::App& app) {
  CLI::App* command = app.add_subcommand("convert", "Import a model from another format into a Hugging Face directory");
  command->require_subcommand(1);

  struct Llama2cArgs {
    std::string model_bin, tokenizer_bin, out_dir;
  };
  auto llama2c = std::make_shared<Llama2cArgs>();
  CLI::App* from_llama2c = command->add_subcommand("llama2c", "llama2.c checkpoint (.bin) + tokenizer.bin");
  from_llama2c->add_option("model", llama2c->model_bin, "llama2.c model file")->required()->check(CLI::ExistingFile);
  from_llama2c->add_option("tokenizer", llama2c->tokenizer_bin, "llama2.c tokenizer.bin")->required()->check(CLI::ExistingFile);
  from_llama2c->add_option("out_dir", llama2c->out_dir, "Output directory")->required();
  from_llama2c->callback([llama2c] {
    ProgressBar bar("converting");
    convert_llama2c(llama2c->model_bin, llama2c->tokenizer_bin, llama2c->out_dir,
                    [&](size_t done, size_t total) { bar.update(done, total); });
    std::fprintf(stderr, "wrote %s\n", llama2c->out_dir.c_str());
  });

  struct GgufArgs {
    std::string gguf, out_dir;
    bool keep_4bit = false;
    bool all_4bit = false;
  };
  auto gguf = std::make_shared<GgufArgs>();
  CLI::App* from_gguf = command->add_subcommand("gguf", "GGUF v3 file (llama architecture)");
  from_gguf->add_option("file", gguf->gguf, "GGUF file")->required()->check(CLI::ExistingFile);
  from_gguf->add_option("out_dir", gguf->out_dir, "Output directory")->required();
  from_gguf->add_flag("--keep-4bit", gguf->keep_4bit,
                      "Keep Q4_0 / Q4_1 / Q4_K projections 4-bit: a qspec int4-asym g32 checkpoint whose weights equal "
                      "ggml's dequantization exactly; Q5_0 / Q6_K / Q8_0 projections (in Q4_K_M files) are kept "
                      "exactly as 8-bit int8-group weights (W8A16 on the GPU) (default: every tensor dequantized "
                      "to F32)");
  from_gguf->add_flag("--all-4bit", gguf->all_4bit,
                      "With --keep-4bit: re-quantize the Q5_0 / Q6_K / Q8_0 projections into int4-asym g32 too, "
                      "one 4-bit format for every projection (fewer bytes; costs quality)");
  from_gguf->callback([gguf] {
    ProgressBar bar("converting");
    GgufConvertOptions options;
    options.keep_4bit = gguf->keep_4bit;
    options.all_4bit = gguf->all_4bit;
    QSPEC_CHECK(!options.all_4bit || options.keep_4bit, "--all-4bit applies to --keep-4bit conversions only");
    convert_gguf(gguf->gguf, gguf->out_dir, [&](size_t done, size_t total) { bar.update(done, total); }, options);
    std::fprintf(stderr, "wrote %s\n", gguf->out_dir.c_str());
  });
}

}  // namespace qspec::cli
