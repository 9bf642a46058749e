#include "io/direct_reader.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/clock.h"
#include "core/error.h"

namespace sluice {

namespace {

uint64_t block_floor(uint64_t x) { return x / kDirectAlign * kDirectAlign; }
uint64_t block_ceil(uint64_t x) { return (x + kDirectAlign - 1) / kDirectAlign * kDirectAlign; }

// One read's progress: the block-aligned span it reads and the bytes of it that arrived.
struct Progress {
  uint64_t begin = 0, length = 0, needed = 0, got = 0;
};

Progress progress_of(const FileRead& r) {
  Progress p;
  p.begin = block_floor(r.offset);
  p.length = block_ceil(r.offset + r.bytes) - p.begin;
  p.needed = r.offset + r.bytes - p.begin;
  return p;
}

}  // namespace

size_t direct_buffer_bytes(uint64_t offset, size_t bytes) {
  return size_t(block_ceil(offset + bytes) - block_floor(offset));
}

struct DirectReader::Ring {
  io_uring ring{};
  ~Ring() { io_uring_queue_exit(&ring); }
};

DirectReader::DirectReader(std::vector<std::filesystem::path> files, int queue_depth)
    : paths_(std::move(files)), queue_depth_(std::max(1, queue_depth)) {
  std::string refused;
  for (const auto& path : paths_) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd < 0 && errno == EINVAL) {  // the file system has no O_DIRECT (tmpfs)
      refused = path.parent_path().string();
      direct_ = false;
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0) {
      const int err = errno;
      for (int open_fd : fds_) ::close(open_fd);
      fail("{}: cannot open: {}", path.string(), std::strerror(err));
    }
    fds_.push_back(fd);
  }
  auto ring = std::make_unique<Ring>();
  const int err = io_uring_queue_init(unsigned(queue_depth_), &ring->ring, 0);
  std::string ring_note;
  if (err == 0)
    ring_ = std::move(ring);
  else
    ring_note = fmt::format("pread (io_uring is not available: {})", std::strerror(-err));
  note_ = ring_ ? fmt::format("{} reads through io_uring, {} in flight",
                              direct_ ? "O_DIRECT" : "page-cache", queue_depth_)
                : ring_note;
  if (!direct_)
    note_ += fmt::format("; the file system of {} refuses O_DIRECT, so the reads go through the "
                         "page cache",
                         refused);
}

DirectReader::~DirectReader() {
  for (int fd : fds_) ::close(fd);
}

void DirectReader::fail_short(const FileRead& r, uint64_t file_end) const {
  struct stat st {};
  const int fd = fds_[size_t(r.file)];
  const long long size = fstat(fd, &st) == 0 ? (long long)st.st_size : -1;
  fail("{}: {} bytes at offset {} were expected, but the file ends at offset {} (now {} bytes): "
       "was it truncated or replaced while the job ran?",
       paths_[size_t(r.file)].string(), r.bytes, r.offset, file_end, size);
}

void DirectReader::check(const FileRead& r) const {
  if (r.file < 0 || size_t(r.file) >= fds_.size() ||
      reinterpret_cast<uintptr_t>(r.buffer) % kDirectAlign != 0)
    fail("DirectReader: read {} at offset {}: expected a file index below {} and a buffer "
         "aligned to {} bytes",
         r.file, r.offset, fds_.size(), kDirectAlign);
}

void DirectReader::read(std::span<const FileRead> reads, const std::function<void(size_t)>& done) {
  for (const FileRead& r : reads) check(r);
  size_t next = 0;
  read_stream(
      [&]() -> std::optional<TaggedRead> {
        if (next == reads.size()) return std::nullopt;
        const size_t i = next++;
        return TaggedRead{reads[i], i};
      },
      [&](uint64_t i) { done(size_t(i)); });
}

void DirectReader::read_stream(const std::function<std::optional<TaggedRead>()>& next,
                               const std::function<void(uint64_t)>& done) {
  auto checked = [&]() -> std::optional<TaggedRead> {
    std::optional<TaggedRead> r = next();
    if (r) check(r->read);
    return r;
  };
  if (ring_)
    read_with_uring(checked, done);
  else
    read_with_pread(checked, done);
}

void DirectReader::read_with_pread(const std::function<std::optional<TaggedRead>()>& next,
                                   const std::function<void(uint64_t)>& done) {
  while (std::optional<TaggedRead> t = next()) {
    const FileRead& r = t->read;
    Progress p = progress_of(r);
    while (p.got < p.needed) {
      const ssize_t n = ::pread(fds_[size_t(r.file)], r.buffer + p.got, p.length - p.got,
                                off_t(p.begin + p.got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        fail("{}: read of {} bytes at offset {} failed: {}", paths_[size_t(r.file)].string(),
             r.bytes, r.offset, std::strerror(errno));
      p.got += uint64_t(n);
      if (p.got < p.needed && (n == 0 || uint64_t(n) % kDirectAlign != 0))
        fail_short(r, p.begin + p.got);
    }
    done(t->tag);
  }
}

// Up to queue_depth reads in flight, refilled from `next` as each lands; a read that returns
// part of its span is resubmitted for the rest. An error is raised after the reads in flight
// have landed, so no buffer is written later.
void DirectReader::read_with_uring(const std::function<std::optional<TaggedRead>()>& next,
                                   const std::function<void(uint64_t)>& done) {
  io_uring* ring = &ring_->ring;
  struct InFlight {
    TaggedRead t;
    Progress p;
  };
  std::vector<InFlight> slots(static_cast<size_t>(queue_depth_));  // one per read in flight
  std::vector<size_t> free_slots;
  for (size_t i = slots.size(); i-- > 0;) free_slots.push_back(i);
  std::string error;
  auto submit = [&](size_t slot) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    if (!sqe)
      fail("io_uring: no free submission entry with {} reads in flight",
           slots.size() - free_slots.size());
    const InFlight& f = slots[slot];
    io_uring_prep_read(sqe, fds_[size_t(f.t.read.file)], f.t.read.buffer + f.p.got,
                       unsigned(f.p.length - f.p.got), f.p.begin + f.p.got);
    io_uring_sqe_set_data64(sqe, slot);
  };
  for (;;) {
    while (error.empty() && !free_slots.empty()) {
      std::optional<TaggedRead> t;
      try {  // a refused read waits, as a failed one does, for those in flight to land
        t = next();
      } catch (const Error& e) {
        error = e.what();
        break;
      }
      if (!t) break;
      const size_t slot = free_slots.back();
      free_slots.pop_back();
      slots[slot] = {*t, progress_of(t->read)};
      submit(slot);
    }
    if (free_slots.size() == slots.size()) break;  // nothing in flight, nothing to start
    const int s = io_uring_submit_and_wait(ring, 1);
    if (s < 0 && s != -EINTR) fail("io_uring: submit failed: {}", std::strerror(-s));
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(ring, &cqe) == 0) {
      const size_t slot = size_t(io_uring_cqe_get_data64(cqe));
      const int res = cqe->res;
      io_uring_cqe_seen(ring, cqe);
      InFlight& f = slots[slot];
      const FileRead& r = f.t.read;
      if (res == -EINTR || res == -EAGAIN) {
        submit(slot);
        continue;
      }
      if (res < 0) {
        if (error.empty())
          error = fmt::format("{}: read of {} bytes at offset {} failed: {}",
                              paths_[size_t(r.file)].string(), r.bytes, r.offset,
                              std::strerror(-res));
        free_slots.push_back(slot);
        continue;
      }
      f.p.got += uint64_t(res);
      if (f.p.got >= f.p.needed) {
        free_slots.push_back(slot);
        if (error.empty()) done(f.t.tag);
      } else if (res == 0 || res % int(kDirectAlign) != 0) {
        free_slots.push_back(slot);
        if (error.empty()) {
          try {
            fail_short(r, f.p.begin + f.p.got);
          } catch (const Error& e) {
            error = e.what();
          }
        }
      } else {
        submit(slot);
      }
    }
  }
  if (!error.empty()) fail("{}", error);
}

double settled_rate(const std::function<double()>& pass, int max_passes) {
  double last = pass();
  for (int taken = 1; taken < max_passes; ++taken) {
    const double rate = pass();
    if (std::abs(rate - last) <= 0.1 * last || taken + 1 == max_passes) return std::max(rate, last);
    last = rate;
  }
  return last;
}

std::optional<double> measure_read_rate(const std::vector<std::filesystem::path>& files,
                                        std::vector<FileRead> ranges, int depth, int max_passes,
                                        std::string* why) {
  size_t largest = 0;
  double bytes = 0;
  for (const FileRead& r : ranges) {
    largest = std::max(largest, direct_buffer_bytes(kDirectAlign - 1, r.bytes));
    bytes += double(direct_buffer_bytes(r.offset, r.bytes));
  }
  // Read i lands in buffer i % depth whether or not an earlier read into it is still in flight.
  std::unique_ptr<std::byte, decltype(&std::free)> buffers(
      static_cast<std::byte*>(std::aligned_alloc(kDirectAlign, size_t(depth) * largest)),
      &std::free);
  for (size_t i = 0; i < ranges.size(); ++i)
    ranges[i].buffer = buffers.get() + (i % size_t(depth)) * largest;
  try {
    DirectReader reader(files, depth);
    if (!reader.direct()) {
      if (why) *why = reader.note();
      return std::nullopt;
    }
    return settled_rate(
        [&] {
          const auto t = Clock::now();
          reader.read(ranges, [](size_t) {});
          return bytes / seconds_since(t);
        },
        max_passes);
  } catch (const Error& e) {
    if (why) *why = e.what();
    return std::nullopt;
  }
}

}  // namespace sluice
