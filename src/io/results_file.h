// The output file of a batch job, written so that a job killed at any moment (kill -9 included)
// can be rerun to completion: each result is one line appended with a single write(), and on
// open a torn last line (a write cut short) is cut away before anything else is read. The
// custom_ids already recorded are then skipped by the rerun, so nothing finished is lost and
// nothing is written twice. (Durability against power loss would need an fsync per line; this
// covers the process dying, not the machine.)
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>

namespace sluice {

class ResultsFile {
 public:
  // Opens or creates `path` for appending and takes an exclusive lock on it (a second job on the
  // same file fails instead of interleaving). Fails when a complete line is not a result line.
  explicit ResultsFile(const std::filesystem::path& path);
  ~ResultsFile();
  ResultsFile(const ResultsFile&) = delete;
  ResultsFile& operator=(const ResultsFile&) = delete;

  // custom_id -> whether its recorded result is a failure, for every line found on open.
  const std::unordered_map<std::string, bool>& recorded() const { return recorded_; }
  size_t torn_bytes_removed() const { return torn_bytes_; }

  // Appends one complete line (ending in '\n') with one write() call.
  void append(std::string_view line);

 private:
  std::string path_;
  int fd_ = -1;
  std::unordered_map<std::string, bool> recorded_;
  size_t torn_bytes_ = 0;
};

}  // namespace sluice
