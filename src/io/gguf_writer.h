// Writing GGUF files (io/gguf.h's format): the header, typed metadata, one info per tensor and
// the aligned data. A tensor's bytes are given whole or produced when the file is written, piece
// by piece, so a file of any size is written in memory bounded by the largest piece.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/gguf.h"

namespace sluice {

class GgufWriter {
 public:
  using Sink = std::function<void(const void* data, size_t bytes)>;
  // Hands a tensor's bytes, in order, to the sink; called once, by write() or image().
  using Producer = std::function<void(const Sink& sink)>;

  void add(const std::string& key, GgufType type, nlohmann::json value,
           GgufType element = GgufType::kU8);
  // `dims` fastest-first (ggml's ne); `bytes` the tensor's data in ggml type `type`.
  void add_tensor(const std::string& name, uint32_t type, Shape dims, std::vector<uint8_t> bytes);
  // A tensor of `bytes` bytes that `produce` writes when the file is (an error names the tensor
  // when it writes another count).
  void add_tensor(const std::string& name, uint32_t type, Shape dims, size_t bytes,
                  Producer produce);

  // Edits, for files of other kinds (tests of bad files): replace a key's value (adding it when
  // absent), drop a key, change a tensor's declared type or dims (its bytes stay).
  void replace(const std::string& key, GgufType type, nlohmann::json value);
  void remove(const std::string& key);
  void retype_tensor(const std::string& name, uint32_t type);
  void remove_tensor(const std::string& name);
  void redim_tensor(const std::string& name, Shape dims);
  bool has_tensor(const std::string& name) const;

  // The whole file in memory. `alignment` pads the data section and each tensor; `version` the
  // header's.
  std::string image(size_t alignment = 32, uint32_t version = 3) const;
  // The file at `path`, tensor by tensor; an error names the path when it cannot be written.
  void write(const std::filesystem::path& path, size_t alignment = 32) const;

  // The offset of tensor `index`'s info in image(): the position of its 'type' field (the
  // offset field follows it, 4 bytes later).
  size_t tensor_type_field_offset(size_t index) const;

 private:
  struct Kv {
    std::string key;
    GgufType type, element;
    nlohmann::json value;
  };
  struct Tensor {
    std::string name;
    uint32_t type;
    Shape dims;
    size_t bytes;
    Producer produce;
  };
  std::string header_and_infos(size_t alignment, uint32_t version) const;
  void write_to(const Sink& out, size_t alignment, uint32_t version) const;
  std::vector<Kv> kvs_;
  std::vector<Tensor> tensors_;
};

}  // namespace sluice
