#include "io/results_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "io/batch_format.h"

namespace sluice {
namespace {

std::string read_all(int fd, const std::string& path) {
  std::string bytes;
  char buffer[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("{}: cannot read: {}", path, std::strerror(errno));
    if (n == 0) return bytes;
    bytes.append(buffer, size_t(n));
  }
}

}  // namespace

ResultsFile::ResultsFile(const std::filesystem::path& path) : path_(path.string()) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("{}: cannot open the output file for writing: {}", path_, std::strerror(errno));
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode))
      fail("{}: the output is not a regular file", path_);
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0)
      fail("{}: another job is writing this output file (it is locked)", path_);

    std::string bytes = read_all(fd_, path_);
    const size_t keep = bytes.rfind('\n') == std::string::npos ? 0 : bytes.rfind('\n') + 1;
    if (keep < bytes.size()) {
      // The last write was cut short: its request never counted as done, so drop the fragment
      // and let this run compute it again.
      if (::ftruncate(fd_, off_t(keep)) != 0)
        fail("{}: cannot cut the torn last line: {}", path_, std::strerror(errno));
      torn_bytes_ = bytes.size() - keep;
      bytes.resize(keep);
    }
    size_t start = 0;
    for (int line_number = 1; start < bytes.size(); ++line_number) {
      const size_t end = bytes.find('\n', start);
      std::string_view line(bytes.data() + start, end - start);
      start = end + 1;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      auto result = read_result_line(line);
      if (!result)
        fail(
            "{}:{}: expected a result line (a JSON object with a string 'custom_id'); is this "
            "the output of an earlier `sluice run`?",
            path_, line_number);
      recorded_[result->custom_id] = result->failed;
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

ResultsFile::~ResultsFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ResultsFile::append(std::string_view line) {
  // One write() per line: the kernel appends it whole unless the process dies inside the call or
  // the disk fills, and the torn-line cut on the next open handles both.
  size_t written = 0;
  while (written < line.size()) {
    ssize_t n = ::write(fd_, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("{}: cannot write a result: {}", path_, std::strerror(errno));
    written += size_t(n);
  }
}

}  // namespace sluice
