// UTF-8 helpers, the GPT-2 byte-level alphabet and the NFC quick-check.
#include <algorithm>
#include <array>

#include "tokenizer/tokenizer_impl.h"

namespace qspec::tok {

bool utf8_next(std::string_view text, size_t& pos, uint32_t& code_point) {
  const size_t n = text.size();
  if (pos >= n) return false;
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = byte(pos);
  if (lead < 0x80) {
    code_point = lead;
    pos += 1;
    return true;
  }
  size_t length;
  uint32_t cp;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    cp = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    cp = lead & 0x0F;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    cp = lead & 0x07;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return false;
  }
  if (pos + length > n) return false;
  for (size_t i = 1; i < length; ++i) {
    const uint8_t b = byte(pos + i);
    if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return false;
    cp = (cp << 6) | (b & 0x3F);
  }
  code_point = cp;
  pos += length;
  return true;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_valid_utf8(std::string_view text) {
  size_t pos = 0;
  uint32_t cp;
  while (pos < text.size()) {
    if (!utf8_next(text, pos, cp)) return false;
  }
  return true;
}

namespace {
// Bytes of the maximal subpart of an ill-formed sequence starting at pos (at least 1).
size_t maximal_subpart(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = byte(pos);
  size_t length;
  uint8_t lo = 0x80, hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  size_t i = 1;
  for (; i < length && pos + i < text.size(); ++i) {
    const uint8_t b = byte(pos + i);
    if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
  }
  return i;
}
}  // namespace

size_t incomplete_utf8_tail(std::string_view text) {
  // A character is at most 4 bytes: look at the last 3 bytes for an unfinished lead.
  const size_t n = text.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t start = n - back;
    const uint8_t b = static_cast<uint8_t>(text[start]);
    if (b < 0x80) return 0;
    if (b >= 0xC0) {
      // Lead byte: incomplete when its subpart runs to the end and is shorter than needed.
      const size_t need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
      if (need > back && maximal_subpart(text, start) == back && b >= 0xC2 && b <= 0xF4)
        return back;
      return 0;
    }
  }
  return 0;
}

std::string to_valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t next = pos;
    uint32_t cp;
    if (utf8_next(text, next, cp)) {
      out.append(text.data() + pos, next - pos);
      pos = next;
    } else {
      out += "\xEF\xBF\xBD";
      pos += maximal_subpart(text, pos);
    }
  }
  return out;
}

bool is_unicode_whitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

namespace {
struct ByteTables {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 512> from_cp{};  // all byte-level code points are < 0x144
  ByteTables() {
    from_cp.fill(-1);
    uint32_t extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_cp[b] = printable ? static_cast<uint32_t>(b) : extra++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteTables& byte_tables() {
  static const ByteTables tables;
  return tables;
}
}  // namespace

uint32_t byte_to_code_point(uint8_t byte) { return byte_tables().to_cp[byte]; }
int code_point_to_byte(uint32_t cp) { return cp < 512 ? byte_tables().from_cp[cp] : -1; }

// ---- NFC quick check ----
// The tables come from tools-free generation with Python's unicodedata:
//   NotYes: code points c with normalize('NFC', c) != c, the second character of every
//   primary composite (and Hangul V/T jamo); CombiningClass: unicodedata.combining(c) != 0.
namespace {
struct CodeRange {
  uint32_t first, last, value;
};
#include "tokenizer/nfc_tables.inc"

uint32_t lookup(const CodeRange* begin, const CodeRange* end, uint32_t cp) {
  const CodeRange* it =
      std::upper_bound(begin, end, cp, [](uint32_t c, const CodeRange& r) { return c < r.first; });
  if (it == begin) return 0;
  --it;
  return cp <= it->last ? it->value : 0;
}
}  // namespace

bool is_nfc_quick(std::string_view text) {
  size_t pos = 0;
  uint32_t cp;
  uint32_t last_class = 0;
  while (pos < text.size()) {
    const uint8_t lead = static_cast<uint8_t>(text[pos]);
    if (lead < 0x80) {  // ASCII: always NFC, class 0
      ++pos;
      last_class = 0;
      continue;
    }
    if (!utf8_next(text, pos, cp)) return false;
    if (cp < 0x300) {
      last_class = 0;
      continue;
    }
    if (lookup(std::begin(kNfcNotYes), std::end(kNfcNotYes), cp)) return false;
    const uint32_t cls = lookup(std::begin(kCombiningClass), std::end(kCombiningClass), cp);
    if (cls != 0 && cls < last_class) return false;
    last_class = cls;
  }
  return true;
}

}  // namespace qspec::tok
