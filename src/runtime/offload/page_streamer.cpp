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
}

PageSlots::~PageSlots() {
  for (void* p : slots_) device_.deallocate(p, page_bytes_);
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
                           std::vector<std::vector<int>> uses, PageSource* source)
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
      fail("page streamer: page '{}': field 'source_group': its host memory is lent by a source, "
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
  for (int i = 0; i < slots.count(); ++i) free_.push_back({i, nullptr});
}

int PageStreamer::pages_in_slots() const {
  return slots_.count() - int(free_.size() - free_head_);
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
  while (next_copy_ < copy_order_.size() && free_head_ < free_.size()) {
    const int p = copy_order_[next_copy_];
    PageState& s = state_[size_t(p)];
    if (!s.needed) {  // dropped before its copy was issued
      ++next_copy_;
      continue;
    }
    const WeightPage& page = pages_[size_t(p)];
    if (page.source_group >= 0 && s.first_use > must && !source_->available(page)) break;
    ++next_copy_;
    copy_page(p, free_[free_head_++]);
  }
  // Compact the FIFO now and then so it does not grow with the schedule.
  if (free_head_ > 64 && free_head_ * 2 > free_.size()) {
    free_.erase(free_.begin(), free_.begin() + std::ptrdiff_t(free_head_));
    free_head_ = 0;
  }
}

void PageStreamer::copy_page(int p, const FreeSlot& f) {
  PageState& s = state_[size_t(p)];
  WeightPage& page = pages_[size_t(p)];
  if (page.source_group >= 0) source_->lend(page);
  if (f.fence) device_.wait(Queue::kWeights, f.fence);  // its previous page's last user ran
  s.slot = f.slot;
  auto* slot = static_cast<char*>(slots_.slot(f.slot));
  device_.copy_to_device(Queue::kWeights, slot, page.host, page.bytes, page.name);
  if (page.then_bytes > 0)
    device_.copy_to_device(Queue::kWeights, slot + page.bytes, page.then_host, page.then_bytes,
                           page.name);
  s.copied = device_.record(Queue::kWeights);
  if (page.source_group >= 0) source_->copied(page, s.copied);
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
    device_.wait(Queue::kCompute, s.copied);
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
      free_.push_back({s.slot, fence});
      s.slot = -1;
    } else {
      s.needed = false;  // never copied: drop it
    }
  }
  ++next_task_;
}

}  // namespace sluice::offload
