// Unicode NFC (canonical decomposition, canonical ordering, canonical composition) on UTF-8,
// for tokenizers whose normaliser is NFC (Qwen2/Qwen3). Tables come from Python's unicodedata
// (models/io/gen_unicode_nfc.py -> unicode_nfc_tables.inc, Unicode 14.0.0); Hangul syllables
// are handled algorithmically. Covered: the full UAX #15 NFC algorithm for valid UTF-8.
// Not covered: code points assigned after Unicode 14 are treated as starters with no mapping.
// Invalid UTF-8 bytes pass through unchanged and block composition across them.
#pragma once

#include <string>
#include <string_view>

namespace kiln::io::unicode {

// True when `utf8` is certainly already NFC (no code point that NFC could change or combine).
bool quick_is_nfc(std::string_view utf8);

// The NFC form of `utf8`; returns the input unchanged when quick_is_nfc() holds.
std::string nfc(std::string_view utf8);

// Decodes the UTF-8 sequence at s[i]; returns its length (1..4) and sets cp, or returns 0 when the
// bytes there are not a valid, shortest-form, non-surrogate sequence.
int utf8_decode(std::string_view s, size_t i, char32_t& cp);

// Appends the UTF-8 encoding of cp (<= 0x10FFFF) to out.
void utf8_append(std::string& out, char32_t cp);

}  // namespace kiln::io::unicode
