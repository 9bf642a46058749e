// Weight pages streamed through a fixed pool of device slots, ahead of the tasks that use them.
//
// A schedule is a sequence of tasks (e.g. the experts of a layer, in the order they run); each
// task names the weight pages it reads. The streamer copies pages on the weights queue in the
// order of their first use, into `slots` device slots of `page_bytes` each, which were taken from
// the budget once: so the copies run at most `slots` pages ahead of the compute (the prefetch
// window: slots = 2 or 3 tasks' pages is double or triple buffering), and device memory for
// streamed weights never exceeds slots · page_bytes.
//
// run(t) makes the compute queue wait for the copies of t's pages, enqueues t's work, and hands
// every page whose last user is t back to the pool, fenced by an event after t's work: the next
// copy into that slot waits on the device for that event. The host never blocks; it only
// enqueues. A page that was never copied (its task was skipped or run on the CPU) is dropped.
//
// Pages may also borrow their host memory from a PageSource (the disk tier's host page pool):
// such a page has no host address until the source gives it one, just before its copy. The
// streamer copies a borrowed page ahead of its task only once the source says its bytes are
// there; a page of the task about to run is waited for. The source learns when each copy is
// enqueued, with its event, so it keeps the host bytes until the copy is done.
//
// The slots are also a cache (the device half of the expert cache): a slot keeps its page's
// bytes after release, across streamers (steps), and a page with a key (WeightPage::key) whose
// bytes are still in a free slot takes that slot without a copy. Copies run ahead of their tasks
// by at most `window` pages in the slots (the prefetch window; the other slots only keep pages);
// a copy takes the free slot whose page is needed again last (this step's later tasks first,
// then the next step's, assumed to read the pages in the same order), and is not made ahead of
// its task if that page is needed sooner than the one copied. With more slots than the window,
// the pages of a fixed part of the model stay on the device from step to step, where FIFO reuse
// would keep nothing of the cyclic scan.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/offload/device.h"

namespace sluice::offload {

struct WeightPage {
  const void* host = nullptr;  // pinned host memory (mapped checkpoint or pinned copy)
  size_t bytes = 0;            // bytes at `host`
  std::string name;            // for traces and errors, e.g. "L3.e5.w1[0:4096]"
  // A second host range copied right after the first, at byte `bytes` of the slot: an FP8
  // matrix's codes after its block scales, which the checkpoint stores apart. Empty for most.
  const void* then_host = nullptr;
  size_t then_bytes = 0;
  size_t total_bytes() const { return bytes + then_bytes; }  // <= the pool's page_bytes
  // A page whose host memory a PageSource lends (host and then_host null until it does): the
  // source's group (e.g. one expert) and this page's part of it. -1: the page has its own.
  int source_group = -1;
  int source_part = 0;
  // The page's identity for the slots' cache: the index of the page in its list + 1, the same
  // bytes in every streamer that shares the slots. 0: none, never taken from the cache.
  uint64_t key = 0;
};

// Host memory lent to pages (WeightPage::source_group >= 0) while they are copied.
class PageSource {
 public:
  virtual ~PageSource() = default;
  // Whether the page's host bytes are there now, without waiting. While false, neither it nor
  // the pages after it are copied ahead of their tasks.
  virtual bool available(const WeightPage& page) = 0;
  // Sets the page's host addresses (host, and then_host where then_bytes > 0), waiting for the
  // bytes where need be.
  virtual void lend(WeightPage& page) = 0;
  // The page's copy is enqueued; `copied` passes once it is done, and the bytes may then go.
  virtual void copied(const WeightPage& page, const EventPtr& copied) = 0;
};

// The device slots: allocated once from the budget, owned for the streamer's life.
class PageSlots {
 public:
  PageSlots(Device& device, size_t page_bytes, int slots);
  ~PageSlots();
  PageSlots(const PageSlots&) = delete;
  PageSlots& operator=(const PageSlots&) = delete;

  size_t page_bytes() const { return page_bytes_; }
  int count() const { return int(slots_.size()); }
  void* slot(int i) const { return slots_[size_t(i)]; }
  // The key of the page whose bytes slot i holds (0: none or unknown).
  uint64_t key(int i) const { return keys_[size_t(i)]; }
  void set_key(int i, uint64_t key);
  // Whether some slot holds the bytes of the page with this key (never for key 0).
  bool holds(uint64_t key) const { return slot_of_key_.count(key) > 0; }

 private:
  Device& device_;
  size_t page_bytes_;
  std::vector<void*> slots_;
  std::vector<uint64_t> keys_;
  std::unordered_map<uint64_t, int> slot_of_key_;  // non-zero keys_ → their slot
};

// Work of one task: `stream` as in QueueWork, `pages` the device addresses of its pages in the
// order the task listed them.
using PagedWork = std::function<void(void* stream, std::span<void* const> pages)>;

class PageStreamer {
 public:
  // uses[t]: indices into `pages` that task t reads. Fails if the slots cannot hold the pages
  // that are live at once (the minimum is named in the message). `source` lends the host memory
  // of the pages that have a source_group (it must outlive the streamer); null when none has.
  // `window`: the most pages in slots (in use or copied ahead) before copies wait for their
  // tasks; 0: every slot (at least the minimum).
  PageStreamer(Device& device, PageSlots& slots, std::vector<WeightPage> pages,
               std::vector<std::vector<int>> uses, PageSource* source = nullptr, int window = 0);

  // The fewest slots this schedule needs: the most pages in use across any task.
  static int min_slots(size_t n_pages, const std::vector<std::vector<int>>& uses);

  // Enqueues every copy a free slot allows, in first-use order (a borrowed page only once its
  // source has its bytes).
  void prefetch() { copy_ahead(-1); }
  // Enqueues task t; tasks must be run or skipped in order.
  void run(int t, PagedWork work, std::string_view label);
  // Task t will not run on the device (no tokens, or the CPU takes it): its pages that are not
  // yet copied are dropped; copied ones are released.
  void skip(int t);

  // Whether any of task t's pages has been copied (or is in flight) already.
  bool any_page_copied(int t) const;
  // For a task not yet run that the caller may skip: if none of its pages has been copied yet,
  // its pages that no other task reads will never be copied, and this returns true; otherwise it
  // changes nothing and returns false (the copies are under way: run the task on the device).
  // The task must still be passed to skip() in order.
  bool drop_if_not_copied(int t);

  bool finished() const { return next_task_ == int(uses_.size()); }
  // Task t's pages are all in the slots, in flight or kept from before: those kept are taken
  // now (no copy), while as many free slots as the largest task needs remain, and true is
  // returned; else nothing changes and false is returned. For the tasks whose pages come from a
  // source, before it is told what to lend: the whole task's pages, or none.
  bool take_cached(int t);

  int pages_in_slots() const;  // copied or in flight, not yet released
  int64_t pages_copied() const { return pages_copied_; }
  int64_t bytes_copied() const { return bytes_copied_; }
  // Pages taken from the slots' cache instead of copied, and their bytes.
  int64_t pages_reused() const { return pages_reused_; }
  int64_t bytes_reused() const { return bytes_reused_; }

 private:
  struct PageState {
    int first_use = -1, last_use = -1;
    int slot = -1;  // while copied and not released
    bool needed = true;
    bool done = false;  // released or dropped
    EventPtr copied;
  };
  void finish_task(int t, const EventPtr& fence);
  // prefetch, and every page of tasks up to `must` copied, borrowed ones waited for.
  void copy_ahead(int must);
  void copy_page(int p, int slot);
  // Page p's bytes are in a free slot: it takes the slot, without a copy.
  bool reuse(int p);
  void take_free(int slot);
  // Tasks from now until page p is read again (this step, or the next one), for the choice of
  // a slot to copy into; a slot without a known page is the first choice.
  int64_t next_use_distance(int p) const;
  int pick_victim() const;  // the free slot whose page is needed again last

  Device& device_;
  PageSlots& slots_;
  std::vector<WeightPage> pages_;
  std::vector<std::vector<int>> uses_;
  PageSource* source_;
  std::vector<PageState> state_;
  std::vector<int> copy_order_;  // pages by first use
  size_t next_copy_ = 0;
  int next_task_ = 0;
  int most_pages_ = 0;             // the most pages one task reads
  int window_ = 0;                 // the most pages in slots ahead of their tasks
  std::vector<int> free_;          // free slots, in no order
  std::vector<char> is_free_;      // per slot
  std::vector<EventPtr> fence_;    // per slot: its last user's work; null if none this step
  std::vector<int> page_in_slot_;  // per slot: the page of this list whose bytes it holds, -1
  std::vector<int> cached_slot_;   // per page: the slot that holds its bytes, -1
  int64_t pages_copied_ = 0, bytes_copied_ = 0, pages_reused_ = 0, bytes_reused_ = 0;
};

}  // namespace sluice::offload
