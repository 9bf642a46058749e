// The safetensors format: an 8-byte little-endian header length N, N bytes of JSON describing
// each tensor ({"name": {"dtype", "shape", "data_offsets": [begin, end]}}), then the data.
// Files are mapped, validated strictly (every error names the file and the tensor), and tensors
// are handed out as views into the mapping. A checkpoint is one file or a sharded set with an
// index (`model.safetensors.index.json`).
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/tensor.h"

namespace sluice {

struct TensorEntry {
  std::string name;
  DType dtype;
  Shape shape;
  size_t offset = 0;  // from the start of the file
  size_t nbytes = 0;
  std::shared_ptr<MappedFile> file;

  Tensor view() const;  // a Tensor pointing into the mapping, keeping it alive
  // Its bytes of the mapping read in now, in large reads rather than page faults
  // (read_into_memory), before a copy or a conversion reads them all.
  void read_in() const;
  // Its pages of the mapping dropped from this process (MappedFile::drop_pages), once copied or
  // converted elsewhere and not read again.
  void drop_pages() const;
};

class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);

  const std::map<std::string, TensorEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::filesystem::path& path() const { return file_->path(); }

 private:
  std::shared_ptr<MappedFile> file_;
  std::map<std::string, TensorEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model folder, from `model.safetensors` or a sharded index.
class Checkpoint {
 public:
  static Checkpoint open(const std::filesystem::path& model_dir);

  const TensorEntry* find(const std::string& name) const;
  const std::map<std::string, TensorEntry>& tensors() const { return tensors_; }
  const std::vector<std::filesystem::path>& files() const { return files_; }

 private:
  std::vector<std::filesystem::path> files_;
  std::map<std::string, TensorEntry> tensors_;
};

// Writes a safetensors file whose tensors are declared up front and then streamed in order,
// so a checkpoint of any size is written with memory bounded by one chunk.
struct TensorSpec {
  std::string name;
  DType dtype;
  Shape shape;
};

class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::filesystem::path& path, std::vector<TensorSpec> specs,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends bytes of the current tensor; tensors must be completed in declaration order.
  void write(const void* data, size_t nbytes);
  // Checks that every declared byte was written and closes the file.
  void finish();

 private:
  std::filesystem::path path_;
  std::vector<TensorSpec> specs_;
  std::FILE* out_ = nullptr;
  size_t total_bytes_ = 0;
  size_t written_ = 0;
};

}  // namespace sluice
