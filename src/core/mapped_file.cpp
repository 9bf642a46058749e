#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

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

MappedFile::~MappedFile() {
  if (data_) munmap(const_cast<std::byte*>(data_), size_);
}

}  // namespace sluice
