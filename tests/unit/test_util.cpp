#include "test_util.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>

namespace sluice::testing {

CommandResult run_command(const std::string& command, bool with_stderr) {
  CommandResult result;
  std::FILE* pipe = popen((with_stderr ? command + " 2>&1" : command).c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    result.output.append(buffer.data(), n);
  int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace sluice::testing
