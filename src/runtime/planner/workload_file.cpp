#include "runtime/planner/workload_file.h"

#include <algorithm>
#include <climits>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_number.h"

namespace sluice {

std::vector<WorkloadRequest> workload_from_file(const std::filesystem::path& path,
                                                int default_new_tokens) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open the input file", path.string());
  const bool jsonl = path.extension() == ".jsonl" || path.extension() == ".json";
  std::vector<WorkloadRequest> out;
  std::string line;
  int line_no = 0;
  auto estimate = [](size_t chars) { return std::max(1, int((chars + 3) / 4)); };
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (!jsonl) {
      out.push_back({estimate(line.size()), default_new_tokens});
      continue;
    }
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("{}:{}: expected one JSON object per line, got a parse error: {}", path.string(),
           line_no, e.what());
    }
    size_t chars = 0;
    if (j.contains("prompt") && j["prompt"].is_string()) {
      chars = j["prompt"].get<std::string>().size();
    } else if (j.contains("messages") && j["messages"].is_array()) {
      for (const auto& m : j["messages"])
        if (m.contains("content") && m["content"].is_string())
          chars += m["content"].get<std::string>().size() + 16;  // + chat-template markup
    } else {
      fail("{}:{}: field 'prompt': expected a string (or 'messages': an array), got neither",
           path.string(), line_no);
    }
    int new_tokens = default_new_tokens;
    for (const char* key : {"max_new_tokens", "max_tokens"}) {
      if (!j.contains(key) || j[key].is_null()) continue;
      const auto n = json_integer(j[key], 1, INT_MAX);
      if (!n)
        fail("{}:{}: field '{}': expected an integer >= 1, got {}", path.string(), line_no, key,
             json_excerpt(j[key]));
      new_tokens = int(*n);
    }
    out.push_back({estimate(chars), new_tokens});
  }
  if (out.empty()) fail("{}: expected at least one prompt, got none", path.string());
  return out;
}

}  // namespace sluice
