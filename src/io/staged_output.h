// Files and folders that are complete or absent, whenever the process dies (kill -9 included).
// A file is written beside its final name and renamed over it; a folder (a checkpoint: weights,
// config, tokenizer) is built in a hidden sibling, ".NAME.partial-PID", and renamed into place
// when whole. A partial sibling left by a process that died is removed by the next one that
// stages the same folder. (Against power loss the data would also need fsync; this covers the
// process dying, not the machine.)
#pragma once

#include <filesystem>
#include <string_view>

namespace sluice {

// Writes `bytes` to `path` through a temporary file in the same folder and rename().
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes);

class StagedDirectory {
 public:
  // Fails, naming the folder, when `final_dir` exists and is not an empty folder: a finished
  // output is never merged into other files.
  explicit StagedDirectory(const std::filesystem::path& final_dir);
  ~StagedDirectory();  // without commit(): the partial folder is removed
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;

  // Where to write the folder's files.
  const std::filesystem::path& path() const { return staging_; }
  // Renames the staged folder to its final name.
  void commit();

 private:
  std::filesystem::path final_, staging_;
  bool committed_ = false;
};

}  // namespace sluice
