#include "engine/disk_experts.h"

#include <cmath>
#include <numeric>

namespace sluice {

DiskExperts::DiskExperts(const ModelConfig& c, std::shared_ptr<const ExpertFiles> files,
                         int pool_experts)
    : c_(c), pool_(c, std::move(files), pool_experts), used_last_step_(size_t(c.num_layers)) {}

void DiskExperts::set_kept_on_device(std::function<bool(int layer, int expert)> kept) {
  kept_on_device_ = std::move(kept);
  if (!kept_on_device_) return pool_.set_kept_elsewhere({});
  pool_.set_kept_elsewhere([this](ExpertKey k) { return kept_on_device_(k.layer, k.expert); });
}

void DiskExperts::begin_layer(int layer, const std::vector<int>& chosen, int step_tokens) {
  layer_ = layer;
  step_tokens_ = step_tokens;
  chosen_ = chosen;
  asked_ = 0;
  guessed_ = false;
  pool_.drop_guesses(layer, chosen);
  pool_.set_current_layer(layer);
  ask_ahead(0);
  used_last_step_[size_t(layer)] = chosen;
}

void DiskExperts::ask_ahead(int done) {
  const size_t ahead = size_t(pool_.slots() - 1);
  while (asked_ < chosen_.size() && asked_ < size_t(done) + ahead)
    pool_.prefetch({layer_, chosen_[asked_++]}, true);
  if (asked_ == chosen_.size() && !guessed_) {
    guessed_ = true;
    guess_next_layer();
  }
}

ExpertMatrices DiskExperts::acquire(int i) {
  return pool_.acquire({layer_, chosen_[size_t(i)]});
}

void DiskExperts::release(int i) {
  pool_.release({layer_, chosen_[size_t(i)]});
  ask_ahead(i + 1);
}

bool DiskExperts::landed(int i) const {
  return pool_.landed({layer_, chosen_[size_t(i)]});
}

ExpertMatrices DiskExperts::acquire_one(int layer, int expert) {
  return pool_.acquire({layer, expert});
}

void DiskExperts::release_one(int layer, int expert) {
  pool_.release({layer, expert});
}

int DiskExperts::next_moe_layer(int layer) const {
  for (int step = 1; step <= c_.num_layers; ++step) {
    const int l = (layer + step) % c_.num_layers;
    if (c_.is_moe_layer(l)) return l;
  }
  return layer;
}

void DiskExperts::guess_next_layer() {
  const int next = next_moe_layer(layer_);
  for (int e : guesses(next))
    if (!pool_.prefetch({next, e}, false)) return;
}

std::vector<int> DiskExperts::guesses(int layer) const {
  // Experts a step of T tokens is expected to use: E·(1 - (1 - k/E)^T) under uniform routing.
  const double E = c_.num_experts, k = c_.experts_per_token;
  const double expected = E * (1 - std::pow(1 - k / E, double(step_tokens_)));
  const bool resident = size_t(layer) < device_resident_.size() && device_resident_[size_t(layer)];
  std::vector<int> candidates = used_last_step_[size_t(layer)];
  if (expected >= 0.9 * E && !resident) {
    candidates.resize(size_t(c_.num_experts));
    std::iota(candidates.begin(), candidates.end(), 0);
  }
  std::vector<int> out;
  for (int e : candidates)
    if (!kept_on_device_ || !kept_on_device_(layer, e)) out.push_back(e);
  return out;
}

}  // namespace sluice
