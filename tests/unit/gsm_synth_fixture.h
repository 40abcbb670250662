// gsm-synth-llama (the bundled model) with RTN int4 weights, its tokenizer and the first `count`
// of five word-problem prompts: what the engine, QSpec and replay tests decode. Each test file
// holds its own (they may install draft tables into the model).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace qspec_test {

inline const std::string kGsmSynthModel = QSPEC_SOURCE_DIR "/models/gsm-synth-llama";

struct GsmSynthInt4 {
  std::unique_ptr<qspec::LlamaModel> model;
  std::unique_ptr<qspec::Tokenizer> tokenizer;
  std::vector<std::vector<int32_t>> prompts;
  explicit GsmSynthInt4(size_t count) {
    model = qspec::LlamaModel::load(kGsmSynthModel);
    model->quantize_weights(qspec::quant::Format::int4);
    tokenizer = qspec::Tokenizer::load(kGsmSynthModel);
    for (const char* q : {"Tom has 3 apples and buys 5 more. How many apples does he have?",
                          "A box holds 12 pens. How many pens are in 4 boxes?",
                          "Sara had 40 dollars and spent 15. How much money is left?",
                          "A train travels 60 miles per hour for 3 hours. How far does it go?",
                          "There are 7 days in a week. How many days are in 5 weeks?"}) {
      if (prompts.size() == count) break;
      prompts.push_back(tokenizer->encode(std::string("Question: ") + q + "\nAnswer:"));
    }
  }
};

}  // namespace qspec_test
