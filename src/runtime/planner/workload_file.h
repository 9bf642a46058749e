// The workload the planner optimises for, read from an input file's prompts: JSONL (one object a
// line with "prompt", or "messages" whose "content" strings are joined, and optionally
// "max_tokens"/"max_new_tokens") or plain text (one prompt a line). Token counts are estimated
// as characters / 4, the usual ratio of English text to BPE tokens, to plan without loading a
// tokenizer.
#pragma once

#include <filesystem>
#include <vector>

#include "runtime/planner/workload_sim.h"

namespace sluice {

std::vector<WorkloadRequest> workload_from_file(const std::filesystem::path& path,
                                                int default_new_tokens);

}  // namespace sluice
