#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"

namespace sluice {

std::shared_ptr<MappedFile> MappedFile::open(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path.string(), std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path.string());
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = size_t(st.st_size);
  if (file->size_ > 0) {
    void* p = mmap(nullptr, file->size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      fail("{}: cannot mmap {} bytes: {}", path.string(), file->size_, std::strerror(err));
    }
    file->data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
  return file;
}

void read_into_memory(const void* data, size_t bytes, const std::filesystem::path& path) {
  if (bytes == 0) return;
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = uintptr_t(data) / page * page;
  const uintptr_t end = (uintptr_t(data) + bytes + page - 1) / page * page;
  void* start = reinterpret_cast<void*>(begin);
  madvise(start, end - begin, MADV_WILLNEED);  // readahead of the whole range, in large requests
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14
#endif
  if (madvise(start, end - begin, MADV_POPULATE_READ) == 0) return;
  if (errno != EINVAL)
    fail("{}: cannot read {} bytes into memory: {}", path.string(), bytes, std::strerror(errno));
  volatile unsigned char sink = 0;
  for (uintptr_t p = begin; p < end; p += page) sink = *reinterpret_cast<const unsigned char*>(p);
  (void)sink;
}

void MappedFile::drop_pages(size_t offset, size_t bytes) const {
  if (bytes == 0 || offset >= size_) return;
  // Whole 2 MiB blocks: a page cache of large folios (ext4 on recent kernels) maps them whole,
  // and a partial MADV_DONTNEED leaves such a block resident.
  constexpr size_t kBlock = size_t(2) << 20;
  const size_t begin = offset / kBlock * kBlock;
  const size_t end = std::min(size_, (offset + bytes + kBlock - 1) / kBlock * kBlock);
  madvise(const_cast<std::byte*>(data_) + begin, end - begin, MADV_DONTNEED);  // only a hint
}

std::vector<FileMapping> file_mappings(const std::filesystem::path& path) {
  std::error_code ec;
  const std::string name = std::filesystem::weakly_canonical(path, ec).string();
  std::vector<FileMapping> found;
  std::ifstream smaps("/proc/self/smaps");
  bool inside = false;  // the lines after a header of one of `path`'s mappings
  for (std::string line; std::getline(smaps, line);) {
    std::istringstream fields(line);
    std::string first;
    fields >> first;
    if (first.empty()) continue;
    if (first.back() != ':') {  // a mapping's header: "begin-end perms offset dev inode path"
      std::string perms, offset, dev, inode, mapped;
      fields >> perms >> offset >> dev >> inode;
      std::getline(fields >> std::ws, mapped);
      inside = !mapped.empty() && mapped == name;
      if (inside) {
        const size_t dash = first.find('-');
        found.push_back({.begin = std::stoull(first.substr(0, dash), nullptr, 16),
                         .end = std::stoull(first.substr(dash + 1), nullptr, 16)});
      }
      continue;
    }
    size_t kib = 0;
    if (!inside || !(fields >> kib)) continue;
    if (first == "Rss:") found.back().resident = kib << 10;
    if (first == "FilePmdMapped:") found.back().in_huge_pages = kib << 10;
  }
  return found;
}

bool page_cache_has_huge_folios() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    size_t kib = 0;
    meminfo >> kib;
    if (key == "FileHugePages:") return kib > 0;
    meminfo.ignore(1 << 10, '\n');
  }
  return false;
}

void drop_from_page_cache(const std::filesystem::path& path,
                          const std::vector<FileMapping>& mappings) {
  for (const FileMapping& m : mappings)
    madvise(reinterpret_cast<void*>(m.begin), m.end - m.begin, MADV_DONTNEED);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);  // dirty pages, just written, would stay in the page cache
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) munmap(const_cast<std::byte*>(data_), size_);
}

}  // namespace sluice
