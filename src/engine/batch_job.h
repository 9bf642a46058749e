// A batch job: a JSONL file of requests (io/batch_format.h) through the engine into a JSONL file
// of results, resumable after the process dies (io/results_file.h).
//
// Each input line yields exactly one output line per custom_id: a completion, or an error record
// for a line that cannot be run (bad JSON, wrong types, unknown url, missing prompt, template
// error, prompt too long for the context, a whole sequence larger than the KV cache a given
// --kv-blocks makes). Later lines repeating a custom_id are skipped with a warning; a line whose
// custom_id cannot be read is recorded as "line-<N>". custom_ids already in the output are
// skipped, so rerunning the same command finishes an interrupted job.
//
// Defaults for fields a request leaves out follow the OpenAI API: temperature 1, top_p 1, no
// top_k; max_tokens is the job's default, lowered to what the context leaves after the prompt;
// the sampling seed is a hash of the custom_id, so a request's result does not depend on where
// it sits in the file or on which run computed it. `created` is the wall clock, or
// SOURCE_DATE_EPOCH when that is set (reproducible output files).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "engine/batch_engine.h"
#include "runtime/policy.h"

namespace sluice {

struct BatchJobOptions {
  std::filesystem::path model_dir, input, output;
  int max_tokens_default = 256;
  Policy policy;                 // fields left 0 are chosen by the planner for the job's requests
  size_t host_memory_bytes = 0;  // for weights, KV cache and activations; 0: the default budget
                                 // (engine/host_budget.h)
  DeviceOptions device;          // where the engine runs its steps (engine/engine_device.h)
  bool live_progress = false;    // rewrite a status line (stderr is a terminal)
  double log_seconds = 5.0;      // otherwise a progress line this often
};

struct BatchJobSummary {
  int64_t requests = 0;        // distinct custom_ids in the input
  int64_t completed = 0;       // written by this run, successes
  int64_t failed = 0;          // written by this run, error records
  int64_t already_done = 0;    // found in the output and skipped
  int64_t already_failed = 0;  // of those, error records
  int64_t duplicates = 0;      // input lines repeating a custom_id, skipped
  int64_t prompt_tokens = 0, completion_tokens = 0;
  double engine_seconds = 0, wall_seconds = 0;
  EngineStats engine;  // where the engine's time went, bytes moved, FLOPs done

  // 0 when every request of the input has a successful result, 2 when any has an error record
  // (from this run or an earlier one). Fatal errors throw instead (the CLI exits 1).
  int exit_code() const { return failed + already_failed > 0 ? 2 : 0; }
  std::string describe() const;  // the final summary line
};

// Runs the job, printing warnings and progress on stderr. Throws sluice::Error for fatal problems:
// unreadable model, input or output, an input without requests, a policy that cannot fit.
BatchJobSummary run_batch_job(const BatchJobOptions& options);

}  // namespace sluice
