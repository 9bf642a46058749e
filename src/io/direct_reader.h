// Reads byte ranges of files into memory with O_DIRECT through io_uring, several reads in flight,
// bypassing the page cache: the bytes land once, in the caller's buffer, and the kernel keeps no
// second copy. O_DIRECT wants the file offset, the length and the buffer aligned to the block
// size, so a range is read from the block that holds its first byte to the block after its last:
// its data starts `offset % kDirectAlign` bytes into the buffer.
//
// Where a file system refuses O_DIRECT (tmpfs) the files are read through the page cache instead,
// and where io_uring is not available (a kernel or seccomp filter without it) with pread; note()
// says which. A read that ends early (the file was truncated while the job runs) or fails is an
// error naming the file and the offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace sluice {

inline constexpr size_t kDirectAlign = 4096;

struct FileRead {
  int file = 0;             // index into the reader's files
  uint64_t offset = 0;      // of the range's first byte in the file
  size_t bytes = 0;         // of the range
  std::byte* buffer = nullptr;  // kDirectAlign-aligned, at least direct_buffer_bytes(offset, bytes)
};

// Buffer bytes a FileRead of `bytes` at `offset` needs: whole blocks around the range.
size_t direct_buffer_bytes(uint64_t offset, size_t bytes);
// Where the range's first byte is in the buffer after the read.
inline const std::byte* direct_data(const FileRead& r) {
  return r.buffer + r.offset % kDirectAlign;
}

class DirectReader {
 public:
  DirectReader(std::vector<std::filesystem::path> files, int queue_depth);
  ~DirectReader();
  DirectReader(const DirectReader&) = delete;
  DirectReader& operator=(const DirectReader&) = delete;

  // Reads every range, up to queue_depth at a time, calling `done(i)` on this thread as read i
  // completes. Throws (after the reads in flight have finished) on an error or a short read.
  void read(std::span<const FileRead> reads, const std::function<void(size_t)>& done);

  // A stream of reads, the queue kept full: `next()` is asked for another read whenever fewer
  // than queue_depth are in flight (it must not block; nullopt: none now), and `done(tag)` is
  // called on this thread as each read completes. Returns once `next()` has none and no read is
  // in flight; throws as read() does, after the reads in flight have landed.
  struct TaggedRead {
    FileRead read;
    uint64_t tag = 0;
  };
  void read_stream(const std::function<std::optional<TaggedRead>()>& next,
                   const std::function<void(uint64_t)>& done);

  bool direct() const { return direct_; }    // every file opened with O_DIRECT
  bool uring() const { return ring_ != nullptr; }
  // How the files are read, in words: "O_DIRECT through io_uring", or what fell back and why.
  const std::string& note() const { return note_; }
  const std::vector<std::filesystem::path>& files() const { return paths_; }

 private:
  struct Ring;
  void check(const FileRead& r) const;
  void read_with_pread(const std::function<std::optional<TaggedRead>()>& next,
                       const std::function<void(uint64_t)>& done);
  void read_with_uring(const std::function<std::optional<TaggedRead>()>& next,
                       const std::function<void(uint64_t)>& done);
  // The error of read `r` finding the file's end at `file_end`, before the range's end.
  [[noreturn]] void fail_short(const FileRead& r, uint64_t file_end) const;

  std::vector<std::filesystem::path> paths_;
  std::vector<int> fds_;
  int queue_depth_;
  bool direct_ = true;
  std::unique_ptr<Ring> ring_;
  std::string note_;
};

// The O_DIRECT read rate of `ranges` of `files` (their buffers are not used: what is read is
// discarded into `depth` scratch buffers), `depth` reads in flight: bytes of whole blocks a
// second. With `max_passes` above 1, passes are read until one comes within 10% of the pass before
// it (or `max_passes` are read), and the faster of those last two is the rate: a disk's first pass
// can be slower than its sustained rate (a VM's host caches what was read) or faster (a throttle,
// or a drive's cache, lets a burst through after idling). Nullopt, with `why`, when a file refuses
// O_DIRECT or a read fails.
std::optional<double> measure_read_rate(const std::vector<std::filesystem::path>& files,
                                        std::vector<FileRead> ranges, int depth, int max_passes,
                                        std::string* why);

// measure_read_rate's rule over passes: `pass()` measures one pass's rate; passes are taken until
// one comes within 10% of the one before it, or `max_passes` (at least 1) are taken, and the faster
// of the last two is returned (the only one, for one pass).
double settled_rate(const std::function<double()>& pass, int max_passes);

}  // namespace sluice
