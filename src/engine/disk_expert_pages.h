// The disk tier's experts on the offload path: the host page pool (DiskExperts) lends its slots to
// the page streamer (offload::PageSource), so an expert goes disk → pool slot → device slot.
//
// A layer's expert pages become available only once its routing is known (begin_layer, from
// StepOps::experts_placed): the pool is then asked for the experts the router chose, and reads
// the next layer's on a guess while this one computes. The streamer copies an expert's pages
// ahead of its task once the expert has landed, and waits for it when its task is next. The pool
// slot stays pinned until the copy of the expert's last page is done on the device: its release
// waits for that copy's event, just before the next expert is taken (by then that copy is
// usually done), or at the end of the step. The CPU's experts of the layer come after the GPU's,
// through acquire_for_host.
#pragma once

#include <vector>

#include "engine/disk_experts.h"
#include "runtime/offload/page_streamer.h"

namespace sluice {

class DiskExpertPages final : public offload::PageSource {
 public:
  DiskExpertPages(offload::Device& device, DiskExperts& disk, int num_experts);

  // The group of expert `expert` of layer `layer`, and back: WeightPage::source_group.
  int group(int layer, int expert) const { return layer * experts_ + expert; }

  // Layer `layer`'s experts are placed: `gpu` (their pages are copied in this order), then `cpu`.
  void begin_layer(int layer, const std::vector<int>& gpu, const std::vector<int>& cpu,
                   int step_tokens);
  // A CPU expert of the current layer, after every GPU expert's pages were lent.
  ExpertMatrices acquire_for_host(int expert);
  void release_for_host(int expert);
  // The step is done on the device: every expert still held goes back to the pool.
  void finish_step();

  bool available(const offload::WeightPage& page) override;
  void lend(offload::WeightPage& page) override;
  void copied(const offload::WeightPage& page, const offload::EventPtr& copied) override;

 private:
  int expert_of(const offload::WeightPage& page) const;  // -1: not of the current layer
  void release_copied();  // waits for the held experts' copies, then releases them

  offload::Device& device_;
  DiskExperts& disk_;
  int experts_;
  int layer_ = -1;
  std::vector<int> order_;  // expert → its index among the layer's chosen; -1 when not chosen
  int gpu_experts_ = 0;     // the first this many of the chosen run on the device
  int lent_ = -1;           // the expert whose pages are being lent (index), -1: none
  ExpertMatrices lent_matrices_;
  struct Held {
    int index;
    offload::EventPtr copied;
  };
  std::vector<Held> held_;  // lent, waiting for their copies
};

}  // namespace sluice
