#include "io/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace sluice {

using nlohmann::json;

Tensor TensorEntry::view() const {
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  t.data = const_cast<std::byte*>(file->data() + offset);
  t.owner = file;
  return t;
}

void TensorEntry::read_in() const {
  read_into_memory(file->data() + offset, nbytes, file->path());
}

void TensorEntry::drop_pages() const {
  file->drop_pages(offset, nbytes);
}

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit is 100 MB

TensorEntry parse_entry(const std::string& file, const std::string& name, const json& j,
                        size_t data_start, size_t data_size) {
  if (!j.is_object()) fail("{}: tensor '{}': expected an object in the header", file, name);
  TensorEntry e;
  e.name = name;
  if (!j.contains("dtype") || !j["dtype"].is_string())
    fail("{}: tensor '{}': field 'dtype' missing or not a string", file, name);
  std::string dtype = j["dtype"];
  auto parsed = parse_dtype(dtype);
  if (!parsed)
    fail("{}: tensor '{}': unknown dtype '{}' (supported: F32, F16, BF16, I32, I64, U8)", file,
         name, dtype);
  e.dtype = *parsed;
  if (!j.contains("shape") || !j["shape"].is_array())
    fail("{}: tensor '{}': field 'shape' missing or not an array", file, name);
  for (const auto& d : j["shape"]) {
    if (!d.is_number_unsigned())
      fail("{}: tensor '{}': shape {} has an entry that is not a non-negative integer", file, name,
           j["shape"].dump());
    e.shape.push_back(d.get<int64_t>());
  }
  const json& off = j.contains("data_offsets") ? j["data_offsets"] : json();
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned())
    fail("{}: tensor '{}': field 'data_offsets' must be two non-negative integers", file, name);
  uint64_t begin = off[0], end = off[1];
  if (begin > end)
    fail("{}: tensor '{}': data_offsets [{}, {}] end before they begin", file, name, begin, end);
  if (end > data_size)
    fail("{}: tensor '{}': data_offsets [{}, {}] run past the end of the data ({} bytes)", file,
         name, begin, end, data_size);
  size_t expected = size_t(shape_numel(e.shape)) * dtype_size(e.dtype);
  if (end - begin != expected)
    fail("{}: tensor '{}': data_offsets [{}, {}] hold {} bytes, but {} {} needs {}", file, name,
         begin, end, end - begin, dtype, shape_str(e.shape), expected);
  e.offset = data_start + begin;
  e.nbytes = expected;
  return e;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile f;
  f.file_ = MappedFile::open(path);
  const std::string name = path.string();
  size_t size = f.file_->size();
  if (size < 8) fail("{}: truncated: {} bytes, too short for the 8-byte header length", name, size);
  uint64_t header_len = 0;
  std::memcpy(&header_len, f.file_->data(), 8);  // little-endian, as is every supported host
  if (header_len > size - 8)
    fail("{}: header length {} is larger than the {} bytes that follow it", name, header_len,
         size - 8);
  if (header_len > kMaxHeaderBytes)
    fail("{}: header length {} exceeds the 100 MB limit", name, header_len);
  const char* text = reinterpret_cast<const char*>(f.file_->data() + 8);
  json header = json::parse(text, text + header_len, nullptr, false);
  if (header.is_discarded() || !header.is_object()) fail("{}: header is not a JSON object", name);
  size_t data_start = 8 + header_len;
  size_t data_size = size - data_start;

  for (auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail("{}: '__metadata__' must be an object", name);
      for (auto& [mk, mv] : value.items())
        f.metadata_[mk] = mv.is_string() ? mv.get<std::string>() : mv.dump();
      continue;
    }
    f.tensors_[key] = parse_entry(name, key, value, data_start, data_size);
  }

  // Tensors must not share bytes.
  std::vector<const TensorEntry*> by_offset;
  for (auto& [_, e] : f.tensors_)
    if (e.nbytes > 0) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorEntry* prev = by_offset[i - 1];
    const TensorEntry* cur = by_offset[i];
    if (prev->offset + prev->nbytes > cur->offset)
      fail("{}: tensors '{}' and '{}' overlap in the data section", name, prev->name, cur->name);
  }
  for (auto& [_, e] : f.tensors_) e.file = f.file_;
  return f;
}

Checkpoint Checkpoint::open(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) fail("{}: not a model folder", dir.string());
  Checkpoint c;
  fs::path index = dir / "model.safetensors.index.json";
  fs::path single = dir / "model.safetensors";
  if (fs::exists(index)) {
    std::ifstream in(index);
    json j = json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object()) fail("{}: not valid JSON", index.string());
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      fail("{}: field 'weight_map' missing or not an object", index.string());
    std::map<std::string, SafetensorsFile> shards;
    for (auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string())
        fail("{}: weight_map['{}'] must be a file name", index.string(), tensor);
      std::string shard = file;
      if (shard.find('/') != std::string::npos || shard == "..")
        fail("{}: weight_map['{}'] = '{}' is not a plain file name", index.string(), tensor, shard);
      if (!shards.count(shard)) {
        shards.emplace(shard, SafetensorsFile::open(dir / shard));
        c.files_.push_back(dir / shard);
      }
      const auto& in_shard = shards.at(shard).tensors();
      auto it = in_shard.find(tensor);
      if (it == in_shard.end())
        fail("{}: index says tensor '{}' is in this file, but it is not", (dir / shard).string(),
             tensor);
      c.tensors_[tensor] = it->second;
    }
  } else if (fs::exists(single)) {
    SafetensorsFile f = SafetensorsFile::open(single);
    c.files_.push_back(single);
    c.tensors_ = f.tensors();
  } else {
    fail("{}: no model.safetensors or model.safetensors.index.json", dir.string());
  }
  return c;
}

const TensorEntry* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

SafetensorsWriter::SafetensorsWriter(const std::filesystem::path& path,
                                     std::vector<TensorSpec> specs,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), specs_(std::move(specs)) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& s : specs_) {
    size_t bytes = size_t(shape_numel(s.shape)) * dtype_size(s.dtype);
    header[s.name] = {{"dtype", dtype_name(s.dtype)},
                      {"shape", s.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  total_bytes_ = offset;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  out_ = std::fopen(path.c_str(), "wb");
  if (!out_) fail("{}: cannot create: {}", path.string(), std::strerror(errno));
  uint64_t len = text.size();
  if (std::fwrite(&len, 8, 1, out_) != 1 || std::fwrite(text.data(), 1, len, out_) != len)
    fail("{}: write failed: {}", path.string(), std::strerror(errno));
}

SafetensorsWriter::~SafetensorsWriter() {
  if (out_) std::fclose(out_);
}

void SafetensorsWriter::write(const void* data, size_t nbytes) {
  if (written_ + nbytes > total_bytes_)
    fail("{}: writing {} bytes past the {} declared", path_.string(), written_ + nbytes,
         total_bytes_);
  if (std::fwrite(data, 1, nbytes, out_) != nbytes)
    fail("{}: write failed: {}", path_.string(), std::strerror(errno));
  written_ += nbytes;
}

void SafetensorsWriter::finish() {
  if (written_ != total_bytes_)
    fail("{}: {} of {} declared bytes written", path_.string(), written_, total_bytes_);
  if (std::fclose(out_) != 0) {
    out_ = nullptr;
    fail("{}: close failed: {}", path_.string(), std::strerror(errno));
  }
  out_ = nullptr;
}

}  // namespace sluice
