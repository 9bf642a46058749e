// sluice run: a batch job from a JSONL file of requests to a JSONL file of results (OpenAI Batch
// shapes), resumable by rerunning the same command. See engine/batch_job.h.
#include <fmt/format.h>
#include <unistd.h>

#include <memory>

#include "cli/command.h"
#include "cli/policy_options.h"
#include "core/units.h"
#include "engine/batch_job.h"

namespace sluice::cli {
namespace {

RegisterCommand reg(
    {"run",
     "Run a JSONL file of requests into a JSONL file of results; rerun to resume. Exit status: 0 "
     "all requests succeeded, 2 some have error records, 1 fatal error",
     [](CLI::App& sub) {
       auto o = std::make_shared<BatchJobOptions>();
       sub.add_option("--model", o->model_dir, "Model folder or .gguf file")->required();
       sub.add_option(
              "--input", o->input,
              "Requests, one JSON object per line: {custom_id, prompt | messages, "
              "max_tokens, temperature, top_p, top_k, stop, seed} or the OpenAI Batch "
              "shape {custom_id, method, url, body}. Absent fields take the OpenAI API defaults "
              "(temperature 1, top_p 1); the default seed is a hash of the custom_id")
           ->required();
       sub.add_option("--output", o->output,
                      "Results, one line per custom_id, appended as requests finish; "
                      "custom_ids already in it are skipped")
           ->required();
       sub.add_option("--max-tokens-default", o->max_tokens_default,
                      "max_tokens of requests that give none")
           ->capture_default_str()
           ->check(CLI::PositiveNumber);
       sub.add_option("--progress-interval", o->log_seconds,
                      "Seconds between progress lines when stderr is not a terminal")
           ->capture_default_str()
           ->check(CLI::NonNegativeNumber);
       add_policy_options(sub, o->policy);
       add_device_options(sub, o->device);
       auto host_mem = std::make_shared<std::string>();
       add_host_memory_option(sub, *host_mem);
       return std::function<int()>([o, host_mem] {
         if (!host_mem->empty()) o->host_memory_bytes = parse_bytes(*host_mem, "--host-mem");
         o->live_progress = isatty(STDERR_FILENO) != 0;
         BatchJobSummary summary = run_batch_job(*o);
         fmt::print(stderr, "{}\n", summary.describe());
         return summary.exit_code();
       });
     }});

}  // namespace
}  // namespace sluice::cli
