// NFC per UAX #15: decompose each code point fully (canonical mappings, recursively; Hangul
// S -> L V [T]), sort each run of non-starters stably by canonical combining class, then compose
// left to right: a character C combines with the last starter S when nothing between them blocks
// it (an intervening character with ccc 0 or ccc >= ccc(C)) and (S, C) is a primary composite.
#include "models/io/unicode_nfc.h"

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace kiln::io::unicode {

namespace {

struct CccRange {
  uint32_t lo, hi;
  uint8_t ccc;
};
struct Decomp {
  uint32_t cp, a, b;  // b == 0: singleton mapping
  uint8_t composes;   // 1: (a, b) recomposes to cp (a primary composite)
};
struct CpRange {
  uint32_t lo, hi;
};

#include "models/io/unicode_nfc_tables.inc"

// Hangul syllable arithmetic (Unicode ch. 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

// Invalid UTF-8 bytes travel through the pipeline as kRawByte | byte: ccc 0, no mapping.
constexpr uint32_t kRawByte = 0x80000000u;

bool in_ranges(uint32_t cp) {
  auto it = std::upper_bound(std::begin(kUnsafe), std::end(kUnsafe), cp,
                             [](uint32_t v, const CpRange& r) { return v < r.lo; });
  return it != std::begin(kUnsafe) && cp <= std::prev(it)->hi;
}

uint8_t ccc_of(uint32_t cp) {
  if (cp < 0x300 || (cp & kRawByte)) return 0;
  auto it = std::upper_bound(std::begin(kCcc), std::end(kCcc), cp,
                             [](uint32_t v, const CccRange& r) { return v < r.lo; });
  if (it == std::begin(kCcc)) return 0;
  --it;
  return cp <= it->hi ? it->ccc : 0;
}

const Decomp* decomp_of(uint32_t cp) {
  auto it = std::lower_bound(std::begin(kDecomp), std::end(kDecomp), cp,
                             [](const Decomp& d, uint32_t v) { return d.cp < v; });
  return it != std::end(kDecomp) && it->cp == cp ? it : nullptr;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  const Decomp* d = (cp & kRawByte) ? nullptr : decomp_of(cp);
  if (!d) {
    out.push_back(cp);
    return;
  }
  decompose(d->a, out);
  if (d->b) decompose(d->b, out);
}

// (a, b) -> primary composite, built once from the decomposition table.
const std::unordered_map<uint64_t, uint32_t>& composition_map() {
  static const std::unordered_map<uint64_t, uint32_t> map = [] {
    std::unordered_map<uint64_t, uint32_t> m;
    for (const Decomp& d : kDecomp)
      if (d.composes) m.emplace((uint64_t{d.a} << 32) | d.b, d.cp);
    return m;
  }();
  return map;
}

// The primary composite of (a, b), or 0.
uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  if ((a | b) & kRawByte) return 0;
  const auto& m = composition_map();
  auto it = m.find((uint64_t{a} << 32) | b);
  return it == m.end() ? 0 : it->second;
}

}  // namespace

int utf8_decode(std::string_view s, size_t i, char32_t& cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  int len;
  uint32_t v, min;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, v = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, v = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, v = b0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() - i < static_cast<size_t>(len)) return 0;
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  cp = v;
  return len;
}

void utf8_append(std::string& out, char32_t cp) {
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

bool quick_is_nfc(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    char32_t cp;
    int n = utf8_decode(s, i, cp);
    if (n == 0) {
      ++i;  // an invalid byte is passed through; it is not a reason to normalise
      continue;
    }
    if (cp >= 0x300 && in_ranges(cp)) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

std::string nfc(std::string_view s) {
  if (quick_is_nfc(s)) return std::string(s);
  // 1. Full canonical decomposition.
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    int n = utf8_decode(s, i, cp);
    if (n == 0) {
      cps.push_back(kRawByte | static_cast<unsigned char>(s[i]));
      ++i;
    } else {
      decompose(cp, cps);
      i += static_cast<size_t>(n);
    }
  }
  // 2. Canonical ordering: stable sort of every run of non-starters by ccc.
  for (size_t i = 0; i < cps.size();) {
    if (ccc_of(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && ccc_of(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + i, cps.begin() + j,
                     [](uint32_t a, uint32_t b) { return ccc_of(a) < ccc_of(b); });
    i = j;
  }
  // 3. Canonical composition. `last_cc` is the ccc of the last character kept after the starter
  // (-1: none yet), which is what decides blocking.
  std::vector<uint32_t> out;
  out.reserve(cps.size());
  long starter = -1;
  int last_cc = -1;
  for (uint32_t c : cps) {
    const int cc = ccc_of(c);
    if (starter >= 0 && (last_cc == -1 || last_cc < cc)) {
      if (uint32_t comp = compose_pair(out[static_cast<size_t>(starter)], c)) {
        out[static_cast<size_t>(starter)] = comp;
        continue;
      }
    }
    if (cc == 0) {
      starter = static_cast<long>(out.size());
      last_cc = -1;
    } else {
      last_cc = cc;
    }
    out.push_back(c);
  }
  std::string res;
  res.reserve(s.size());
  for (uint32_t c : out) {
    if (c & kRawByte)
      res.push_back(static_cast<char>(c & 0xFF));
    else
      utf8_append(res, c);
  }
  return res;
}

}  // namespace kiln::io::unicode
