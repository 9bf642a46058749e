// UTF-8 and byte-level helpers shared by the tokenizer pieces.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace sluice::tok {

// Length of the UTF-8 sequence that starts with `lead` (1 for a stray continuation byte).
size_t utf8_sequence_length(unsigned char lead);
// Length of the prefix of `s` made of complete, valid UTF-8 characters, except that a trailing
// incomplete-but-valid-so-far sequence is excluded and an invalid sequence ends the prefix.
size_t complete_utf8_prefix(std::string_view s);
// Whether `s` ends inside a multi-byte character that more bytes could still complete.
bool ends_with_incomplete_utf8(std::string_view s);
// `s` with every invalid UTF-8 sequence replaced by U+FFFD (as Rust's from_utf8_lossy).
std::string utf8_lossy(std::string_view s);
bool is_valid_utf8(std::string_view s);
void append_utf8(std::string& out, char32_t cp);
// Decodes the character at `s[i]`, advancing i; invalid bytes decode as U+FFFD, one byte each.
char32_t next_codepoint(std::string_view s, size_t& i);

// GPT-2's reversible map of bytes to printable characters (byte-level BPE works on these).
const std::array<std::string, 256>& byte_to_unicode();
// The byte a byte-level character stands for, or -1 when it is not one of the 256.
int unicode_to_byte(char32_t cp);
std::string bytes_to_byte_level(std::string_view bytes);
// Inverse of bytes_to_byte_level; characters outside the map are copied unchanged.
std::string byte_level_to_bytes(std::string_view text);

// Unicode normalization form C (through ICU); `where` names the file for errors.
std::string nfc(std::string_view text, std::string_view where);

}  // namespace sluice::tok
