#include "io/gguf_writer.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "core/error.h"

namespace sluice {

namespace {

using nlohmann::json;

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}

void put_value(std::string& out, GgufType type, GgufType element, const json& v) {
  switch (type) {
    case GgufType::kU8:
      return put<uint8_t>(out, v.get<uint8_t>());
    case GgufType::kI8:
      return put<int8_t>(out, v.get<int8_t>());
    case GgufType::kU16:
      return put<uint16_t>(out, v.get<uint16_t>());
    case GgufType::kI16:
      return put<int16_t>(out, v.get<int16_t>());
    case GgufType::kU32:
      return put<uint32_t>(out, v.get<uint32_t>());
    case GgufType::kI32:
      return put<int32_t>(out, v.get<int32_t>());
    case GgufType::kF32:
      return put<float>(out, v.get<float>());
    case GgufType::kBool:
      return put<uint8_t>(out, v.get<bool>() ? 1 : 0);
    case GgufType::kString:
      return put_string(out, v.get<std::string>());
    case GgufType::kU64:
      return put<uint64_t>(out, v.get<uint64_t>());
    case GgufType::kI64:
      return put<int64_t>(out, v.get<int64_t>());
    case GgufType::kF64:
      return put<double>(out, v.get<double>());
    case GgufType::kArray:
      put<uint32_t>(out, uint32_t(element));
      put<uint64_t>(out, v.size());
      for (const auto& e : v) put_value(out, element, GgufType::kU8, e);
      return;
  }
}

size_t align_up(size_t x, size_t a) {
  return (x + a - 1) / a * a;
}

}  // namespace

void GgufWriter::add(const std::string& key, GgufType type, json value, GgufType element) {
  kvs_.push_back({key, type, element, std::move(value)});
}

void GgufWriter::add_tensor(const std::string& name, uint32_t type, Shape dims,
                            std::vector<uint8_t> bytes) {
  auto data = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  add_tensor(name, type, std::move(dims), data->size(),
             [data](const Sink& sink) { sink(data->data(), data->size()); });
}

void GgufWriter::add_tensor(const std::string& name, uint32_t type, Shape dims, size_t bytes,
                            Producer produce) {
  tensors_.push_back({name, type, std::move(dims), bytes, std::move(produce)});
}

void GgufWriter::replace(const std::string& key, GgufType type, json value) {
  remove(key);
  add(key, type, std::move(value));
}

void GgufWriter::remove(const std::string& key) {
  std::erase_if(kvs_, [&](const Kv& kv) { return kv.key == key; });
}

void GgufWriter::retype_tensor(const std::string& name, uint32_t type) {
  for (Tensor& t : tensors_)
    if (t.name == name) t.type = type;
}

void GgufWriter::remove_tensor(const std::string& name) {
  std::erase_if(tensors_, [&](const Tensor& t) { return t.name == name; });
}

void GgufWriter::redim_tensor(const std::string& name, Shape dims) {
  for (Tensor& t : tensors_)
    if (t.name == name) t.dims = std::move(dims);
}

bool GgufWriter::has_tensor(const std::string& name) const {
  for (const Tensor& t : tensors_)
    if (t.name == name) return true;
  return false;
}

std::string GgufWriter::header_and_infos(size_t alignment, uint32_t version) const {
  std::string out;
  put<uint32_t>(out, 0x46554747);
  put<uint32_t>(out, version);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, kvs_.size());
  for (const Kv& kv : kvs_) {
    put_string(out, kv.key);
    put<uint32_t>(out, uint32_t(kv.type));
    put_value(out, kv.type, kv.element, kv.value);
  }
  size_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(out, t.name);
    put<uint32_t>(out, uint32_t(t.dims.size()));
    for (int64_t d : t.dims) put<uint64_t>(out, uint64_t(d));
    put<uint32_t>(out, t.type);
    put<uint64_t>(out, offset);
    offset = align_up(offset + t.bytes, alignment);
  }
  return out;
}

size_t GgufWriter::tensor_type_field_offset(size_t index) const {
  // Rebuild the header up to tensor `index`'s info and add its name and dims.
  GgufWriter head = *this;
  head.tensors_.resize(index);
  const std::string before = head.header_and_infos(32, 3);
  // The tensor count in the header is the same width whatever its value.
  const Tensor& t = tensors_[index];
  return before.size() + 8 + t.name.size() + 4 + 8 * t.dims.size();
}

void GgufWriter::write_to(const Sink& out, size_t alignment, uint32_t version) const {
  const std::string zeros(alignment, '\0');
  auto pad = [&](size_t written) {
    if (written % alignment) out(zeros.data(), alignment - written % alignment);
  };
  const std::string head = header_and_infos(alignment, version);
  out(head.data(), head.size());
  pad(head.size());
  for (const Tensor& t : tensors_) {
    size_t written = 0;
    t.produce([&](const void* data, size_t bytes) {
      out(data, bytes);
      written += bytes;
    });
    if (written != t.bytes)
      throw Error(fmt::format("GGUF tensor '{}': {} bytes were written where its info says {}",
                              t.name, written, t.bytes));
    pad(written);
  }
}

std::string GgufWriter::image(size_t alignment, uint32_t version) const {
  std::string out;
  write_to(
      [&](const void* data, size_t bytes) { out.append(static_cast<const char*>(data), bytes); },
      alignment, version);
  return out;
}

void GgufWriter::write(const std::filesystem::path& path, size_t alignment) const {
  std::vector<char> buffer(size_t(8) << 20);  // outlives the FILE that uses it
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  auto fail = [&] {
    throw Error(fmt::format("{}: cannot write: {}", path.string(), std::strerror(errno)));
  };
  if (!f) fail();
  std::setvbuf(f.get(), buffer.data(), _IOFBF, buffer.size());
  write_to(
      [&](const void* data, size_t bytes) {
        if (std::fwrite(data, 1, bytes, f.get()) != bytes) fail();
      },
      alignment, 3);
  if (std::fclose(f.release()) != 0) fail();
}

}  // namespace sluice
