// The sluice command line: dispatches to the subcommands registered by cmd_*.cpp.
#include <fmt/core.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "core/error.h"
#include "kernels/cpu/isa.h"
#include "runtime/planner/profiler.h"
#if SLUICE_HAS_CUDA
#include "runtime/gpu/gpu_profiler.h"
#endif

namespace sluice::cli {

std::vector<Command>& command_registry() {
  static std::vector<Command> commands;
  return commands;
}

}  // namespace sluice::cli

int main(int argc, char** argv) {
  using namespace sluice::cli;
#if SLUICE_HAS_CUDA
  // The GPU half of the profile (`sluice profile`, and the planner's quick one), registered here,
  // in code the binary certainly runs, rather than by a static object in the library that the
  // linker could drop. Without a GPU it returns no GPU section, quietly.
  sluice::set_gpu_profiler(sluice::gpu::measure_gpu_profile);
#endif
  spdlog::set_pattern("%^[%L]%$ %v");
  spdlog::set_default_logger(spdlog::stderr_color_mt("sluice"));
  CLI::App app{"sluice: batch inference for Mixture-of-Experts models larger than fast memory"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "sluice 0.1.0");
  auto& commands = command_registry();
  std::sort(commands.begin(), commands.end(),
            [](const Command& a, const Command& b) { return a.name < b.name; });
  std::vector<std::pair<CLI::App*, std::function<int()>>> runners;
  for (auto& c : commands) {
    CLI::App* sub = app.add_subcommand(c.name, c.description);
    runners.emplace_back(sub, c.setup(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    // A bad SLUICE_ISA is one clear error before any work starts.
    sluice::cpu::check_isa_environment();
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run();
  } catch (const sluice::Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
