// The decode plan's rules (include/qspec/decode_plan.h): the one validate every caller uses.
#include "qspec/decode_plan.h"

#include <sstream>

#include "qspec/error.h"
#include "quant/quantized_linear.h"

namespace qspec {

std::vector<std::string> DecodePlan::modes() const {
  if (qspec()) return {verify, draft};
  return {mode};
}

void validate(const DecodePlan& plan, std::string_view field_prefix) {
  using namespace decode_rules;
  const std::string p(field_prefix);
  auto check = [&](bool ok, const char* field, auto&&... message) {
    if (ok) return;
    std::ostringstream text;
    text << p << field << ": ";
    (text << ... << message);
    throw DecodePlanError(field, text.str());
  };
  auto known = [&](const std::string& name, const char* field) {
    try {
      return parse_run_mode(name);
    } catch (const Error& e) {
      check(false, field, e.what());
      throw;
    }
  };
  if (!plan.qspec()) {
    known(plan.mode, "mode");
    return;
  }
  const RunMode verify = known(plan.verify, "verify");
  check(verify.quantized_weights, "verify", "the target mode ", plan.verify,
        " must run the 4-bit weights (QSpec keeps one weight set)");
  const RunMode draft = known(plan.draft, "draft");
  check(draft.quantized_weights && draft.activations.kind == ActivationMode::Kind::quantized, "draft", plan.draft,
        " is not a low-precision activation mode on the 4-bit weights (w4a8, w4a8-fp8, w4a4-*)");
  check(plan.gamma >= 1 && plan.gamma <= kMaxGamma, "gamma", "must be in 1..", kMaxGamma, ", got ", plan.gamma);
  check(!plan.adaptive_gamma || (plan.max_gamma >= plan.gamma && plan.max_gamma <= kMaxGamma), "max_gamma",
        "must be in gamma..", kMaxGamma, " (gamma ", plan.gamma, "), got ", plan.max_gamma);
}

}  // namespace qspec
