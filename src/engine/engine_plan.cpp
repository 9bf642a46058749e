#include "engine/engine_plan.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <omp.h>
#include <sys/file.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/throughput_report.h"
#include "runtime/memory_info.h"
#include "runtime/planner/planner.h"
#include "runtime/planner/profiler.h"

namespace sluice {
namespace {

// Holds an exclusive flock on `path` for its lifetime: concurrent first runs measure once.
class FileLock {
 public:
  explicit FileLock(const std::filesystem::path& path)
      : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ < 0) fail("profile cache: {}: cannot open the lock file", path.string());
    while (::flock(fd_, LOCK_EX) != 0)
      if (errno != EINTR) fail("profile cache: {}: cannot lock", path.string());
  }
  ~FileLock() { ::close(fd_); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

std::optional<Ceilings> read_ceilings(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    Ceilings c{j.at("dram_bytes_per_s").get<double>(), j.at("gemm_flops").get<double>()};
    if (c.dram_bytes_per_s > 0 && c.gemm_flops > 0) return c;
  } catch (const nlohmann::json::exception&) {
  }
  return std::nullopt;  // unreadable: measured again and rewritten
}

Ceilings cached_quick_ceilings(int threads) {
  const MachineIdentity machine = this_machine();
  std::filesystem::path path = profile_cache_path(machine, threads);
  path.replace_filename("quick-" + path.filename().string());
  FileLock lock(path.string() + ".lock");
  if (std::optional<Ceilings> cached = read_ceilings(path)) return *cached;
  fmt::print(stderr,
             "planner: measuring this machine's DRAM bandwidth and GEMM peak once, for {} "
             "(`sluice profile` measures it fully)\n",
             path.string());
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(threads > 0 ? threads : omp_get_num_procs());
  const Ceilings measured = measure_ceilings();
  omp_set_num_threads(saved_threads);
  const std::filesystem::path tmp = path.string() + fmt::format(".{}.tmp", getpid());
  {
    std::ofstream out(tmp);
    if (!out) fail("profile cache: {}: cannot write", tmp.string());
    out << nlohmann::json{{"dram_bytes_per_s", measured.dram_bytes_per_s},
                          {"gemm_flops", measured.gemm_flops}}
               .dump()
        << "\n";
  }
  std::filesystem::rename(tmp, path);
  return measured;
}

}  // namespace

HardwareProfile planner_profile(int threads) {
  if (std::optional<HardwareProfile> cached = load_cached_profile(threads)) return *cached;
  const Ceilings c = cached_quick_ceilings(threads);
  return quick_profile(c.dram_bytes_per_s, c.gemm_flops);
}

size_t default_host_memory(const ModelConfig& c) {
  return model_weight_bytes(c) + available_memory_bytes() / 2;
}

std::string EnginePlan::describe() const {
  return fmt::format(
      "{} (planned with the {} profile: predicted prefill {:.1f}, decode {:.1f}, end to end "
      "{:.1f} tokens/s)",
      policy.describe(), profile_source == "quick" ? "quick" : "measured",
      prediction.prefill_tokens_per_s(), prediction.decode_tokens_per_s(),
      prediction.total_tokens_per_s());
}

EnginePlan plan_for_requests(const ModelConfig& c, const Policy& requested,
                             const std::vector<Request>& requests, size_t host_memory_bytes) {
  std::vector<WorkloadRequest> work;
  work.reserve(requests.size());
  for (const Request& r : requests) work.push_back({int(r.prompt.size()), r.max_new_tokens});
  const HardwareProfile hw = planner_profile(requested.threads);
  const Plan plan = plan_policy(hw, c, requested, work, MemoryLimits{host_memory_bytes, 0});
  return {plan.chosen.policy, plan.chosen.prediction, hw.source};
}

}  // namespace sluice
