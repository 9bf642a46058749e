// A read-only memory mapping of a whole file. Weight bytes are used in place, never copied.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>

namespace sluice {

class MappedFile {
 public:
  static std::shared_ptr<MappedFile> open(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }
  // Drops the pages of [offset, offset + bytes) from this process's resident memory
  // (MADV_DONTNEED), once their bytes were copied or repacked elsewhere. The mapping is
  // read-only and shared, so no byte is lost: a later read faults a page in again, from the page
  // cache or the file. The range is widened to whole 2 MiB blocks (a page cache of large folios
  // maps those whole), so the first and last may hold a neighbouring tensor's bytes, which a read
  // of that tensor then faults in again.
  void drop_pages(size_t offset, size_t bytes) const;

 private:
  MappedFile() = default;
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// Reads the pages of [data, data + bytes) of a mapping into memory now and maps them
// (MADV_POPULATE_READ, or a read of every page where the kernel lacks it), so later reads neither
// fault nor wait for the disk. `path` names the file in the error.
void read_into_memory(const void* data, size_t bytes, const std::filesystem::path& path);

}  // namespace sluice
