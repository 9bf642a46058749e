#include "io/staged_output.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "core/error.h"

namespace sluice {
namespace fs = std::filesystem;
namespace {

// Built with fmt: GCC 12 warns (-Wrestrict, a false positive) on "." + std::string.
std::string partial_prefix(const fs::path& final_dir) {
  return fmt::format(".{}.partial-", final_dir.filename().string());
}

// Partial siblings whose process no longer runs: a kill -9 left them.
void remove_stale_partials(const fs::path& final_dir) {
  const std::string prefix = partial_prefix(final_dir);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(final_dir.parent_path(), ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix)) continue;
    const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid > 0 && ::kill(pid_t(pid), 0) != 0 && errno == ESRCH) fs::remove_all(entry.path(), ec);
  }
}

}  // namespace

void write_file_atomically(const fs::path& path, std::string_view bytes) {
  const fs::path tmp =
      path.parent_path() / fmt::format(".{}.partial-{}", path.filename().string(), ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      fail("{}: cannot write: {}", path.string(), std::strerror(errno));
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    fail("{}: cannot put the written file in place: {}", path.string(), ec.message());
  }
}

StagedDirectory::StagedDirectory(const fs::path& final_dir)
    : final_(fs::absolute(final_dir).lexically_normal()) {
  if (final_.filename().empty()) final_ = final_.parent_path();
  if (fs::exists(final_) && !(fs::is_directory(final_) && fs::is_empty(final_)))
    fail("{}: exists and is not an empty folder; choose a new folder (or remove this one)",
         final_dir.string());
  fs::create_directories(final_.parent_path());
  remove_stale_partials(final_);
  staging_ = final_.parent_path() / (partial_prefix(final_) + std::to_string(::getpid()));
  fs::remove_all(staging_);
  fs::create_directory(staging_);
}

StagedDirectory::~StagedDirectory() {
  std::error_code ec;
  if (!committed_) fs::remove_all(staging_, ec);
}

void StagedDirectory::commit() {
  std::error_code ec;
  if (fs::exists(final_)) fs::remove(final_, ec);  // the empty folder it may replace
  fs::rename(staging_, final_, ec);
  if (ec) fail("{}: cannot put the written folder in place: {}", final_.string(), ec.message());
  committed_ = true;
}

}  // namespace sluice
