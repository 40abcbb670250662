// StreamDecoder: per-token incremental decoding that holds back unfinished UTF-8 characters.
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace qspec {

std::string StreamDecoder::push(int32_t id) {
  ids_.push_back(id);
  tokenizer_.decode_step(id, skip_special_, state_, pending_);
  const size_t ready = pending_.size() - tok::incomplete_utf8_tail(pending_);
  if (ready == 0) return {};
  // Bytes before an unfinished character can never become valid any more: emit them, with
  // U+FFFD for invalid sequences, so that every returned piece is valid UTF-8.
  std::string out = tok::to_valid_utf8(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  emitted_bytes_ += out.size();
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = tok::to_valid_utf8(pending_);
  pending_.clear();
  emitted_bytes_ += out.size();
  return out;
}

}  // namespace qspec
