// The GGUF format of llama.cpp: a header ("GGUF", version 2 or 3, tensor and key counts), typed
// metadata key/values, one info per tensor (name, dims listed fastest-first, ggml type, offset
// into the data section), padding to general.alignment (32 by default), then the data. A split
// model (name-00001-of-00003.gguf) is one such file per part, the metadata in the first.
// Files are mapped and validated strictly: every error names the file and the field or tensor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/tensor.h"

namespace sluice {

// GGUF metadata value types.
enum class GgufType : uint32_t {
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
const char* gguf_type_name(GgufType t);

// One metadata value: its GGUF type (and the element type of an array) and the value as JSON
// (integers, floats, booleans, strings, arrays of them).
struct GgufValue {
  GgufType type = GgufType::kU8;
  GgufType element = GgufType::kU8;  // arrays only
  nlohmann::json value;
};

// ggml's tensor types (ggml.h's enum ggml_type; the ids are the file format's).
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  BF16 = 30,
};

// Elements per block and bytes per block of a ggml type; nullopt for a type this reader does not
// know (its tensors cannot even be sized).
struct GgmlTypeInfo {
  const char* name;
  int64_t block_elements;
  size_t block_bytes;
};
std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type);
std::string ggml_type_name(uint32_t type);  // "Q4_K", or "type 23" for one not known here

struct GgufTensorInfo {
  std::string name;
  Shape dims;         // as stored: dims[0] is the row length (ggml's ne[0])
  uint32_t type;      // GgmlType id
  size_t offset = 0;  // from the start of the file
  size_t nbytes = 0;
  std::shared_ptr<MappedFile> file;  // null for an image parsed from memory
  const std::byte* base = nullptr;   // the start of the file's bytes

  // The row-major shape: dims reversed ([ne[n-1], ..., ne[0]]), as PyTorch held the tensor.
  Shape shape() const { return Shape(dims.rbegin(), dims.rend()); }
  const std::byte* data() const { return base + offset; }
};

class GgufFile {
 public:
  // Opens one GGUF file, or every part of a split model given its first part.
  static GgufFile open(const std::filesystem::path& path);
  // Parses a mapped GGUF file: header, metadata and tensor infos.
  static GgufFile parse(std::shared_ptr<MappedFile> file);
  // The same over bytes in memory, which must outlive the result; `where` names them in errors.
  static GgufFile parse_image(const std::byte* data, size_t size, const std::string& where);

  const std::filesystem::path& path() const { return path_; }
  const std::vector<std::filesystem::path>& parts() const { return parts_; }
  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::map<std::string, GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  const GgufValue* find(const std::string& key) const;

  // Typed reads of metadata; each error names the file and the key.
  std::optional<int64_t> integer(const std::string& key) const;
  std::optional<double> number(const std::string& key) const;  // any integer or float
  std::optional<bool> boolean(const std::string& key) const;
  std::optional<std::string> string(const std::string& key) const;
  int64_t required_integer(const std::string& key) const;
  std::string required_string(const std::string& key) const;

 private:
  void merge_part(GgufFile part);
  std::filesystem::path path_;
  std::vector<std::filesystem::path> parts_;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::map<std::string, GgufTensorInfo> tensors_;
};

// True when `path` names a GGUF file (by its extension or its magic).
bool is_gguf_file(const std::filesystem::path& path);

}  // namespace sluice
