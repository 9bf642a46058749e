#include "engine/disk_expert_pages.h"

#include "core/error.h"

namespace sluice {

DiskExpertPages::DiskExpertPages(offload::Device& device, DiskExperts& disk, int num_experts)
    : device_(device), disk_(disk), experts_(num_experts) {}

void DiskExpertPages::begin_layer(int layer, const std::vector<int>& gpu,
                                  const std::vector<int>& cpu, int step_tokens) {
  release_copied();
  layer_ = layer;
  lent_ = -1;
  std::vector<int> chosen = gpu;
  chosen.insert(chosen.end(), cpu.begin(), cpu.end());
  gpu_experts_ = int(gpu.size());
  order_.assign(size_t(experts_), -1);
  for (size_t i = 0; i < chosen.size(); ++i) order_[size_t(chosen[i])] = int(i);
  disk_.begin_layer(layer, chosen, step_tokens);
}

int DiskExpertPages::expert_of(const offload::WeightPage& page) const {
  if (page.source_group < 0 || page.source_group / experts_ != layer_) return -1;
  return page.source_group % experts_;
}

bool DiskExpertPages::available(const offload::WeightPage& page) {
  const int e = expert_of(page);
  if (e < 0 || order_[size_t(e)] < 0) return false;
  const int i = order_[size_t(e)];
  // A CPU expert's pages are dropped by the streamer when its task is skipped, never copied.
  return i < gpu_experts_ && (i == lent_ || disk_.landed(i));
}

void DiskExpertPages::lend(offload::WeightPage& page) {
  const int e = expert_of(page);
  if (e < 0 || order_[size_t(e)] < 0 || order_[size_t(e)] >= gpu_experts_)
    fail(
        "disk expert pages: page '{}' is asked for before its layer's experts were placed, or "
        "its expert does not run on the device (a bug)",
        page.name);
  const int i = order_[size_t(e)];
  if (i != lent_) {
    if (lent_ >= 0 && (held_.empty() || held_.back().index != lent_))
      fail("disk expert pages: page '{}' is asked for before the pages of expert {} were copied",
           page.name, lent_);
    release_copied();
    lent_matrices_ = disk_.acquire(i);
    lent_ = i;
  }
  const size_t part = size_t(page.source_part);
  if (page.then_bytes > 0) {  // FP8: the block scales, then the codes
    page.host = lent_matrices_.block_scales[part];
    page.then_host = lent_matrices_.weights[part];
  } else {
    page.host = lent_matrices_.weights[part];
  }
}

void DiskExpertPages::copied(const offload::WeightPage& page, const offload::EventPtr& copied) {
  if (page.source_part == 2) held_.push_back({lent_, copied});  // the expert's last page
}

ExpertMatrices DiskExpertPages::acquire_for_host(int expert) {
  release_copied();
  return disk_.acquire(order_[size_t(expert)]);
}

void DiskExpertPages::release_for_host(int expert) { disk_.release(order_[size_t(expert)]); }

void DiskExpertPages::finish_step() {
  release_copied();
  layer_ = lent_ = -1;
}

void DiskExpertPages::release_copied() {
  if (held_.empty()) return;
  device_.synchronize(held_.back().copied);  // one queue: the earlier copies are done too
  for (const Held& h : held_) disk_.release(h.index);
  held_.clear();
}

}  // namespace sluice
