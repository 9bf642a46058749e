#include "io/gguf.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <regex>

#include "core/error.h"

namespace sluice {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF", little-endian
constexpr int kMaxDims = 4;              // GGML_MAX_DIMS

// Bounds-checked little-endian cursor over the mapped file.
class Cursor {
 public:
  Cursor(const std::byte* data, size_t size, std::string where)
      : data_(data), size_(size), where_(std::move(where)) {}

  template <class T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const std::string& what) {
    const auto n = read<uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  size_t pos() const { return pos_; }
  const std::string& where() const { return where_; }

 private:
  void need(uint64_t n, const std::string& what) {
    if (n > size_ - pos_)
      fail("{}: field '{}': the file ends early (needs {} bytes at offset {}, the file has {})",
           where_, what, n, pos_, size_);
  }
  const std::byte* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string where_;
};

nlohmann::json read_scalar(Cursor& c, GgufType type, const std::string& key) {
  switch (type) {
    case GgufType::kU8:
      return c.read<uint8_t>(key);
    case GgufType::kI8:
      return c.read<int8_t>(key);
    case GgufType::kU16:
      return c.read<uint16_t>(key);
    case GgufType::kI16:
      return c.read<int16_t>(key);
    case GgufType::kU32:
      return c.read<uint32_t>(key);
    case GgufType::kI32:
      return c.read<int32_t>(key);
    case GgufType::kF32:
      return c.read<float>(key);
    case GgufType::kBool: {
      const auto b = c.read<uint8_t>(key);
      if (b > 1) fail("{}: key '{}': a bool must be 0 or 1, got {}", c.where(), key, b);
      return b != 0;
    }
    case GgufType::kString:
      return c.read_string(key);
    case GgufType::kU64:
      return c.read<uint64_t>(key);
    case GgufType::kI64:
      return c.read<int64_t>(key);
    case GgufType::kF64:
      return c.read<double>(key);
    case GgufType::kArray:
      break;
  }
  fail("{}: key '{}': unknown GGUF value type {}", c.where(), key, uint32_t(type));
}

GgufValue read_value(Cursor& c, GgufType type, const std::string& key, int depth = 0) {
  GgufValue v;
  v.type = type;
  if (type != GgufType::kArray) {
    v.value = read_scalar(c, type, key);
    return v;
  }
  if (depth > 4) fail("{}: key '{}': arrays nested deeper than 4 levels", c.where(), key);
  v.element = GgufType(c.read<uint32_t>(key + " (array element type)"));
  const auto n = c.read<uint64_t>(key + " (array length)");
  v.value = nlohmann::json::array();
  // No reserve(n): n comes from the file; every element read is bounds-checked instead.
  for (uint64_t i = 0; i < n; ++i)
    v.value.push_back(read_value(c, v.element, key, depth + 1).value);
  return v;
}

size_t align_up(size_t x, size_t a) {
  return (x + a - 1) / a * a;
}

GgufTensorInfo read_tensor_info(Cursor& c, uint64_t index) {
  GgufTensorInfo t;
  t.name = c.read_string(fmt::format("tensor_infos[{}].name", index));
  const std::string field = fmt::format("tensor '{}'", t.name);
  const auto n_dims = c.read<uint32_t>(field + " n_dims");
  if (n_dims == 0 || n_dims > kMaxDims)
    fail("{}: {}: field 'n_dims': expected 1 to {}, got {}", c.where(), field, kMaxDims, n_dims);
  int64_t numel = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    const auto ne = c.read<uint64_t>(field + " dims");
    if (ne == 0 || ne > (uint64_t(1) << 40) || numel > (int64_t(1) << 50) / int64_t(ne))
      fail("{}: {}: field 'dims': dimension {} is {}, expected a positive size", c.where(), field,
           d, ne);
    t.dims.push_back(int64_t(ne));
    numel *= int64_t(ne);
  }
  t.type = c.read<uint32_t>(field + " type");
  t.offset = c.read<uint64_t>(field + " offset");
  const auto info = ggml_type_info(t.type);
  if (!info)
    fail(
        "{}: {}: field 'type': ggml type {} is not supported (sluice loads F32, F16, BF16, Q8_0, "
        "Q4_0, Q4_K, Q5_K and Q6_K)",
        c.where(), field, ggml_type_name(t.type));
  if (t.dims[0] % info->block_elements != 0)
    fail("{}: {}: field 'dims': the row length {} is not a multiple of {}'s block of {}", c.where(),
         field, t.dims[0], info->name, info->block_elements);
  t.nbytes = size_t(numel / info->block_elements) * info->block_bytes;
  return t;
}

}  // namespace

const char* gguf_type_name(GgufType t) {
  static const char* const names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                      "bool", "string", "array", "u64", "i64", "f64"};
  return uint32_t(t) < std::size(names) ? names[uint32_t(t)] : "unknown";
}

std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type) {
  switch (GgmlType(type)) {
    case GgmlType::F32:
      return GgmlTypeInfo{"F32", 1, 4};
    case GgmlType::F16:
      return GgmlTypeInfo{"F16", 1, 2};
    case GgmlType::BF16:
      return GgmlTypeInfo{"BF16", 1, 2};
    case GgmlType::Q4_0:
      return GgmlTypeInfo{"Q4_0", 32, 18};  // f16 scale, 16 bytes of nibbles
    case GgmlType::Q4_1:
      return GgmlTypeInfo{"Q4_1", 32, 20};
    case GgmlType::Q5_0:
      return GgmlTypeInfo{"Q5_0", 32, 22};
    case GgmlType::Q5_1:
      return GgmlTypeInfo{"Q5_1", 32, 24};
    case GgmlType::Q8_0:
      return GgmlTypeInfo{"Q8_0", 32, 34};  // f16 scale, 32 int8
    case GgmlType::Q8_1:
      return GgmlTypeInfo{"Q8_1", 32, 36};
    case GgmlType::Q2_K:
      return GgmlTypeInfo{"Q2_K", 256, 84};
    case GgmlType::Q3_K:
      return GgmlTypeInfo{"Q3_K", 256, 110};
    case GgmlType::Q4_K:
      return GgmlTypeInfo{"Q4_K", 256, 144};
    case GgmlType::Q5_K:
      return GgmlTypeInfo{"Q5_K", 256, 176};
    case GgmlType::Q6_K:
      return GgmlTypeInfo{"Q6_K", 256, 210};
    case GgmlType::Q8_K:
      return GgmlTypeInfo{"Q8_K", 256, 292};
  }
  return std::nullopt;
}

std::string ggml_type_name(uint32_t type) {
  if (const auto info = ggml_type_info(type)) return info->name;
  // Types sluice cannot even size, named as ggml names them.
  static const std::map<uint32_t, const char*> others = {
      {16, "IQ2_XXS"}, {17, "IQ2_XS"}, {18, "IQ3_XXS"}, {19, "IQ1_S"}, {20, "IQ4_NL"},
      {21, "IQ3_S"},   {22, "IQ2_S"},  {23, "IQ4_XS"},  {24, "I8"},    {25, "I16"},
      {26, "I32"},     {27, "I64"},    {28, "F64"},     {29, "IQ1_M"}, {34, "TQ1_0"},
      {35, "TQ2_0"},   {39, "MXFP4"}};
  const auto it = others.find(type);
  return it != others.end() ? fmt::format("{} ({})", it->second, type)
                            : fmt::format("{} (unknown)", type);
}

GgufFile GgufFile::parse(std::shared_ptr<MappedFile> file) {
  GgufFile g = parse_image(file->data(), file->size(), file->path().string());
  for (auto& [name, t] : g.tensors_) t.file = file;
  return g;
}

GgufFile GgufFile::parse_image(const std::byte* data, size_t size, const std::string& where) {
  GgufFile g;
  g.path_ = where;
  g.parts_ = {where};
  Cursor c(data, size, where);
  if (c.read<uint32_t>("magic") != kMagic)
    fail("{}: field 'magic': expected 'GGUF', this is not a GGUF file", c.where());
  g.version_ = c.read<uint32_t>("version");
  if (g.version_ < 2 || g.version_ > 3)
    fail("{}: field 'version': expected 2 or 3, got {}", c.where(), g.version_);
  const auto tensor_count = c.read<uint64_t>("tensor_count");
  const auto kv_count = c.read<uint64_t>("metadata_kv_count");

  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key = c.read_string(fmt::format("metadata[{}].key", i));
    const auto type = GgufType(c.read<uint32_t>(key + " (value type)"));
    GgufValue v = read_value(c, type, key);
    if (!g.metadata_.emplace(key, std::move(v)).second)
      fail("{}: key '{}' appears twice in the metadata", c.where(), key);
  }

  size_t alignment = 32;
  if (g.find("general.alignment")) {
    const int64_t a = g.required_integer("general.alignment");
    if (a <= 0 || (a & (a - 1)) != 0 || a > (1 << 20))
      fail("{}: key 'general.alignment': expected a power of two, got {}", c.where(), a);
    alignment = size_t(a);
  }

  std::vector<GgufTensorInfo> infos;
  for (uint64_t i = 0; i < tensor_count; ++i) infos.push_back(read_tensor_info(c, i));
  const size_t data_start = align_up(c.pos(), alignment);
  const size_t data_size = size >= data_start ? size - data_start : 0;
  for (GgufTensorInfo& t : infos) {
    if (t.offset % alignment != 0)
      fail("{}: tensor '{}': field 'offset': {} is not a multiple of the alignment {}", c.where(),
           t.name, t.offset, alignment);
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      fail(
          "{}: tensor '{}': field 'offset': its {} bytes at data offset {} run past the end of "
          "the file (the data section holds {} bytes); the file is truncated or corrupt",
          c.where(), t.name, t.nbytes, t.offset, data_size);
    t.offset += data_start;
    t.base = data;
    std::string name = t.name;
    if (!g.tensors_.emplace(name, std::move(t)).second)
      fail("{}: tensor '{}' appears twice", c.where(), name);
  }
  return g;
}

GgufFile GgufFile::open(const std::filesystem::path& path) {
  GgufFile g = parse(MappedFile::open(path));
  // name-00001-of-00003.gguf: the other parts sit beside it.
  static const std::regex split(R"((.*)-(\d{5})-of-(\d{5})\.gguf)");
  std::smatch m;
  const std::string name = path.filename().string();
  if (!std::regex_match(name, m, split)) return g;
  const int part = std::stoi(m[2]), count = std::stoi(m[3]);
  if (part != 1)
    fail("{}: this is part {} of a split GGUF model; pass the first part ({}-00001-of-{}.gguf)",
         path.string(), part, m[1].str(), m[3].str());
  if (const auto n = g.integer("split.count"); n && *n != count)
    fail("{}: key 'split.count': {} parts, but the file name says {}", path.string(), *n, count);
  for (int p = 2; p <= count; ++p) {
    const auto other =
        path.parent_path() / fmt::format("{}-{:05}-of-{}.gguf", m[1].str(), p, m[3].str());
    if (!std::filesystem::exists(other))
      fail("{}: part {} of {} of the split GGUF model is missing", other.string(), p, count);
    g.merge_part(parse(MappedFile::open(other)));
  }
  return g;
}

void GgufFile::merge_part(GgufFile part) {
  for (auto& [name, t] : part.tensors_)
    if (!tensors_.emplace(name, t).second)
      fail("{}: tensor '{}' is also in {}", part.path_.string(), name, path_.string());
  parts_.push_back(part.path_);
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  const auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

std::optional<int64_t> GgufFile::integer(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (!v->value.is_number_integer())
    fail("{}: key '{}': expected an integer, got GGUF type {}", path_.string(), key,
         gguf_type_name(v->type));
  if (v->value.is_number_unsigned() && v->value.get<uint64_t>() > uint64_t(INT64_MAX))
    fail("{}: key '{}': {} is too large", path_.string(), key, v->value.get<uint64_t>());
  return v->value.get<int64_t>();
}

std::optional<double> GgufFile::number(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (!v->value.is_number())
    fail("{}: key '{}': expected a number, got GGUF type {}", path_.string(), key,
         gguf_type_name(v->type));
  return v->value.get<double>();
}

std::optional<bool> GgufFile::boolean(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (!v->value.is_boolean())
    fail("{}: key '{}': expected a bool, got GGUF type {}", path_.string(), key,
         gguf_type_name(v->type));
  return v->value.get<bool>();
}

std::optional<std::string> GgufFile::string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (!v->value.is_string())
    fail("{}: key '{}': expected a string, got GGUF type {}", path_.string(), key,
         gguf_type_name(v->type));
  return v->value.get<std::string>();
}

int64_t GgufFile::required_integer(const std::string& key) const {
  const auto v = integer(key);
  if (!v) fail("{}: key '{}' is missing from the GGUF metadata", path_.string(), key);
  return *v;
}

std::string GgufFile::required_string(const std::string& key) const {
  const auto v = string(key);
  if (!v) fail("{}: key '{}' is missing from the GGUF metadata", path_.string(), key);
  return *v;
}

bool is_gguf_file(const std::filesystem::path& path) {
  if (!std::filesystem::is_regular_file(path)) return false;
  if (path.extension() == ".gguf") return true;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace sluice
