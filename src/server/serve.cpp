#include "server/serve.h"

#include <fmt/format.h>
#include <omp.h>
#include <signal.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "core/error.h"
#include "engine/batch_engine.h"
#include "engine/engine_plan.h"
#include "engine/online_session.h"
#include "engine/weights_in_memory.h"
#include "model/expert_quant.h"
#include "model/weights.h"

namespace sluice::server {
namespace {

std::string model_name(const std::filesystem::path& dir) {
  std::filesystem::path p = std::filesystem::absolute(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

EnginePlan plan_for_serving(const ServeOptions& o, const Model& m, const HostBudget& budget,
                            DeviceOptions& device) {
  const ModelConfig& c = m.config;
  const int context = c.max_position_embeddings;
  const int prompt = o.plan_prompt_len > 0 ? o.plan_prompt_len : std::clamp(context / 4, 1, 256);
  const int gen = o.plan_gen_len > 0
                      ? o.plan_gen_len
                      : std::max(1, std::min(o.server.max_tokens_default, context - prompt));
  std::vector<WorkloadRequest> work(size_t(o.plan_requests), WorkloadRequest{prompt, gen});
  return plan_for_workload(planner_profile(o.policy.threads, m.expert_files.get()), c, o.policy,
                           device, work, budget.bytes);
}

}  // namespace

int serve(ServeOptions o) {
  // SIGINT and SIGTERM go to one thread (sigwait), blocked in every other thread started below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const HostBudget budget = host_budget(o.host_memory_bytes, true);  // before loading takes some
  Model model =
      load_model_for_run(o.model_dir, {o.policy.expert_dtype, o.policy.expert_group}, budget);
  read_weights_if_they_fit(model);
  std::unique_ptr<Tokenizer> tokenizer = Tokenizer::load(o.model_dir);
  ServedModel served{&model.config, tokenizer.get(), nullptr, ""};
  std::optional<ChatPrompter> prompter;
  try {
    prompter.emplace(ChatPrompter::load(o.model_dir, *tokenizer));
    served.prompter = &*prompter;
  } catch (const Error& e) {
    served.prompter_error = fmt::format("this model has no usable chat template: {}", e.what());
  }
  DeviceOptions device = o.device;
  const EnginePlan plan = plan_for_serving(o, model, budget, device);
  omp_set_num_threads(plan.policy.threads);
  fmt::print(stderr, "serve: policy {}\n", plan.describe());
  BatchEngine engine(model, plan.policy, device);
  OnlineSession session(engine, o.max_waiting);
  if (o.server.model_name.empty()) o.server.model_name = model_name(o.model_dir);
  OpenAiServer http(served, session, o.server);
  http.bind();
  fmt::print(stderr, "serve: listening on http://{}:{} (model '{}')\n", o.server.host, http.port(),
             o.server.model_name);
  std::thread listener([&] { http.listen(); });
  int received = 0;
  sigwait(&signals, &received);
  fmt::print(stderr, "serve: {} received: no new requests; finishing those running (up to {} s)\n",
             received == SIGINT ? "SIGINT" : "SIGTERM", o.shutdown_grace_seconds);
  session.shutdown(o.shutdown_grace_seconds);
  http.stop();
  listener.join();
  fmt::print(stderr, "serve: stopped\n");
  return 0;
}

}  // namespace sluice::server
