// Command-line overrides of every policy field, shared by the commands that run the engine.
#pragma once

#include <CLI/CLI.hpp>

#include "runtime/policy.h"

namespace sluice::cli {

void add_policy_options(CLI::App& sub, Policy& policy);

}  // namespace sluice::cli
