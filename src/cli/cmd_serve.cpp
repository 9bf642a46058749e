// sluice serve: an OpenAI-compatible HTTP server with continuous batching. See server/serve.h.
#include <memory>

#include "cli/command.h"
#include "cli/policy_options.h"
#include "core/units.h"
#include "server/serve.h"

namespace sluice::cli {
namespace {

RegisterCommand reg(
    {"serve",
     "Serve the model over HTTP with the OpenAI API (/v1/completions, /v1/chat/completions, "
     "streaming), requests joining the running batch at the next step; SIGINT/SIGTERM stop it",
     [](CLI::App& sub) {
       auto o = std::make_shared<server::ServeOptions>();
       sub.add_option("--model", o->model_dir, "Model folder or .gguf file")->required();
       sub.add_option("--host", o->server.host, "Address to listen on (loopback by default)")
           ->capture_default_str();
       sub.add_option("--port", o->server.port, "TCP port (0: any free port)")
           ->capture_default_str()
           ->check(CLI::Range(0, 65535));
       sub.add_option("--api-key", o->server.api_key,
                      "Require 'Authorization: Bearer KEY' on every endpoint but /health");
       sub.add_option("--served-model-name", o->server.model_name,
                      "Model name in responses and /v1/models (default: the folder's name)");
       sub.add_option("--max-tokens-default", o->server.max_tokens_default,
                      "max_tokens of requests that give none (lowered to what the context leaves)")
           ->capture_default_str()
           ->check(CLI::PositiveNumber);
       sub.add_option("--max-queue", o->max_waiting,
                      "Requests that may wait for a batch slot; more get 429")
           ->capture_default_str()
           ->check(CLI::PositiveNumber);
       sub.add_option("--max-body-bytes", o->server.max_body_bytes,
                      "Largest request body; larger ones get 413")
           ->capture_default_str()
           ->check(CLI::PositiveNumber);
       sub.add_option("--http-threads", o->server.http_threads,
                      "Connections served at once (each open stream holds one)")
           ->capture_default_str()
           ->check(CLI::PositiveNumber);
       sub.add_option("--shutdown-grace", o->shutdown_grace_seconds,
                      "Seconds running requests may take to finish after SIGINT/SIGTERM")
           ->capture_default_str()
           ->check(CLI::NonNegativeNumber);
       sub.add_option("--plan-requests", o->plan_requests,
                      "The workload the planner sizes the policy for: this many requests...")
           ->capture_default_str()
           ->check(CLI::PositiveNumber);
       sub.add_option("--prompt-len", o->plan_prompt_len,
                      "...of this many prompt tokens (0: a quarter of the context, at most 256)")
           ->check(CLI::NonNegativeNumber);
       sub.add_option("--gen-len", o->plan_gen_len,
                      "...and this many new tokens (0: --max-tokens-default within the context)")
           ->check(CLI::NonNegativeNumber);
       add_policy_options(sub, o->policy);
       add_device_options(sub, o->device);
       auto host_mem = std::make_shared<std::string>();
       add_host_memory_option(sub, *host_mem);
       return std::function<int()>([o, host_mem] {
         if (!host_mem->empty()) o->host_memory_bytes = parse_bytes(*host_mem, "--host-mem");
         return server::serve(*o);
       });
     }});

}  // namespace
}  // namespace sluice::cli
