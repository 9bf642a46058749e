#include "runtime/disk/expert_page_pool.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "core/clock.h"
#include "core/error.h"
#include "core/large_alloc.h"
#include "io/gguf.h"
#include "io/gguf_dequant.h"
#include "kernels/cpu/transpose.h"
#include "model/expert_quant.h"
#include "model/fp8_weights.h"

namespace sluice {

namespace {

size_t round_up(size_t x, size_t to) {
  return (x + to - 1) / to * to;
}
// A read buffer for `bytes` at any offset: whole blocks, one more for the misaligned start.
size_t read_capacity(size_t bytes) {
  return bytes ? round_up(bytes, kDirectAlign) + kDirectAlign : 0;
}

// n × k of gate, up and down.
std::array<MatrixShape, 3> matrix_shapes(const ModelConfig& c) {
  const int64_t I = c.expert_intermediate_size, H = c.hidden_size;
  return {MatrixShape{I, H}, MatrixShape{I, H}, MatrixShape{H, I}};
}

// The read of file range `r` into a slot's buffer at `buffer`.
FileRead read_into(const FileRange& r, std::byte* buffer) {
  return {r.file, r.offset, r.bytes, buffer};
}

// Bytes of matrix j as the kernels read it, where it is made as it lands (ExpertSlotLayout::made):
// packed when quantized, bf16 [n, k] when `made_on_read` (transposed, or dequantised from a GGUF
// block type); else 0.
size_t made_bytes(const ModelConfig& c, size_t j, bool made_on_read) {
  const MatrixShape s = matrix_shapes(c)[j];
  if (c.expert_quant.quantized())
    return round_up(
        cpu::quant_bytes(quant_format(c.expert_quant.dtype), s.n, s.k, c.expert_quant.group_size),
        kDirectAlign);
  return made_on_read ? round_up(size_t(s.n * s.k) * 2, kDirectAlign) : 0;
}

}  // namespace

ExpertSlotLayout expert_slot_layout(const ModelConfig& c, const ExpertFiles& files) {
  // Each buffer as large as any layer's (a GGUF file may store layers in different types).
  size_t weights[3] = {}, scales[3] = {};
  for (const auto& layer : files.layers)
    for (size_t j = 0; j < 3 && !layer.empty(); ++j) {
      weights[j] = std::max(weights[j], read_capacity(layer[0].weights[j].bytes));
      scales[j] = std::max(scales[j], read_capacity(layer[0].scales[j].bytes));
    }
  ExpertSlotLayout l;
  for (size_t j = 0; j < 3; ++j) {
    l.weights[j] = l.bytes;
    l.bytes += weights[j];
    l.scales[j] = l.bytes;
    l.bytes += scales[j];
    l.made[j] = l.bytes;
    l.bytes += made_bytes(c, j, files.made_on_read(j));
  }
  return l;
}

size_t expert_slot_bytes(const ModelConfig& c, const ExpertFiles& files) {
  return expert_slot_layout(c, files).bytes;
}

namespace {

// The file bytes of gate, up and down: values, and scales (zero in bf16; FP8: 1 byte a value
// and F32 128 x 128 block scales; a GGUF file's block types as the config counts them).
std::array<std::pair<size_t, size_t>, 3> matrix_file_bytes(const ModelConfig& c) {
  std::array<std::pair<size_t, size_t>, 3> out{};
  const ExpertQuant& q = c.expert_quant;
  const auto shapes = matrix_shapes(c);
  for (size_t j = 0; j < 3; ++j) {
    const size_t values = size_t(shapes[j].n * shapes[j].k);
    const double stored = c.stored_experts[j].file_bytes_per_value;
    if (!q.quantized() && c.fp8_weights)
      out[j] = {values, size_t(shape_numel(fp8_scale_shape(shapes[j].n, shapes[j].k))) * 4};
    else if (!q.quantized())
      out[j] = {stored > 0 ? size_t(std::ceil(stored * double(values))) : 2 * values, 0};
    else
      out[j] = {q.dtype == ExpertDtype::kInt4 ? values / 2 : values,
                size_t(shapes[j].n * (shapes[j].k / q.group_size)) * 4};
  }
  return out;
}

}  // namespace

size_t expert_slot_bytes(const ModelConfig& c) {
  size_t bytes = 0;
  const auto file = matrix_file_bytes(c);
  for (size_t j = 0; j < 3; ++j)
    bytes += read_capacity(file[j].first) + read_capacity(file[j].second) +
             made_bytes(c, j, c.stored_experts[j].made_on_read);
  return bytes;
}

size_t expert_file_bytes(const ModelConfig& c) {
  size_t bytes = 0;
  for (const auto& [values, scales] : matrix_file_bytes(c)) bytes += values + scales;
  return bytes;
}

ExpertPagePool::ExpertPagePool(const ModelConfig& c, std::shared_ptr<const ExpertFiles> files,
                               int slots, int queue_depth)
    : c_(c),
      files_(std::move(files)),
      reader_(files_->files, queue_depth),
      queue_depth_(queue_depth),
      layout_(expert_slot_layout(c_, *files_)) {
  if (slots < kMinPoolExperts)
    fail("expert pool: expected at least {} slots, got {}", kMinPoolExperts, slots);
  memory_ = static_cast<std::byte*>(allocate_large(layout_.bytes * size_t(slots), kDirectAlign));
  if (!memory_) fail("expert pool: cannot allocate {} slots of {} bytes", slots, layout_.bytes);
  // Made resident now, before the first step: faulted in as the first reads landed, the pages
  // held up the disk's queue (on the development VM, bench's one prefill step over a pool of 2.6
  // GiB ran at 70-76% of its disk bound, and at 88-89% with the pool made resident here).
  populate_for_writing(memory_, layout_.bytes * size_t(slots));
  slots_.resize(size_t(slots));
  for (size_t i = 0; i < slots_.size(); ++i) slots_[i].memory = memory_ + i * layout_.bytes;
  stats_.expert_bytes = double(files_->expert_file_bytes());
  loader_ = std::thread([this] { loader_loop(); });
  // One maker per core: while the engine waits on the pool, the cores are free to make matrices.
  const unsigned makers = makes_matrices() ? std::max(1u, std::thread::hardware_concurrency()) : 0;
  for (unsigned i = 0; i < makers; ++i) makers_.emplace_back([this] { maker_loop(); });
}

ExpertPagePool::~ExpertPagePool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  work_.notify_all();
  make_work_.notify_all();
  loader_.join();
  for (std::thread& t : makers_) t.join();
  std::free(memory_);
}

void ExpertPagePool::set_current_layer(int layer) {
  std::lock_guard lock(mutex_);
  current_layer_ = layer;
}

int ExpertPagePool::next_use(int layer) const {
  const int L = c_.num_layers;
  return ((layer - current_layer_ - 1) % L + L) % L;
}

int ExpertPagePool::next_use(const Slot& s) const {
  if (kept_elsewhere_ && kept_elsewhere_({s.layer, s.expert}))
    return std::numeric_limits<int>::max();
  return next_use(s.layer);
}

int ExpertPagePool::take_slot(ExpertKey k, bool certain) {
  int best = -1;
  for (int i = 0; i < int(slots_.size()); ++i) {
    const Slot& s = slots_[size_t(i)];
    if (s.state == State::kEmpty) return i;
    if (s.state != State::kReady || s.pins > 0 || s.wanted) continue;
    if (best < 0) {
      best = i;
      continue;
    }
    const Slot& b = slots_[size_t(best)];
    const int d = next_use(s), db = next_use(b);
    if (d > db || (d == db && s.uses < b.uses)) best = i;
  }
  // A guess only displaces an expert that is needed later than itself.
  if (best >= 0 && !certain && next_use(slots_[size_t(best)]) <= next_use(k.layer)) return -1;
  if (best >= 0) index_.erase(key_of({slots_[size_t(best)].layer, slots_[size_t(best)].expert}));
  return best;
}

void ExpertPagePool::enqueue(int slot, ExpertKey k) {
  Slot& s = slots_[size_t(slot)];
  // A slot taken from another expert starts afresh: that one's flags (a guess never chosen)
  // would rank this read among the guesses and count it as one used.
  s = Slot{.layer = k.layer, .expert = k.expert, .state = State::kQueued, .memory = s.memory};
  index_[key_of(k)] = slot;
  queue_.push_back(slot);
  work_.notify_one();
}

bool ExpertPagePool::prefetch(ExpertKey k, bool certain) {
  std::lock_guard lock(mutex_);
  if (!error_.empty()) return false;
  auto it = index_.find(key_of(k));
  if (it != index_.end()) {
    Slot& s = slots_[size_t(it->second)];
    if (certain && !s.wanted) {
      ++stats_.demands;
      ++stats_.hits;
      s.wanted = true;
      if (s.guessed) ++stats_.guesses_used;
      s.guessed = false;
    }
    return true;
  }
  const int slot = take_slot(k, certain);
  if (slot < 0) return false;
  enqueue(slot, k);
  Slot& s = slots_[size_t(slot)];
  if (certain) {
    ++stats_.demands;
    s.wanted = true;
  } else {
    ++stats_.guesses;
    s.guessed = true;
  }
  return true;
}

ExpertMatrices ExpertPagePool::acquire(ExpertKey k) {
  std::unique_lock lock(mutex_);
  const auto t0 = Clock::now();
  bool counted = false;
  for (;;) {
    if (!error_.empty()) fail("{}", error_);
    auto it = index_.find(key_of(k));
    if (it == index_.end()) {
      const int slot = take_slot(k, true);
      if (slot >= 0) {
        enqueue(slot, k);
        slots_[size_t(slot)].wanted = true;
        ++stats_.demands;
        counted = true;
        continue;
      }
    } else {
      Slot& s = slots_[size_t(it->second)];
      if (!s.wanted && !counted && s.pins == 0) {  // not prefetched as certain: a demand now
        ++stats_.demands;
        ++stats_.hits;
        if (s.guessed) ++stats_.guesses_used;
        s.guessed = false;
        counted = true;
      }
      s.wanted = true;
      if (s.state == State::kReady) {
        s.wanted = false;
        ++s.pins;
        ++s.uses;
        const auto now = Clock::now();
        stats_.wait_seconds += std::chrono::duration<double>(now - t0).count();
        waits_.acquired(t0, now);
        return matrices(s);
      }
    }
    landed_.wait(lock);
  }
}

void ExpertPagePool::release(ExpertKey k) {
  {
    std::lock_guard lock(mutex_);
    auto it = index_.find(key_of(k));
    if (it == index_.end() || slots_[size_t(it->second)].pins == 0)
      fail("expert pool: release of layer {} expert {}, which is not acquired", k.layer, k.expert);
    --slots_[size_t(it->second)].pins;
  }
  landed_.notify_all();
}

bool ExpertPagePool::landed(ExpertKey k) const {
  std::lock_guard lock(mutex_);
  auto it = index_.find(key_of(k));
  return it != index_.end() && slots_[size_t(it->second)].state == State::kReady;
}

ExpertPoolStats ExpertPagePool::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

ExpertMatrices ExpertPagePool::matrices(const Slot& s) const {
  const ExpertSource& src = files_->layers[size_t(s.layer)][size_t(s.expert)];
  ExpertMatrices m;
  for (size_t j = 0; j < 3; ++j) {
    m.weights[j] = files_->quantized || files_->stored[size_t(s.layer)][j].made_on_read()
                       ? s.memory + layout_.made[j]
                       : s.memory + layout_.weights[j] + src.weights[j].offset % kDirectAlign;
    if (files_->fp8)
      m.block_scales[j] = reinterpret_cast<const float*>(s.memory + layout_.scales[j] +
                                                         src.scales[j].offset % kDirectAlign);
  }
  return m;
}

// While compute waits on the disk, the disk is busy with the router's choices up to the moment the
// next layer's choices come, so a guess read then fills only that short gap, and one the router
// does not choose is read whole for nothing. Under a 600 MiB/s read throttle, DeepSeek-V2-Lite's
// shape at B = 4 with a pool of 47 experts read 1.99 GiB per decode step with half the queue's
// experts allowed to be guesses, 1.75 GiB with one, and 1.64 GiB with none, and decoded at 1.2,
// 1.3 and 1.4 tokens/s. One is kept, so that the gap is not idle; with the disk ahead of compute,
// guesses read while compute runs, and half the queue may be guesses.
int ExpertPagePool::guesses_in_flight_limit() const {
  return waits_.compute_waits() ? 1 : std::max(1, queue_depth_ / reads_per_expert() / 2);
}

// The next slot to read (locked), taken off the queue: the router's choices first, in the
// order asked; else the oldest guess, while fewer than half the queue's experts in flight are
// guesses (so a choice that arrives finds most of the disk's queue free). -1: none now.
int ExpertPagePool::take_queued() {
  auto it = std::find_if(queue_.begin(), queue_.end(),
                         [&](int slot) { return !slots_[size_t(slot)].guessed; });
  if (it == queue_.end()) {
    const int guesses_in_flight =
        int(std::count_if(slots_.begin(), slots_.end(),
                          [](const Slot& s) { return s.state == State::kLoading && s.guessed; }));
    if (guesses_in_flight >= guesses_in_flight_limit()) return -1;
    it = queue_.begin();
  }
  if (it == queue_.end()) return -1;
  const int slot = *it;
  queue_.erase(it);
  return slot;
}

void ExpertPagePool::drop_guesses(int layer, const std::vector<int>& chosen) {
  std::lock_guard lock(mutex_);
  for (auto it = queue_.begin(); it != queue_.end();) {
    Slot& s = slots_[size_t(*it)];
    if (s.layer == layer && s.guessed &&
        std::find(chosen.begin(), chosen.end(), s.expert) == chosen.end()) {
      index_.erase(key_of({s.layer, s.expert}));
      s = Slot{.memory = s.memory};
      --stats_.guesses;
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
}

int ExpertPagePool::reads_per_expert() const {
  return files_->has_scales() ? 6 : 3;
}

// Waits for queued slots and reads them, the disk's queue refilled as each read lands, until
// stopped.
void ExpertPagePool::loader_loop() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      // After a failed read, nothing more is read: acquire raises the error.
      work_.wait(lock, [&] { return stop_ || (!queue_.empty() && error_.empty()); });
      if (stop_) return;
    }
    try {
      read_queued();
    } catch (const Error& e) {
      std::lock_guard lock(mutex_);
      if (error_.empty()) error_ = e.what();
      for (Slot& s : slots_)
        if (s.state == State::kLoading) {  // its reads were cut short
          index_.erase(key_of({s.layer, s.expert}));
          s = Slot{.memory = s.memory};
        }
    }
    landed_.notify_all();
  }
}

// Reads queued slots until the queue has none to start and none is in flight. Each expert is
// ready as soon as its own reads have landed, its matrices made first where the kernels cannot
// take them as read (packed, transposed, dequantised).
void ExpertPagePool::read_queued() {
  const int per_expert = reads_per_expert();
  std::vector<FileRead> pending;  // the reads of the slot being started, last first
  int pending_slot = -1;
  std::vector<int> remaining(slots_.size(), 0);
  std::vector<double> bytes(slots_.size(), 0);  // read per expert, whole blocks
  // Reads are in flight from the call's start to its end: the time is booked as each expert
  // lands, so the books are current while the stream runs on.
  auto booked = Clock::now();
  auto book_read_time = [&] {  // locked
    stats_.read_seconds += seconds_since(booked);
    booked = Clock::now();
  };
  auto next = [&]() -> std::optional<DirectReader::TaggedRead> {
    if (pending.empty()) {
      std::lock_guard lock(mutex_);
      if (!error_.empty() || stop_) return std::nullopt;
      pending_slot = take_queued();
      if (pending_slot < 0) return std::nullopt;
      Slot& s = slots_[size_t(pending_slot)];
      s.state = State::kLoading;
      const ExpertSource& src = files_->layers[size_t(s.layer)][size_t(s.expert)];
      for (size_t j = 3; j-- > 0;) {
        if (files_->has_scales()) {
          const FileRange& sc = src.scales[j];
          pending.push_back(read_into(sc, s.memory + layout_.scales[j]));
        }
        const FileRange& w = src.weights[j];
        pending.push_back(read_into(w, s.memory + layout_.weights[j]));
      }
      remaining[size_t(pending_slot)] = per_expert;
      bytes[size_t(pending_slot)] = 0;
      for (const FileRead& r : pending)
        bytes[size_t(pending_slot)] += double(direct_buffer_bytes(r.offset, r.bytes));
    }
    DirectReader::TaggedRead t{pending.back(), uint64_t(pending_slot)};
    pending.pop_back();
    return t;
  };
  const bool make = makes_matrices();
  reader_.read_stream(next, [&](uint64_t tag) {
    const size_t slot = size_t(tag);
    if (--remaining[slot] > 0) return;
    {
      std::lock_guard lock(mutex_);
      book_read_time();
      if (make) {  // the maker thread makes its matrices while the disk reads on
        slots_[slot].state = State::kMaking;
        made_queue_.push_back({int(slot), bytes[slot]});
      } else {
        landed_locked(slots_[slot], bytes[slot]);
      }
    }
    if (make) make_work_.notify_one();
    landed_.notify_all();
  });
  std::lock_guard lock(mutex_);
  book_read_time();
}

bool ExpertPagePool::makes_matrices() const {
  if (files_->quantized) return true;
  for (size_t j = 0; j < 3; ++j)
    if (files_->made_on_read(j)) return true;
  return false;
}

void ExpertPagePool::landed_locked(Slot& s, double bytes) {
  s.state = State::kReady;
  ++stats_.experts_read;
  stats_.bytes_read += bytes;
}

// Makes the matrices of the experts whose reads have landed, in the order they landed, until
// stopped. A failure (a block that cannot be dequantised, values a pack refuses) is the pool's
// error, raised by acquire; the expert is dropped.
void ExpertPagePool::maker_loop() {
  for (;;) {
    Landed next;
    {
      std::unique_lock lock(mutex_);
      make_work_.wait(lock, [&] { return stop_ || !made_queue_.empty(); });
      if (stop_) return;
      next = made_queue_.front();
      made_queue_.pop_front();
    }
    // The slot is neither evicted nor rewritten while kMaking: its fields are read unlocked.
    Slot& s = slots_[size_t(next.slot)];
    std::string error;
    try {
      make_matrices(s);
    } catch (const Error& e) {
      error = e.what();
    }
    {
      std::lock_guard lock(mutex_);
      if (error.empty()) {
        landed_locked(s, next.bytes);
      } else {
        if (error_.empty()) error_ = error;
        index_.erase(key_of({s.layer, s.expert}));
        s = Slot{.memory = s.memory};
      }
    }
    landed_.notify_all();
  }
}

void ExpertPagePool::make_matrices(const Slot& s) {
  if (files_->quantized) return pack(s);
  const auto shapes = matrix_shapes(c_);
  const ExpertSource& src = files_->layers[size_t(s.layer)][size_t(s.expert)];
  for (size_t j = 0; j < 3; ++j) {
    const StoredMatrix& stored = files_->stored[size_t(s.layer)][j];
    const FileRead values = read_into(src.weights[j], s.memory + layout_.weights[j]);
    std::byte* made = s.memory + layout_.made[j];
    if (stored.transposed)  // stored [k, n]: k rows of n
      cpu::transpose_matrix(direct_data(values), made, shapes[j].k, shapes[j].n, 2);
    if (stored.gguf_blocks &&
        !dequantize_to_bf16(*stored.gguf_blocks, direct_data(values),
                            reinterpret_cast<uint16_t*>(made), shapes[j].n, shapes[j].k))
      fail("{}: offset {}: ggml type {} cannot be dequantised",
           files_->files[size_t(values.file)].string(), values.offset,
           ggml_type_name(*stored.gguf_blocks));
  }
}

// A quantized checkpoint's matrices into the kernels' layout: values (int8, or int4 two per
// byte) and their scales, as read, to the packed form beside them in the slot.
void ExpertPagePool::pack(const Slot& s) {
  const ExpertQuant& q = c_.expert_quant;
  const cpu::QuantFormat f = quant_format(q.dtype);
  const auto shapes = matrix_shapes(c_);
  const ExpertSource& src = files_->layers[size_t(s.layer)][size_t(s.expert)];
  std::vector<int8_t> unpacked;
  for (size_t j = 0; j < 3; ++j) {
    const FileRead values = read_into(src.weights[j], s.memory + layout_.weights[j]);
    const FileRead scales = read_into(src.scales[j], s.memory + layout_.scales[j]);
    const auto* v = reinterpret_cast<const uint8_t*>(direct_data(values));
    const int8_t* q8 = reinterpret_cast<const int8_t*>(v);
    const std::string what =
        fmt::format("{}: offset {}", files_->files[size_t(values.file)].string(), values.offset);
    if (f == cpu::QuantFormat::kInt4) {
      unpacked.resize(size_t(shapes[j].n * shapes[j].k));
      cpu::nibbles_to_int4(v, int64_t(unpacked.size()), unpacked.data(), what.c_str());
      q8 = unpacked.data();
    }
    try {
      cpu::pack_weights_into(f, q8, reinterpret_cast<const float*>(direct_data(scales)),
                             shapes[j].n, shapes[j].k, q.group_size,
                             reinterpret_cast<uint8_t*>(s.memory + layout_.made[j]),
                             /*parallel=*/false);  // one maker per core already
    } catch (const Error& e) {
      fail("{}: {}", what, e.what());
    }
  }
}

}  // namespace sluice
