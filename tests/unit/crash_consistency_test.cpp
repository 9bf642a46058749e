// Files sluice writes are complete or absent after kill -9 at any moment: `make-model` and
// `quantize` folders (staged in a hidden sibling, renamed when whole), and single files written
// through write_file_atomically. (Batch results are resumable instead: batch_job_test.)
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "io/staged_output.h"
#include "io/tokenizer.h"
#include "model/weights.h"
#include "test_util.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// Whether any file of `out` exists yet, in the folder or in a partial sibling being staged.
bool output_begun(const fs::path& out) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(out.parent_path(), ec)) {
    const std::string name = entry.path().filename().string();
    if ((name == out.filename().string() ||
         (name.starts_with('.') && name.substr(1).starts_with(out.filename().string()))) &&
        fs::is_directory(entry.path()) && !fs::is_empty(entry.path()))
      return true;
  }
  return false;
}

// Runs `sluice ARGS` and kills it with SIGKILL after `delay`, or (with a negative delay) as soon
// as the first file of `out` exists, in the middle of writing it; true when the kill came before
// the end.
bool run_and_kill(const std::string& args, std::chrono::microseconds delay, const fs::path& out) {
  const std::string command = "exec " + testing::sluice_binary() + " " + args + " >/dev/null 2>&1";
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  if (delay.count() >= 0) {
    std::this_thread::sleep_for(delay);
  } else {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!output_begun(out) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status);
}

// The folder is absent, or a whole model: config, every tensor, tokenizer.
void expect_absent_or_whole(const fs::path& dir, const std::string& when) {
  if (!fs::exists(dir)) return;
  try {
    Model m = load_model(dir);
    EXPECT_GT(m.config.num_layers, 0) << when;
    EXPECT_NE(Tokenizer::load(dir), nullptr) << when;
  } catch (const Error& e) {
    ADD_FAILURE() << when << ": " << dir << " exists but is not a whole model: " << e.what();
  }
}

// No ".NAME.partial-PID" sibling is left once a later run has finished.
void expect_no_partials(const fs::path& parent) {
  for (const auto& entry : fs::directory_iterator(parent))
    EXPECT_EQ(entry.path().filename().string().find(".partial-"), std::string::npos)
        << entry.path();
}

// Kills `args` (which writes `out`) at delays spread over its whole life, and as soon as its
// first file exists; each time the folder is absent or whole. A run to the end afterwards succeeds
// and leaves no partial folder.
void kill_at_every_moment(const std::string& args, const fs::path& out) {
  int killed = 0, killed_writing = 0;
  std::vector<int> delays_us = {-1, -1, -1, -1, -1};
  for (int d = 0; d <= 400000; d = d * 3 / 2 + 2000) delays_us.push_back(d);
  for (int delay_us : delays_us) {
    fs::remove_all(out);
    const std::string when = delay_us < 0 ? std::string("killed as its first file appeared")
                                          : "killed after " + std::to_string(delay_us) + " us";
    const bool was_killed = run_and_kill(args, std::chrono::microseconds(delay_us), out);
    killed += was_killed;
    killed_writing += was_killed && delay_us < 0;
    expect_absent_or_whole(out, when);
  }
  EXPECT_GT(killed, 3) << "the command always ended before the kill";
  EXPECT_GT(killed_writing, 0) << "no kill came while the files were being written";
  fs::remove_all(out);
  ASSERT_EQ(testing::run_command(testing::sluice_command(args)).status, 0);
  expect_absent_or_whole(out, "after a whole run");
  EXPECT_TRUE(fs::exists(out / "config.json"));
  expect_no_partials(out.parent_path());
}

TEST(CrashConsistency, MakeModelFolderIsWholeOrAbsent) {
  TempDir work;
  kill_at_every_moment("make-model --preset tiny-mixtral --out " + (work / "m").string(),
                       work / "m");
}

TEST(CrashConsistency, QuantizedFolderIsWholeOrAbsent) {
  TempDir work;
  ASSERT_EQ(testing::run_command(testing::sluice_command("make-model --preset tiny-mixtral --out " +
                                                         (work / "src").string()))
                .status,
            0);
  kill_at_every_moment("quantize --model " + (work / "src").string() + " --out " +
                           (work / "q").string() + " --expert-dtype int8 --expert-group 32",
                       work / "q");
}

TEST(CrashConsistency, AFolderIsNeverWrittenIntoOtherFiles) {
  TempDir work;
  fs::create_directories(work / "busy");
  testing::write_file(work / "busy" / "notes.txt", "mine");
  EXPECT_ERROR_MENTIONS(StagedDirectory(work / "busy"), "busy", "not an empty folder");
  EXPECT_TRUE(fs::exists(work / "busy" / "notes.txt"));
}

TEST(CrashConsistency, AnUncommittedFolderLeavesNothing) {
  TempDir work;
  {
    StagedDirectory staged(work / "out");
    testing::write_file(staged.path() / "half.bin", "x");
  }
  EXPECT_FALSE(fs::exists(work / "out"));
  expect_no_partials(work.path());
  StagedDirectory staged(work / "out");
  testing::write_file(staged.path() / "whole.bin", "y");
  staged.commit();
  EXPECT_TRUE(fs::exists(work / "out" / "whole.bin"));
  expect_no_partials(work.path());
}

TEST(CrashConsistency, AFileWrittenAtomicallyReplacesTheOldOneWhole) {
  TempDir work;
  write_file_atomically(work / "a.json", "old");
  write_file_atomically(work / "a.json", "new and longer");
  std::ifstream in(work / "a.json");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "new and longer");
  expect_no_partials(work.path());
}

}  // namespace
}  // namespace sluice
