// The host page pool of the disk tier: a bounded set of slots, each holding one routed expert
// (its gate, up and down matrices) read from the checkpoint's files by a loader thread with
// O_DIRECT through io_uring (io/direct_reader.h), several reads in flight. A quantized
// checkpoint's experts are packed into the kernels' layout as they arrive, a matrix stored
// transposed (DBRX's down) is transposed and a GGUF file's block types are dequantised to bf16,
// on maker threads of their own (one per core), so that the loader keeps the disk's queue full
// meanwhile; an FP8 checkpoint's codes and block scales stay as read (the FP8 GEMM dequantises
// them).
//
// The engine asks for a layer's experts ahead of use (prefetch, `certain`: the router chose them)
// and for the next layer's on a guess (prefetch, not certain), then acquires each one, which
// waits until it has landed, and releases it after its GEMMs. The loader keeps the disk's queue
// full, refilling it as each read lands; the router's choices go before guesses, at most half
// the queue's experts are guesses (one, while most acquires wait for their reads), and guesses
// not yet started that the router did not choose are dropped when their layer begins: with the
// disk the bottleneck, it reads what is needed.
// Slots stay filled after release: the pool is also a cache between steps. When a slot is needed,
// the expert whose next use is the latest goes, assuming layers run in order (a step goes through
// every layer, so the layer just computed is used again last), the least used first among experts
// of one layer. Unlike LRU, which keeps nothing of a cyclic scan larger than itself, this keeps a
// fixed part of the model resident from step to step. A guess never evicts an expert needed sooner
// than itself, nor one the router chose that is not yet used.
#pragma once

#include <array>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "io/direct_reader.h"
#include "model/config.h"
#include "model/expert_files.h"
#include "runtime/disk/disk_wait_meter.h"

namespace sluice {

struct ExpertKey {
  int layer = 0, expert = 0;
};

// The pool's books since it was made.
struct ExpertPoolStats {
  int64_t demands = 0;       // experts the router chose (each counted once per use)
  int64_t hits = 0;          // of those, found in the pool or already on their way
  int64_t guesses = 0;       // experts read ahead on a guess
  int64_t guesses_used = 0;  // of those, chosen by the router before they left the pool
  int64_t experts_read = 0;  // experts read from disk
  double bytes_read = 0;     // file bytes read (whole blocks)
  double read_seconds = 0;   // the loader's time with reads in flight
  double wait_seconds = 0;   // time acquire waited for reads (compute waiting on the disk)
  double expert_bytes = 0;   // file bytes of one expert

  double hit_rate() const { return demands ? double(hits) / double(demands) : 0; }
  double prefetch_accuracy() const { return guesses ? double(guesses_used) / double(guesses) : 0; }
  double bytes_saved() const { return double(hits) * expert_bytes; }
  double read_bytes_per_s() const { return read_seconds > 0 ? bytes_read / read_seconds : 0; }
};

// One expert's gate, up and down in a slot: bf16 [n, k] row-major, packed
// (kernels/cpu/gemm_int8.h), or F8_E4M3 codes [n, k] with their block scales
// (kernels/cpu/gemm_fp8.h).
struct ExpertMatrices {
  std::array<const void*, 3> weights{};
  std::array<const float*, 3> block_scales{};  // FP8: weight_scale_inv; else null
};

// Where each part of an expert sits in a pool slot: per matrix (gate, up, down) the read buffers
// of its weights and scales (the file ranges in whole blocks; bf16 [n, k], FP8 codes and block
// scales are used as read), and the matrix made from them as it lands where the kernels cannot
// take it as read: a quantized checkpoint's packed matrix, or a transposed one's [n, k].
struct ExpertSlotLayout {
  size_t weights[3] = {}, scales[3] = {}, made[3] = {};
  size_t bytes = 0;
};
ExpertSlotLayout expert_slot_layout(const ModelConfig& c, const ExpertFiles& files);
// Host bytes of one pool slot for experts of `files`.
size_t expert_slot_bytes(const ModelConfig& c, const ExpertFiles& files);
// The same from the config alone (what the planner counts): the widest block rounding.
size_t expert_slot_bytes(const ModelConfig& c);
// File bytes of one expert from the config: its matrices as stored (and their scales).
size_t expert_file_bytes(const ModelConfig& c);
// The fewest slots the pool works with: one expert computing while the next one is read.
inline constexpr int kMinPoolExperts = 2;

class ExpertPagePool {
 public:
  ExpertPagePool(const ModelConfig& c, std::shared_ptr<const ExpertFiles> files, int slots,
                 int queue_depth = 32);
  ~ExpertPagePool();
  ExpertPagePool(const ExpertPagePool&) = delete;
  ExpertPagePool& operator=(const ExpertPagePool&) = delete;

  // The layer whose experts run now: the order of eviction follows from it.
  void set_current_layer(int layer);
  // Starts reading the expert unless it is in the pool or on its way. `certain`: the router
  // chose it (counted as a demand; kept until acquired; may wait for a slot on acquire), else a
  // guess (dropped when no slot is free for it). False: no slot could be had for a guess.
  bool prefetch(ExpertKey k, bool certain);
  // Waits until the expert (prefetched as certain, or read now) is in memory, and keeps it there
  // until release. Throws the loader's error (naming the file and offset) if its read failed.
  ExpertMatrices acquire(ExpertKey k);
  void release(ExpertKey k);
  // Whether the expert is in memory now, so that acquire would not wait (it does not wait).
  bool landed(ExpertKey k) const;
  // Layer `layer` begins with the router's `chosen` experts: the guesses for it not yet started
  // that the router did not choose are dropped, so the disk reads what is needed.
  void drop_guesses(int layer, const std::vector<int>& chosen);
  // Experts held elsewhere (an offload device's expert cache), which will not be asked of the
  // pool while they are: their slots go first when one is needed. Called on the thread that
  // prefetches and acquires.
  void set_kept_elsewhere(std::function<bool(ExpertKey)> kept) {
    kept_elsewhere_ = std::move(kept);
  }

  int slots() const { return int(slots_.size()); }
  // Host bytes the pool holds: its slots, allocated once when it is made.
  size_t bytes() const { return layout_.bytes * slots_.size(); }
  // Where those bytes are: one range, so a device can page-lock it once.
  const void* memory() const { return memory_; }
  ExpertPoolStats stats() const;
  const std::string& read_note() const { return reader_.note(); }

 private:
  // kMaking: read, its matrices being made (packed, transposed, dequantised) by the maker.
  enum class State { kEmpty, kQueued, kLoading, kMaking, kReady };
  struct Slot {
    int layer = -1, expert = -1;
    State state = State::kEmpty;
    int pins = 0;
    bool wanted = false;   // chosen by the router, not yet acquired
    bool guessed = false;  // read on a guess, not yet chosen
    int64_t uses = 0;
    std::byte* memory = nullptr;
  };
  static int64_t key_of(ExpertKey k) { return int64_t(k.layer) << 32 | uint32_t(k.expert); }
  // A slot for `k` (locked): empty, or evicted by next use; -1 when none may go.
  int take_slot(ExpertKey k, bool certain);
  int next_use(int layer) const;  // layers until `layer` runs again, counted from current_layer_
  int next_use(const Slot& s) const;  // of its expert: the latest if it is kept elsewhere
  void enqueue(int slot, ExpertKey k);
  int reads_per_expert() const;  // 3 matrices, and their scales where the files have them
  int guesses_in_flight_limit() const;  // (locked) experts read on a guess at once
  int take_queued();
  void loader_loop();
  void read_queued();
  // Makes the matrices the kernels read from the slot's read buffers (made[] of the layout).
  bool makes_matrices() const;  // whether any expert's matrices are made after reading
  void landed_locked(Slot& s, double bytes);
  void maker_loop();
  void make_matrices(const Slot& s);
  void pack(const Slot& s);
  ExpertMatrices matrices(const Slot& s) const;

  ModelConfig c_;
  std::shared_ptr<const ExpertFiles> files_;
  DirectReader reader_;
  int queue_depth_;
  ExpertSlotLayout layout_;
  std::vector<Slot> slots_;
  std::byte* memory_ = nullptr;
  std::unordered_map<int64_t, int> index_;  // key → slot
  std::deque<int> queue_;                   // slots to read, in the order asked
  int current_layer_ = 0;
  std::function<bool(ExpertKey)> kept_elsewhere_;  // empty: none
  ExpertPoolStats stats_;
  DiskWaitMeter waits_;  // of the acquires
  std::string error_;  // the loader's first failure
  bool stop_ = false;
  mutable std::mutex mutex_;
  struct Landed {
    int slot = -1;
    double bytes = 0;  // read, whole blocks
  };
  std::deque<Landed> made_queue_;  // read, for the maker to make
  std::condition_variable work_, make_work_, landed_;
  std::thread loader_;
  std::vector<std::thread> makers_;
};

}  // namespace sluice
