// A read-only memory mapping of a whole file. Weight bytes are used in place, never copied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

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

// One mapping of a file in this process, as /proc/self/smaps reports it.
struct FileMapping {
  uintptr_t begin = 0, end = 0;  // its addresses
  size_t resident = 0;           // bytes mapped now (Rss)
  size_t in_huge_pages = 0;      // of which mapped 2 MiB at a time (FilePmdMapped)
};

// This process's mappings of `path` (none where /proc/self/smaps cannot be read).
std::vector<FileMapping> file_mappings(const std::filesystem::path& path);

// Whether this machine's page cache holds any file's pages in 2 MiB folios now (FileHugePages of
// /proc/meminfo): its filesystems can then read files into them.
bool page_cache_has_huge_folios();

// Unmaps `mappings` (this process's mappings of `path`; a later read faults the pages in again,
// no byte is lost: they are read-only and shared), writes back the file's dirty pages and drops
// its pages from the page cache, so that the next read comes from the file, in whatever folios
// the kernel's readahead makes now (2 MiB ones on ext4 from Linux 6.x). Pages that another
// process maps stay. Only a hint to the kernel: nothing fails.
void drop_from_page_cache(const std::filesystem::path& path,
                          const std::vector<FileMapping>& mappings);

}  // namespace sluice
