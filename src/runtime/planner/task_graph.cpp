#include "runtime/planner/task_graph.h"

#include <algorithm>

#include "core/error.h"

namespace sluice {

const char* resource_name(Resource r) {
  switch (r) {
    case Resource::kCpu:
      return "CPU";
    case Resource::kGpu:
      return "GPU";
    case Resource::kHostToDevice:
      return "PCIe host-to-device";
    case Resource::kDeviceToHost:
      return "PCIe device-to-host";
    case Resource::kDisk:
      return "disk";
  }
  return "?";
}

const char* bound_name(Bound b) {
  switch (b) {
    case Bound::kCompute:
      return "compute";
    case Bound::kMemory:
      return "memory bandwidth";
    case Bound::kLink:
      return "link bandwidth";
  }
  return "?";
}

int TaskGraph::add(Task task) {
  const int index = int(tasks_.size());
  for (int d : task.deps)
    if (d < 0 || d >= index)
      fail(
          "task graph: task '{}': field 'deps': expected indices of earlier tasks in [0, {}), got "
          "{}",
          task.name, index, d);
  if (task.seconds < 0)
    fail("task graph: task '{}': field 'seconds': expected >= 0, got {}", task.name, task.seconds);
  tasks_.push_back(std::move(task));
  return index;
}

int TaskGraph::chain(Task task) {
  if (!tasks_.empty()) task.deps.push_back(int(tasks_.size()) - 1);
  return add(std::move(task));
}

std::vector<double> TaskGraph::finish_times() const {
  std::vector<double> dp(tasks_.size(), 0);
  for (size_t v = 0; v < tasks_.size(); ++v) {
    double start = 0;
    for (int u : tasks_[v].deps) start = std::max(start, dp[size_t(u)]);
    dp[v] = start + tasks_[v].seconds;
  }
  return dp;
}

double TaskGraph::critical_path_seconds() const {
  const std::vector<double> dp = finish_times();
  return dp.empty() ? 0 : *std::max_element(dp.begin(), dp.end());
}

std::vector<int> TaskGraph::critical_path() const {
  const std::vector<double> dp = finish_times();
  if (dp.empty()) return {};
  int v = int(std::max_element(dp.begin(), dp.end()) - dp.begin());
  std::vector<int> path;
  while (v >= 0) {
    path.push_back(v);
    int prev = -1;
    for (int u : tasks_[size_t(v)].deps)
      if (prev < 0 || dp[size_t(u)] > dp[size_t(prev)]) prev = u;
    v = prev;
  }
  std::reverse(path.begin(), path.end());
  return path;
}

}  // namespace sluice
