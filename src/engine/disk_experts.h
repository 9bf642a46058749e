// The CPU engine's routed experts when they stay on disk (Model::expert_files): the order in
// which the expert phase asks the host page pool (runtime/disk/expert_page_pool.h) for them.
//
// When a layer's expert phase begins, the experts the router chose are asked for, as many ahead
// as the pool has slots but one; each further one as an earlier one is released. Once all are
// asked for, the next MoE layer's experts are read ahead on a guess while this layer computes:
// all of them when the step has enough tokens to use nearly every expert, else the ones that
// layer used at the previous step (a sequence's tokens often go to the same experts), less those
// an offload device keeps.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "model/expert_files.h"
#include "runtime/disk/expert_page_pool.h"

namespace sluice {

class DiskExperts {
 public:
  DiskExperts(const ModelConfig& c, std::shared_ptr<const ExpertFiles> files, int pool_experts);

  // Layer `layer`'s expert phase begins; `chosen` are its experts with tokens, in the order they
  // run, over a step of `step_tokens` tokens.
  void begin_layer(int layer, const std::vector<int>& chosen, int step_tokens);
  // chosen[i] of the current layer, waiting for its read; release(i) after its GEMMs.
  ExpertMatrices acquire(int i);
  void release(int i);
  // Whether chosen[i] has landed, so that acquire(i) would not wait.
  bool landed(int i) const;
  // Layers whose experts an offload device holds (true): only the few the CPU takes are read
  // from disk at each step, so the guesses for such a layer are last step's, never all.
  void set_device_resident(std::vector<bool> layers) { device_resident_ = std::move(layers); }
  // Experts an offload device keeps from step to step (its expert cache): they are taken there
  // without asking the pool, so they are never read on a guess, and their pool slots go first.
  void set_kept_on_device(std::function<bool(int layer, int expert)> kept);

  // The experts of `layer` read ahead on a guess, in order, once the MoE layer before it has
  // asked for all of its own (as far as the pool has slots for them).
  std::vector<int> guesses(int layer) const;

  // One expert outside the layers' order (e.g. copied once to a device at start-up): read now
  // unless it is in the pool, and kept until release_one.
  ExpertMatrices acquire_one(int layer, int expert);
  void release_one(int layer, int expert);

  // The pool's host memory, one range (a device may page-lock it).
  const void* memory() const { return pool_.memory(); }
  size_t memory_bytes() const { return pool_.bytes(); }

  ExpertPoolStats stats() const { return pool_.stats(); }
  const std::string& read_note() const { return pool_.read_note(); }

 private:
  void ask_ahead(int done);  // after `done` experts of the layer are released
  void guess_next_layer();
  int next_moe_layer(int layer) const;

  const ModelConfig& c_;
  ExpertPagePool pool_;
  int layer_ = 0, step_tokens_ = 0;
  std::vector<int> chosen_;
  size_t asked_ = 0;
  bool guessed_ = false;
  std::vector<std::vector<int>> used_last_step_;  // per layer
  std::vector<bool> device_resident_;             // per layer; empty: none
  std::function<bool(int, int)> kept_on_device_;  // empty: none
};

}  // namespace sluice
