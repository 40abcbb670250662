// BPE model: vocab + ranked merges, applied per pre-token with a priority queue over a linked
// list of symbols, with a per-word cache.
#include <cstdio>
#include <queue>

#include "base/limits.h"
#include "qspec/error.h"
#include "tokenizer/tokenizer_impl.h"

namespace qspec::tok {

namespace {
constexpr size_t kCacheCapacity = 1 << 16;
constexpr size_t kCacheMaxWord = 128;

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}
}  // namespace

Bpe::Bpe(const json& model, const std::string& file) {
  const std::string where = "tokenizer " + file + ": model";
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") fail("tokenizer ", file, ": unsupported model type '", type, "'");
  for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(field) && model[field].is_string() && !model[field].get<std::string>().empty())
      fail(where, ": unsupported BPE option ", field, " = '", model[field].get<std::string>(), "'");
  }
  const json& vocab = model.at("vocab");
  if (!vocab.is_object()) fail(where, ": vocab must be an object");
  vocab_.reserve(vocab.size());
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= kMaxVocabSize)
      fail(where, ": token '", it.key(), "' has id ", id, ", outside [0, ", kMaxVocabSize, ")");
    vocab_[it.key()] = static_cast<int32_t>(id);
    max_id = std::max(max_id, static_cast<int32_t>(id));
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [token, id] : vocab_) id_to_token_[id] = token;

  const json& merges = model.contains("merges") ? model["merges"] : json::array();
  merges_.reserve(merges.size());
  int32_t rank = 0;
  for (const json& merge : merges) {
    std::string left, right;
    if (merge.is_string()) {
      const std::string text = merge.get<std::string>();
      const size_t space = text.find(' ');
      if (space == std::string::npos) fail(where, ": merge '", text, "' is not 'a b'");
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      fail(where, ": merge #", rank, " must be \"a b\" or [a, b]");
    }
    const auto l = vocab_.find(left), r = vocab_.find(right), m = vocab_.find(left + right);
    if (l == vocab_.end() || r == vocab_.end() || m == vocab_.end())
      fail(where, ": merge '", left, " ", right, "' uses a token missing from the vocab");
    merges_.try_emplace(pair_key(l->second, r->second), rank, m->second);
    ++rank;
  }

  byte_fallback_ = model.value("byte_fallback", false);
  fuse_unk_ = model.value("fuse_unk", false);
  ignore_merges_ = model.value("ignore_merges", false);
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const auto it = vocab_.find(model["unk_token"].get<std::string>());
    if (it == vocab_.end())
      fail(where, ": unk_token '", model["unk_token"].get<std::string>(), "' is not in the vocab");
    unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    const auto it = vocab_.find(std::string_view(name));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
}

std::optional<int32_t> Bpe::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWord;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (const auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::string(word), std::move(ids));
  }
}

void Bpe::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1: none
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  bool last_unk = false;
  size_t pos = 0;
  while (pos < word.size()) {
    size_t next = pos;
    uint32_t cp;
    if (!utf8_next(word, next, cp)) next = pos + 1;  // cannot happen on sanitised text
    const std::string_view ch = word.substr(pos, next - pos);
    pos = next;
    if (const auto it = vocab_.find(ch); it != vocab_.end()) {
      symbols.push_back({it->second, 0, 0, true});
      last_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : ch) all = all && byte_ids_[c] >= 0;
      if (all) {
        for (unsigned char c : ch) symbols.push_back({byte_ids_[c], 0, 0, true});
        last_unk = false;
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (!(fuse_unk_ && last_unk)) symbols.push_back({unk_id_, 0, 0, true});
      last_unk = true;
    }
  }
  const int32_t n = static_cast<int32_t>(symbols.size());
  for (int32_t i = 0; i < n; ++i) {
    symbols[i].prev = i - 1;
    symbols[i].next = i + 1 < n ? i + 1 : -1;
  }

  struct Candidate {
    int32_t rank, left, right_id, left_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const auto it = merges_.find(pair_key(symbols[left].id, symbols[right].id));
    if (it != merges_.end())
      queue.push({it->second.first, left, symbols[right].id, symbols[left].id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.left];
    if (!left.alive || left.id != top.left_id || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    if (right.id != top.right_id) continue;
    const auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.first != top.rank) continue;
    left.id = it->second.second;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    consider(left.prev);
    consider(top.left);
  }
  for (int32_t i = 0; i < n && i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

}  // namespace qspec::tok
