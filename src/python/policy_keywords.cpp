#include "python/policy_keywords.h"

#include <CLI/CLI.hpp>
#include <algorithm>

#include "cli/policy_options.h"
#include "core/error.h"
#include "core/units.h"

namespace sluice::python {

EngineSettings parse_policy_keywords(const std::vector<std::pair<std::string, std::string>>& kw) {
  EngineSettings s;
  std::string host_mem;
  CLI::App app("LLM policy");
  cli::add_policy_options(app, s.policy);
  cli::add_host_memory_option(app, host_mem);
  cli::add_device_options(app, s.device);
  std::vector<std::string> args;
  for (const auto& [name, value] : kw) {
    std::string flag = "--" + name;
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (!app.get_option_no_throw(flag)) {
      fail(
          "LLM: unknown keyword '{}' (policy keywords are the command line's flags: batch, "
          "threads, precision, device, host_mem, expert_dtype, ...)",
          name);
    }
    args.push_back(flag);
    args.push_back(value);
  }
  std::reverse(args.begin(), args.end());  // CLI11 parses a vector from its back
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    fail("LLM: {}", e.what());
  }
  if (!host_mem.empty()) s.host_memory_bytes = parse_bytes(host_mem, "host_mem");
  return s;
}

}  // namespace sluice::python
