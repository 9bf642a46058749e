// Files sluice writes are complete or absent after kill -9 at any moment: `make-model` and
// `quantize` folders (staged in a hidden sibling, renamed when whole), and single files written
// through write_file_atomically. (Batch results are resumable instead: batch_job_test.)
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
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

// Whether any file of `out` exists yet, in the folder or in a partial sibling being staged;
// watches every such folder with `inotify` so that the next file created in it wakes the waiter.
bool output_begun(const fs::path& out, int inotify) {
  const std::string out_name = out.filename().string();
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(out.parent_path(), ec)) {
    const std::string name = entry.path().filename().string();
    const bool staged_or_whole =
        name == out_name || (name.starts_with('.') && name.substr(1).starts_with(out_name));
    if (!staged_or_whole || !fs::is_directory(entry.path())) continue;
    inotify_add_watch(inotify, entry.path().c_str(), IN_CREATE);
    if (!fs::is_empty(entry.path(), ec)) return true;
  }
  return false;
}

// Sleeps until the first file of `out` exists or 20 s have passed. It sleeps in the kernel rather
// than polling so that, with every core busy, the wake-up comes within the few milliseconds that
// writing a small folder lasts.
void wait_until_output_begins(const fs::path& out, int inotify) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!output_begun(out, inotify) && std::chrono::steady_clock::now() < deadline) {
    pollfd ready{inotify, POLLIN, 0};
    if (poll(&ready, 1, 100) > 0) {
      char events[4096];
      [[maybe_unused]] const ssize_t n = read(inotify, events, sizeof events);
    }
  }
}

// Runs `sluice ARGS` and kills it with SIGKILL after `delay`, or (with a negative delay) as soon
// as the first file of `out` exists, in the middle of writing it; true when the kill came before
// the end.
bool run_and_kill(const std::string& args, std::chrono::microseconds delay, const fs::path& out) {
  const int inotify = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  EXPECT_GE(inotify, 0) << "inotify_init1";
  inotify_add_watch(inotify, out.parent_path().c_str(), IN_CREATE);
  const std::string command = "exec " + testing::sluice_binary() + " " + args + " >/dev/null 2>&1";
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  if (delay.count() >= 0)
    std::this_thread::sleep_for(delay);
  else
    wait_until_output_begins(out, inotify);
  kill(pid, SIGKILL);
  close(inotify);
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
// first file exists (until that has caught it writing three times); each time the folder is
// absent or whole. A run to the end afterwards succeeds and leaves no partial folder.
void kill_at_every_moment(const std::string& args, const fs::path& out) {
  const auto kill_and_check = [&](int delay_us) {
    fs::remove_all(out);
    const std::string when = delay_us < 0 ? std::string("killed as its first file appeared")
                                          : "killed after " + std::to_string(delay_us) + " us";
    const bool was_killed = run_and_kill(args, std::chrono::microseconds(delay_us), out);
    expect_absent_or_whole(out, when);
    return was_killed;
  };
  int killed = 0, killed_writing = 0;
  for (int d = 0; d <= 400000; d = d * 3 / 2 + 2000) killed += kill_and_check(d);
  for (int attempt = 0; attempt < 40 && killed_writing < 3; ++attempt)
    killed_writing += kill_and_check(-1);
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
