// Each sluice subcommand lives in its own cmd_*.cpp and registers itself here, so adding a
// command touches no other file.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace sluice::cli {

struct Command {
  std::string name;
  std::string description;
  // Adds the subcommand's options and returns the function that runs it (exit code).
  std::function<std::function<int()>(CLI::App& sub)> setup;
};

std::vector<Command>& command_registry();

struct RegisterCommand {
  explicit RegisterCommand(Command c) { command_registry().push_back(std::move(c)); }
};

}  // namespace sluice::cli
