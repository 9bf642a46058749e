// `sluice serve`: loads the model, plans the policy for the expected workload, and runs the
// OpenAI-compatible server (server/openai_server.h) until SIGINT or SIGTERM.
#pragma once

#include <filesystem>

#include "engine/engine_device.h"
#include "runtime/policy.h"
#include "server/openai_server.h"

namespace sluice::server {

struct ServeOptions {
  std::filesystem::path model_dir;
  ServerOptions server;
  Policy policy;  // fields left 0 are planned for `plan_requests` requests of the lengths below
  int plan_requests = 256, plan_prompt_len = 0, plan_gen_len = 0;  // 0: from the context
  size_t host_memory_bytes = 0;
  DeviceOptions device;
  size_t max_waiting = 1024;      // requests waiting for a slot before 429
  double shutdown_grace_seconds = 30;  // running requests may finish this long after SIGTERM
};

// Returns the exit status: 0 after a clean shutdown. Throws sluice::Error for fatal problems.
int serve(ServeOptions options);

}  // namespace sluice::server
