// A step as a DAG of tasks, each with its bytes, FLOPs, resource and predicted time, and the
// step time as the graph's critical path (MoE-Gen's dp[v] = max over predecessors u of dp[u],
// plus cost(v)). Tasks that share a resource and cannot overlap are chained by explicit edges,
// the way the executor orders them: the CPU engine runs everything on one thread pool, so its
// graph is one chain; a GPU pipeline has parallel branches (GPU compute, CPU attention, PCIe
// copies) joined where data meets.
#pragma once

#include <string>
#include <vector>

namespace sluice {

enum class Resource { kCpu, kGpu, kHostToDevice, kDeviceToHost, kDisk };
enum class Bound { kCompute, kMemory, kLink };

const char* resource_name(Resource r);
const char* bound_name(Bound b);  // "compute", "memory bandwidth", "link bandwidth"

struct Task {
  std::string name;   // "layer0.mb0.q_proj"
  std::string group;  // what the report sums by: "expert GEMMs", "attention", ...
  Resource resource = Resource::kCpu;
  double flops = 0;  // expected arithmetic
  double bytes = 0;  // expected compulsory traffic on the bounding memory level or link
  double seconds = 0;
  Bound bound = Bound::kMemory;
  std::vector<int> deps;  // indices of tasks that must finish first
};

class TaskGraph {
 public:
  // Appends a task; its deps must already be in the graph (so indices are a topological order).
  int add(Task task);
  // Appends a task that depends on the last task added (a chain); returns its index.
  int chain(Task task);
  const std::vector<Task>& tasks() const { return tasks_; }

  // Finish time of every task when each starts as soon as its dependencies finish.
  std::vector<double> finish_times() const;
  double critical_path_seconds() const;
  // Indices of the tasks on one longest path, first to last.
  std::vector<int> critical_path() const;

 private:
  std::vector<Task> tasks_;
};

}  // namespace sluice
