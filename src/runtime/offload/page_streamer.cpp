#include "runtime/offload/page_streamer.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace sluice::offload {

PageSlots::PageSlots(Device& device, size_t page_bytes, int slots)
    : device_(device), page_bytes_(page_bytes) {
  // No slots is a pool for a schedule that streams nothing (every weight resident).
  if (page_bytes == 0 || slots < 0)
    fail("page pool: fields 'page_bytes', 'slots': expected > 0 and >= 0, got {} and {}",
         page_bytes, slots);
  try {
    for (int i = 0; i < slots; ++i)
      slots_.push_back(device.allocate(page_bytes, fmt::format("weight page slot {}", i)));
  } catch (...) {
    for (void* p : slots_) device.deallocate(p, page_bytes);
    throw;
  }
  keys_.assign(slots_.size(), 0);
}

PageSlots::~PageSlots() {
  for (void* p : slots_) device_.deallocate(p, page_bytes_);
}

void PageSlots::set_key(int i, uint64_t key) {
  uint64_t& old = keys_[size_t(i)];
  if (old != 0) {
    const auto it = slot_of_key_.find(old);
    if (it != slot_of_key_.end() && it->second == i) slot_of_key_.erase(it);
  }
  old = key;
  if (key != 0) slot_of_key_[key] = i;
}

int PageStreamer::min_slots(size_t n_pages, const std::vector<std::vector<int>>& uses) {
  std::vector<int> first(n_pages, -1), last(n_pages, -1);
  for (int t = 0; t < int(uses.size()); ++t)
    for (int p : uses[size_t(t)]) {
      if (first[size_t(p)] < 0) first[size_t(p)] = t;
      last[size_t(p)] = t;
    }
  // Pages live during task t: first <= t <= last. A difference array counts them per task.
  std::vector<int> delta(uses.size() + 1, 0);
  for (size_t p = 0; p < n_pages; ++p)
    if (first[p] >= 0) {
      ++delta[size_t(first[p])];
      --delta[size_t(last[p]) + 1];
    }
  int live = 0, most = 0;
  for (size_t t = 0; t < uses.size(); ++t) most = std::max(most, live += delta[t]);
  return most;
}

PageStreamer::PageStreamer(Device& device, PageSlots& slots, std::vector<WeightPage> pages,
                           std::vector<std::vector<int>> uses, PageSource* source, int window)
    : device_(device),
      slots_(slots),
      pages_(std::move(pages)),
      uses_(std::move(uses)),
      source_(source),
      state_(pages_.size()) {
  for (int t = 0; t < int(uses_.size()); ++t)
    for (int p : uses_[size_t(t)]) {
      if (p < 0 || size_t(p) >= pages_.size())
        fail("page streamer: task {}: field 'uses': page {} is not one of the {} pages", t, p,
             pages_.size());
      PageState& s = state_[size_t(p)];
      if (s.first_use < 0) s.first_use = t;
      s.last_use = t;
    }
  for (size_t p = 0; p < pages_.size(); ++p) {
    if (pages_[p].total_bytes() > slots.page_bytes())
      fail("page streamer: page '{}': expected at most the page size {} bytes, got {}",
           pages_[p].name, slots.page_bytes(), pages_[p].total_bytes());
    if (pages_[p].source_group >= 0 && !source_)
      fail(
          "page streamer: page '{}': field 'source_group': its host memory is lent by a source, "
          "but the streamer has none",
          pages_[p].name);
    if (state_[p].first_use >= 0)
      copy_order_.push_back(int(p));
    else
      state_[p].done = true;  // no task reads it
  }
  std::stable_sort(copy_order_.begin(), copy_order_.end(), [&](int a, int b) {
    return state_[size_t(a)].first_use < state_[size_t(b)].first_use;
  });
  const int need = min_slots(pages_.size(), uses_);
  if (need > slots.count())
    fail(
        "page streamer: field 'slots': the schedule has {} pages in use at once but the pool has "
        "{} slots; give the pool at least {} slots ({} bytes each)",
        need, slots.count(), need, slots.page_bytes());
  for (const std::vector<int>& u : uses_) most_pages_ = std::max(most_pages_, int(u.size()));
  const int n = slots.count();
  window_ = window <= 0 ? n : std::clamp(window, need, n);
  is_free_.assign(size_t(n), 1);
  fence_.assign(size_t(n), nullptr);
  page_in_slot_.assign(size_t(n), -1);
  cached_slot_.assign(pages_.size(), -1);
  for (int i = 0; i < n; ++i) {
    free_.push_back(i);
    // A slot keeps the bytes of the page it held last, from an earlier streamer (step).
    const uint64_t key = slots.key(i);
    if (key == 0 || key > pages_.size() || pages_[size_t(key - 1)].key != key) continue;
    page_in_slot_[size_t(i)] = int(key - 1);
    cached_slot_[size_t(key - 1)] = i;
  }
}

int PageStreamer::pages_in_slots() const {
  return slots_.count() - int(free_.size());
}

bool PageStreamer::any_page_copied(int t) const {
  for (int p : uses_[size_t(t)])
    if (state_[size_t(p)].slot >= 0) return true;
  return false;
}

bool PageStreamer::drop_if_not_copied(int t) {
  if (t < next_task_ || any_page_copied(t)) return false;
  for (int p : uses_[size_t(t)]) {
    PageState& s = state_[size_t(p)];
    if (s.first_use == t && s.last_use == t) s.needed = false;
  }
  return true;
}

void PageStreamer::copy_ahead(int must) {
  while (next_copy_ < copy_order_.size()) {
    const int p = copy_order_[next_copy_];
    PageState& s = state_[size_t(p)];
    if (!s.needed || s.slot >= 0) {  // dropped before its copy was issued, or taken from the cache
      ++next_copy_;
      continue;
    }
    const WeightPage& page = pages_[size_t(p)];
    // A borrowed page comes from the cache only with its whole task (take_cached): its source
    // lends a task's pages together.
    if (page.source_group < 0 && reuse(p)) {
      ++next_copy_;
      continue;
    }
    const bool due = s.first_use <= must;
    if (free_.empty() || (!due && pages_in_slots() >= window_)) break;
    if (page.source_group >= 0 && !due && !source_->available(page)) break;
    const int victim = pick_victim();
    // Ahead of its task, a copy does not evict a page that is needed sooner than this one.
    if (!due && next_use_distance(page_in_slot_[size_t(victim)]) <= s.first_use - next_task_) break;
    ++next_copy_;
    copy_page(p, victim);
  }
}

void PageStreamer::take_free(int slot) {
  free_.erase(std::find(free_.begin(), free_.end(), slot));
  is_free_[size_t(slot)] = 0;
}

bool PageStreamer::reuse(int p) {
  const int slot = cached_slot_[size_t(p)];
  if (slot < 0 || !is_free_[size_t(slot)]) return false;
  take_free(slot);
  PageState& s = state_[size_t(p)];
  s.slot = slot;
  s.copied = nullptr;  // its copy was done before this step, or before its slot was released
  ++pages_reused_;
  bytes_reused_ += int64_t(pages_[size_t(p)].total_bytes());
  return true;
}

bool PageStreamer::take_cached(int t) {
  if (t < next_task_) return false;
  int kept = 0;
  for (int p : uses_[size_t(t)]) {
    const PageState& s = state_[size_t(p)];
    if (s.slot >= 0) continue;
    const int slot = cached_slot_[size_t(p)];
    if (!s.needed || slot < 0 || !is_free_[size_t(slot)]) return false;
    ++kept;
  }
  // The copies of the tasks before t still need free slots: as many as the largest task reads.
  if (kept > 0 && int(free_.size()) - kept < most_pages_) return false;
  for (int p : uses_[size_t(t)])
    if (state_[size_t(p)].slot < 0) reuse(p);
  return true;
}

int64_t PageStreamer::next_use_distance(int p) const {
  if (p < 0) return INT64_MAX;
  const PageState& s = state_[size_t(p)];
  if (s.first_use < 0) return INT64_MAX / 2;  // no task of this step reads it
  if (s.needed && !s.done && s.slot < 0 && s.first_use >= next_task_)
    return s.first_use - next_task_;
  return int64_t(uses_.size()) - next_task_ + s.first_use;  // the next step, at the same place
}

int PageStreamer::pick_victim() const {
  int best = free_.front();
  int64_t farthest = -1;
  for (int slot : free_) {
    const int64_t d = next_use_distance(page_in_slot_[size_t(slot)]);
    if (d > farthest) farthest = d, best = slot;
  }
  return best;
}

void PageStreamer::copy_page(int p, int slot) {
  take_free(slot);
  PageState& s = state_[size_t(p)];
  WeightPage& page = pages_[size_t(p)];
  if (page.source_group >= 0) source_->lend(page);
  // The slot's previous page's last user ran before the copy overwrites it.
  if (const EventPtr& fence = fence_[size_t(slot)]) device_.wait(Queue::kWeights, fence);
  s.slot = slot;
  auto* dst = static_cast<char*>(slots_.slot(slot));
  device_.copy_to_device(Queue::kWeights, dst, page.host, page.bytes, page.name);
  if (page.then_bytes > 0)
    device_.copy_to_device(Queue::kWeights, dst + page.bytes, page.then_host, page.then_bytes,
                           page.name);
  s.copied = device_.record(Queue::kWeights);
  if (page.source_group >= 0) source_->copied(page, s.copied);
  // The slot now holds p's bytes, and no other slot does.
  if (const int old = page_in_slot_[size_t(slot)]; old >= 0) cached_slot_[size_t(old)] = -1;
  if (const int other = cached_slot_[size_t(p)]; other >= 0) {
    page_in_slot_[size_t(other)] = -1;
    slots_.set_key(other, 0);
  }
  page_in_slot_[size_t(slot)] = p;
  cached_slot_[size_t(p)] = slot;
  slots_.set_key(slot, page.key);
  ++pages_copied_;
  bytes_copied_ += int64_t(page.total_bytes());
}

void PageStreamer::run(int t, PagedWork work, std::string_view label) {
  if (t != next_task_)
    fail("page streamer: task {} run out of order: expected task {}", t, next_task_);
  copy_ahead(t);
  std::vector<void*> ptrs;
  for (int p : uses_[size_t(t)]) {
    const PageState& s = state_[size_t(p)];
    if (s.slot < 0)  // cannot happen when slots >= min_slots; a bug if it does
      fail("page streamer: task {}: page '{}' has no slot", t, pages_[size_t(p)].name);
    if (s.copied) device_.wait(Queue::kCompute, s.copied);  // null: kept in its slot from before
    ptrs.push_back(slots_.slot(s.slot));
  }
  device_.enqueue(
      Queue::kCompute, [work = std::move(work), ptrs](void* stream) { work(stream, ptrs); }, label);
  finish_task(t, device_.record(Queue::kCompute));
  prefetch();
}

void PageStreamer::skip(int t) {
  if (t != next_task_)
    fail("page streamer: task {} skipped out of order: expected task {}", t, next_task_);
  // A copied page whose last user is t must still wait for earlier users (fenced by the compute
  // queue's position now) before its slot is reused.
  finish_task(t, device_.record(Queue::kCompute));
  prefetch();
}

void PageStreamer::finish_task(int t, const EventPtr& fence) {
  for (int p : uses_[size_t(t)]) {
    PageState& s = state_[size_t(p)];
    if (s.last_use != t || s.done) continue;
    s.done = true;
    if (s.slot >= 0) {
      free_.push_back(s.slot);
      is_free_[size_t(s.slot)] = 1;
      fence_[size_t(s.slot)] = fence;
      s.slot = -1;
    } else {
      s.needed = false;  // never copied: drop it
    }
  }
  ++next_task_;
}

}  // namespace sluice::offload
