#include "io/gguf_vocab.h"

#include <cstring>

#include "core/error.h"
#include "core/mapped_file.h"

namespace sluice {

namespace {

enum ValueType : uint32_t {
  kU8 = 0,
  kI8,
  kU16,
  kI16,
  kU32,
  kI32,
  kF32,
  kBool,
  kString,
  kArray,
  kU64,
  kI64,
  kF64,
};

// Bounds-checked little-endian cursor over the mapped file.
class Cursor {
 public:
  Cursor(const std::byte* data, size_t size, std::string where)
      : data_(data), size_(size), where_(std::move(where)) {}

  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    const auto n = read<uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  void skip_value(uint32_t type, const std::string& key) {
    switch (type) {
      case kU8:
      case kI8:
      case kBool:
        skip(1, key);
        break;
      case kU16:
      case kI16:
        skip(2, key);
        break;
      case kU32:
      case kI32:
      case kF32:
        skip(4, key);
        break;
      case kU64:
      case kI64:
      case kF64:
        skip(8, key);
        break;
      case kString:
        read_string(key.c_str());
        break;
      case kArray: {
        const auto elem = read<uint32_t>(key.c_str());
        const auto n = read<uint64_t>(key.c_str());
        for (uint64_t i = 0; i < n; ++i) skip_value(elem, key);
        break;
      }
      default:
        fail("{}: key '{}': unknown GGUF value type {}", where_, key, type);
    }
  }
  // Reads an integer of any integer type as int64.
  int64_t read_integer(uint32_t type, const std::string& key) {
    switch (type) {
      case kU8:
        return read<uint8_t>(key.c_str());
      case kI8:
        return read<int8_t>(key.c_str());
      case kU16:
        return read<uint16_t>(key.c_str());
      case kI16:
        return read<int16_t>(key.c_str());
      case kU32:
        return read<uint32_t>(key.c_str());
      case kI32:
        return read<int32_t>(key.c_str());
      case kU64:
        return static_cast<int64_t>(read<uint64_t>(key.c_str()));
      case kI64:
        return read<int64_t>(key.c_str());
      default:
        fail("{}: key '{}': expected an integer, got GGUF type {}", where_, key, type);
    }
  }
  const std::string& where() const { return where_; }

 private:
  void need(uint64_t n, const char* what) {
    if (n > size_ - pos_)
      fail("{}: field '{}': file ends early (needs {} bytes at offset {}, size {})", where_, what,
           n, pos_, size_);
  }
  void skip(size_t n, const std::string& key) {
    need(n, key.c_str());
    pos_ += n;
  }
  const std::byte* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string where_;
};

template <class T, class ReadOne>
std::vector<T> read_array(Cursor& c, uint32_t type, const std::string& key, uint32_t want_elem,
                          ReadOne read_one) {
  if (type != kArray)
    fail("{}: key '{}': expected an array, got GGUF type {}", c.where(), key, type);
  const auto elem = c.read<uint32_t>(key.c_str());
  const auto n = c.read<uint64_t>(key.c_str());
  if (elem != want_elem)
    fail("{}: key '{}': expected array elements of GGUF type {}, got {}", c.where(), key, want_elem,
         elem);
  std::vector<T> out;
  out.reserve(n);
  for (uint64_t i = 0; i < n; ++i) out.push_back(read_one());
  return out;
}

}  // namespace

GgufVocab read_gguf_vocab(const std::filesystem::path& path) {
  const auto file = MappedFile::open(path);
  Cursor c(file->data(), file->size(), path.string());
  const auto magic = c.read<uint32_t>("magic");
  if (magic != 0x46554747)  // "GGUF"
    fail("{}: field 'magic': expected 'GGUF', this is not a GGUF file", path.string());
  const auto version = c.read<uint32_t>("version");
  if (version < 2 || version > 3)
    fail("{}: field 'version': expected 2 or 3, got {}", path.string(), version);
  c.read<uint64_t>("tensor_count");
  const auto kv_count = c.read<uint64_t>("metadata_kv_count");

  GgufVocab v;
  for (uint64_t i = 0; i < kv_count; ++i) {
    const std::string key = c.read_string("metadata key");
    const auto type = c.read<uint32_t>(key.c_str());
    auto want = [&](uint32_t t) {
      if (type != t)
        fail("{}: key '{}': expected GGUF type {}, got {}", path.string(), key, t, type);
    };
    if (key == "tokenizer.ggml.model") {
      want(kString);
      v.model = c.read_string(key.c_str());
    } else if (key == "tokenizer.ggml.pre") {
      want(kString);
      v.pre = c.read_string(key.c_str());
    } else if (key == "tokenizer.chat_template") {
      want(kString);
      v.chat_template = c.read_string(key.c_str());
    } else if (key == "tokenizer.ggml.tokens") {
      v.tokens = read_array<std::string>(c, type, key, kString,
                                         [&] { return c.read_string(key.c_str()); });
    } else if (key == "tokenizer.ggml.merges") {
      v.merges = read_array<std::string>(c, type, key, kString,
                                         [&] { return c.read_string(key.c_str()); });
    } else if (key == "tokenizer.ggml.scores") {
      v.scores = read_array<float>(c, type, key, kF32, [&] { return c.read<float>(key.c_str()); });
    } else if (key == "tokenizer.ggml.token_type") {
      v.token_types =
          read_array<int32_t>(c, type, key, kI32, [&] { return c.read<int32_t>(key.c_str()); });
    } else if (key == "tokenizer.ggml.bos_token_id") {
      v.bos_id = static_cast<int32_t>(c.read_integer(type, key));
    } else if (key == "tokenizer.ggml.eos_token_id") {
      v.eos_id = static_cast<int32_t>(c.read_integer(type, key));
    } else if (key == "tokenizer.ggml.unknown_token_id") {
      v.unk_id = static_cast<int32_t>(c.read_integer(type, key));
    } else if (key == "tokenizer.ggml.add_bos_token") {
      want(kBool);
      v.add_bos = c.read<uint8_t>(key.c_str()) != 0;
    } else if (key == "tokenizer.ggml.add_eos_token") {
      want(kBool);
      v.add_eos = c.read<uint8_t>(key.c_str()) != 0;
    } else if (key == "tokenizer.ggml.add_space_prefix") {
      want(kBool);
      v.add_space_prefix = c.read<uint8_t>(key.c_str()) != 0;
    } else {
      c.skip_value(type, key);
    }
  }
  if (v.tokens.empty())
    fail("{}: key 'tokenizer.ggml.tokens': missing; this GGUF file has no vocabulary",
         path.string());
  const auto n = v.tokens.size();
  if (!v.scores.empty() && v.scores.size() != n)
    fail("{}: key 'tokenizer.ggml.scores': expected {} entries, got {}", path.string(), n,
         v.scores.size());
  if (!v.token_types.empty() && v.token_types.size() != n)
    fail("{}: key 'tokenizer.ggml.token_type': expected {} entries, got {}", path.string(), n,
         v.token_types.size());
  for (int32_t id : {v.bos_id, v.eos_id, v.unk_id})
    if (id >= static_cast<int64_t>(n))
      fail("{}: special token id {} is outside the vocabulary of {} tokens", path.string(), id, n);
  return v;
}

}  // namespace sluice
