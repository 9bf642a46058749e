// The disk tier: a model whose routed experts stay in their files, read into a host page pool of a
// fraction of them, gives the logits of the same model held in memory, bit for bit (the same
// bytes reach the same kernels); the pool's books add up; a file truncated while the job runs
// fails with its name and offset; a budget too small for the resident part names the minimum. The
// cases cover every kind of expert the pool reads: bf16, int8, int4, FP8, and stored transposed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include "core/error.h"
#include "disk_cases.h"
#include "engine/batch_engine.h"
#include "engine/disk_experts.h"
#include "engine/weights_in_memory.h"
#include "io/direct_reader.h"
#include "model/expert_files.h"
#include "model/expert_quant.h"
#include "model/gguf_export.h"
#include "model/model_stats.h"
#include "model/presets.h"
#include "model/quantize_checkpoint.h"
#include "model/synthetic.h"
#include "runtime/disk/expert_page_pool.h"
#include "runtime/planner/planner.h"
#include "test_util.h"
#include "tiny_model_cases.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

struct RunResult {
  std::map<std::pair<int64_t, int>, std::vector<float>> logits;
  std::vector<std::vector<int>> tokens;
  EngineStats stats;
};

RunResult run_engine(const Model& m, int pool_experts, int new_tokens = 4) {
  Policy p = testing::exercising_policy(Precision::kBf16, new_tokens);
  p.pool_experts = pool_experts;
  BatchEngine engine(m, p);
  RunResult out;
  engine.set_logits_observer([&](int64_t id, int pos, std::span<const float> row) {
    out.logits[{id, pos}] = std::vector<float>(row.begin(), row.end());
  });
  std::vector<Request> requests = testing::prompt_length_requests(m.config.vocab_size, new_tokens);
  out.tokens.resize(requests.size());
  engine.run(requests, [&](Completion&& c) { out.tokens[size_t(c.id)] = c.tokens; });
  out.stats = engine.stats();
  return out;
}

int64_t all_experts(const ModelConfig& c) {
  int64_t n = 0;
  for (int l = 0; l < c.num_layers; ++l) n += c.is_moe_layer(l) ? c.num_experts : 0;
  return n;
}

// The first MoE layer of a config.
int first_moe_layer(const ModelConfig& c) {
  int layer = 0;
  while (!c.is_moe_layer(layer)) ++layer;
  return layer;
}

// The pool's books once its loader has read `experts` experts, or after 5 s.
ExpertPoolStats stats_once_read(const ExpertPagePool& pool, int64_t experts) {
  ExpertPoolStats s = pool.stats();
  for (int i = 0; i < 500 && s.experts_read < experts; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    s = pool.stats();
  }
  return s;
}

using testing::DiskCase;
using testing::load_with_experts_on_disk;
using testing::write_checkpoint;

class DiskTier : public ::testing::TestWithParam<DiskCase> {};

TEST_P(DiskTier, ASmallPoolGivesTheLogitsOfTheModelInMemory) {
  const testing::CheckpointTwice models(GetParam(), 11);
  const Model &in_memory = models.in_memory, &on_disk = models.on_disk;
  ASSERT_TRUE(on_disk.expert_files);
  EXPECT_TRUE(on_disk.weights.layers.back().expert_gate.empty());
  const int64_t experts = all_experts(on_disk.config);
  const int pool = 3;  // a fraction of the experts: they stream through it
  ASSERT_LT(pool * 4, experts);

  const RunResult want = run_engine(in_memory, 0);
  const RunResult got = run_engine(on_disk, pool);
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  for (const auto& [key, row] : want.logits)
    EXPECT_EQ(got.logits.at(key), row) << "request " << key.first << " position " << key.second;

  const ExpertPoolStats& s = got.stats.disk;
  EXPECT_FALSE(got.stats.disk_reads.empty());
  EXPECT_GT(s.demands, 0);
  EXPECT_LE(s.hits, s.demands);
  // Every demand that missed was read before its GEMMs; guesses still on their way when the run
  // ended were not.
  EXPECT_GE(s.experts_read, s.demands - s.hits);
  EXPECT_LE(s.experts_read, s.demands - s.hits + s.guesses);
  EXPECT_GE(s.bytes_read, double(s.experts_read) * s.expert_bytes);
}

// The pool allocates what the planner counted for it and no more: its slots are what the files'
// experts need, and at most the planner's count from the config alone (host_memory_use); the
// expert bytes the planner counts a read are the files' (values and their scales).
TEST_P(DiskTier, ThePoolHoldsNoMoreThanThePlannerCounts) {
  TempDir dir;
  const fs::path model_dir = write_checkpoint(GetParam(), dir, 13);
  const Model on_disk = load_with_experts_on_disk(model_dir);
  ASSERT_TRUE(on_disk.expert_files);
  const int slots = 3;
  const ExpertPagePool pool(on_disk.config, on_disk.expert_files, slots);
  const size_t slot = expert_slot_bytes(on_disk.config, *on_disk.expert_files);
  EXPECT_EQ(on_disk.expert_files->expert_file_bytes(), expert_file_bytes(on_disk.config));
  // The matrices the config counts a second buffer for (DBRX's transposed down) are the ones the
  // pool makes as they land.
  for (size_t j = 0; j < 3; ++j)
    EXPECT_EQ(on_disk.expert_files->made_on_read(j), on_disk.config.stored_experts[j].made_on_read);
  EXPECT_GE(slot, expert_file_bytes(on_disk.config));
  EXPECT_EQ(pool.bytes(), slots * slot);
  EXPECT_LE(pool.bytes(), slots * expert_slot_bytes(on_disk.config));
}

// Guesses for a layer that the router did not choose are dropped when the layer begins, unless
// already on their way: a dropped guess is neither read nor counted; a chosen one is a hit.
TEST_P(DiskTier, GuessesTheRouterDidNotChooseAreDroppedOrRead) {
  TempDir dir;
  const fs::path model_dir = write_checkpoint(GetParam(), dir, 14);
  const Model on_disk = load_with_experts_on_disk(model_dir);
  const int layer = first_moe_layer(on_disk.config);
  ExpertPagePool pool(on_disk.config, on_disk.expert_files, 4);
  for (int e = 0; e < 4; ++e) EXPECT_TRUE(pool.prefetch({layer, e}, false));
  pool.drop_guesses(layer, {2});
  pool.set_current_layer(layer);
  EXPECT_TRUE(pool.prefetch({layer, 2}, true));
  pool.acquire({layer, 2});
  pool.release({layer, 2});
  // Every guess still counted lands.
  const ExpertPoolStats s = stats_once_read(pool, pool.stats().guesses);
  EXPECT_GE(s.guesses, 1);
  EXPECT_LE(s.guesses, 4);
  EXPECT_EQ(s.experts_read, s.guesses);
  EXPECT_EQ(s.demands, 1);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.guesses_used, 1);
}

// A slot that held a guess never chosen, taken for an expert the router chose, keeps nothing of
// the guess: that expert is not counted as a guess used when it is hit again.
TEST_P(DiskTier, ASlotTakenFromAnUnusedGuessStartsAfresh) {
  TempDir dir;
  const fs::path model_dir = write_checkpoint(GetParam(), dir, 15);
  const Model on_disk = load_with_experts_on_disk(model_dir);
  const int layer = first_moe_layer(on_disk.config);
  ExpertPagePool pool(on_disk.config, on_disk.expert_files, kMinPoolExperts);
  pool.set_current_layer(layer);
  for (int e = 0; e < kMinPoolExperts; ++e) ASSERT_TRUE(pool.prefetch({layer, e}, false));
  ASSERT_EQ(stats_once_read(pool, kMinPoolExperts).experts_read, kMinPoolExperts);
  const ExpertKey chosen{layer, kMinPoolExperts};  // evicts one of the guesses
  ASSERT_TRUE(pool.prefetch(chosen, true));
  pool.acquire(chosen);
  pool.release(chosen);
  ASSERT_TRUE(pool.prefetch(chosen, true));  // a hit
  pool.acquire(chosen);
  pool.release(chosen);
  const ExpertPoolStats s = pool.stats();
  EXPECT_EQ(s.demands, 2);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.guesses, kMinPoolExperts);
  EXPECT_EQ(s.guesses_used, 0);
}

// DiskExperts guesses the next MoE layer's experts of the last step (all of them when the step has
// enough tokens to use nearly every one), less those an offload device keeps: they are taken
// there, never asked of the pool.
TEST_P(DiskTier, GuessesSkipTheExpertsTheDeviceKeeps) {
  TempDir dir;
  const Model on_disk = load_with_experts_on_disk(write_checkpoint(GetParam(), dir, 16));
  const ModelConfig& c = on_disk.config;
  std::vector<int> moe;
  for (int l = 0; l < c.num_layers; ++l)
    if (c.is_moe_layer(l)) moe.push_back(l);
  ASSERT_GE(moe.size(), 2u);
  ASSERT_GE(c.num_experts, 3);
  DiskExperts disk(c, on_disk.expert_files, 8);
  const auto run_step = [&](int tokens) {
    for (int l : moe) {
      const std::vector<int> chosen = l == moe[1] ? std::vector<int>{2, 1} : std::vector<int>{0};
      disk.begin_layer(l, chosen, tokens);
      for (int i = 0; i < int(chosen.size()); ++i) {
        disk.acquire(i);
        disk.release(i);
      }
    }
  };
  run_step(1);
  EXPECT_EQ(disk.guesses(moe[1]), (std::vector<int>{2, 1}));
  disk.set_kept_on_device([&](int l, int e) { return l == moe[1] && e == 1; });
  EXPECT_EQ(disk.guesses(moe[1]), (std::vector<int>{2}));
  run_step(1000);  // every expert is expected to be used
  std::vector<int> all_but_1;
  for (int e = 0; e < c.num_experts; ++e)
    if (e != 1) all_but_1.push_back(e);
  EXPECT_EQ(disk.guesses(moe[1]), all_but_1);
}

// An expert held elsewhere (an offload device's cache) gives its pool slot up first, before the
// one the pool's own order would choose.
TEST_P(DiskTier, AnExpertKeptElsewhereGivesItsSlotUpFirst) {
  TempDir dir;
  const Model on_disk = load_with_experts_on_disk(write_checkpoint(GetParam(), dir, 17));
  const int layer = first_moe_layer(on_disk.config);
  const auto expert_0_stays = [&](bool expert_0_kept_elsewhere) {
    ExpertPagePool pool(on_disk.config, on_disk.expert_files, 2);
    pool.set_current_layer(layer);
    for (int e : {0, 0, 1}) {  // expert 0 used twice: the pool's own order evicts expert 1
      pool.prefetch({layer, e}, true);
      pool.acquire({layer, e});
      pool.release({layer, e});
    }
    if (expert_0_kept_elsewhere)
      pool.set_kept_elsewhere([&](ExpertKey k) { return k.layer == layer && k.expert == 0; });
    pool.prefetch({layer, 2}, true);
    pool.acquire({layer, 2});
    pool.release({layer, 2});
    return pool.landed({layer, 0});
  };
  EXPECT_TRUE(expert_0_stays(false));
  EXPECT_FALSE(expert_0_stays(true));
}

// What `inspect` counts without reading an expert: the experts left on disk, as the engine would
// hold them, give the numbers of the model loaded whole.
TEST_P(DiskTier, WholeModelStatsCountTheExpertsLeftOnDisk) {
  const testing::CheckpointTwice models(GetParam(), 5);
  const ModelStats whole = model_stats(models.in_memory);
  const ModelStats counted = whole_model_stats(models.on_disk);
  EXPECT_LT(model_stats(models.on_disk).total_bytes, whole.total_bytes);
  EXPECT_EQ(counted.total_params, whole.total_params);
  EXPECT_EQ(counted.total_bytes, whole.total_bytes);
  EXPECT_EQ(counted.expert_bytes, whole.expert_bytes);
  EXPECT_EQ(counted.bytes_per_dtype, whole.bytes_per_dtype);
  EXPECT_EQ(counted.active_params_per_token, whole.active_params_per_token);
  // FP8's codes and block scales are rounded apart in the one, together in the other.
  EXPECT_NEAR(double(counted.bytes_touched_per_token), double(whole.bytes_touched_per_token), 8);
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, DiskTier, ::testing::ValuesIn(testing::disk_cases()),
                         testing::disk_case_name);

// A GGUF file's experts stay in it, each a slice of its layer's stacked tensor: BF16 read as
// stored, Q8_0 and Q4_0 dequantised as they land, with the logits of the file loaded whole, bit
// for bit; the pool holds no more than the planner counts from the file's config. (DBRX in BF16
// only: its down rows of 40 are not whole blocks, and export_gguf stores those in F32.)
TEST(DiskTierGguf, ExpertsReadFromTheFileGiveTheLogitsOfTheFileInMemory) {
  const std::pair<const char*, GgufWeights> cases[] = {{"tiny-mixtral", GgufWeights::kBF16},
                                                       {"tiny-mixtral", GgufWeights::kQ8_0},
                                                       {"tiny-mixtral", GgufWeights::kQ4_0},
                                                       {"tiny-dbrx", GgufWeights::kBF16}};
  for (const auto& [preset, w] : cases) {
    SCOPED_TRACE(std::string(preset) + " " + gguf_weights_name(w));
    TempDir dir;
    const ModelConfig c = preset_config(preset);
    write_random_checkpoint(c, dir / "hf", 19);
    write_synthetic_tokenizer(c, dir / "hf");
    const fs::path file = export_gguf(dir / "hf", dir / "m.gguf", w);
    const Model in_memory = load_model(file);
    const Model on_disk = load_with_experts_on_disk(file);
    ASSERT_TRUE(on_disk.expert_files);
    EXPECT_TRUE(on_disk.weights.layers.back().expert_gate.empty());
    EXPECT_EQ(on_disk.expert_files->made_on_read(0), w != GgufWeights::kBF16);

    const RunResult want = run_engine(in_memory, 0);
    const RunResult got = run_engine(on_disk, 3);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.logits, want.logits);
    EXPECT_GT(got.stats.disk.experts_read, 0);

    EXPECT_EQ(on_disk.expert_files->expert_file_bytes(), expert_file_bytes(on_disk.config));
    EXPECT_LE(expert_slot_bytes(on_disk.config, *on_disk.expert_files),
              expert_slot_bytes(on_disk.config));
  }
}

// Experts loading would keep in F32 (or F16) are refused by name before anything is read.
TEST(DiskTierGguf, F32ExpertsAreRefusedNamingTheirType) {
  TempDir dir;
  const ModelConfig c = preset_config("tiny-mixtral");
  write_random_checkpoint(c, dir / "hf", 19);
  write_synthetic_tokenizer(c, dir / "hf");
  const fs::path file = export_gguf(dir / "hf", dir / "m.gguf", GgufWeights::kF32);
  EXPECT_ERROR_MENTIONS(load_with_experts_on_disk(file), "m.gguf",
                        "a GGUF file whose routed experts are F32", "--host-mem");
}

TEST(DiskTierFaults, AFileTruncatedWhileTheJobRunsFailsNamingTheFileAndOffset) {
  TempDir dir;
  write_random_checkpoint(preset_config("tiny-mixtral"), dir / "m", 13);
  const Model on_disk = load_with_experts_on_disk(dir / "m");
  // The expert range that ends the file is cut after its first byte.
  const ExpertFiles& files = *on_disk.expert_files;
  ASSERT_EQ(files.files.size(), 1u);
  const fs::path file = files.files[0];
  uint64_t last = 0;
  for (const auto& layer : files.layers)
    for (const ExpertSource& s : layer)
      for (const FileRange& r : s.weights) last = std::max(last, r.offset);
  fs::resize_file(file, last + 1);
  const std::string name = file.string(), where = fmt::format("offset {}", last);
  EXPECT_ERROR_MENTIONS(run_engine(on_disk, 3), name.c_str(), where.c_str(), "truncated");
}

// An int4 checkpoint's values changed on disk to nibbles no quantizer writes: the maker thread's
// pack refuses them, and the step fails naming the file and the offset (never wrong numbers).
TEST(DiskTierFaults, ValuesThePackRefusesFailTheStepNamingTheFileAndOffset) {
  TempDir dir;
  write_random_checkpoint(preset_config("tiny-mixtral"), dir / "bf16", 17);
  quantize_checkpoint(dir / "bf16", dir / "q", ExpertDtype::kInt4, 32);
  const Model on_disk = load_with_experts_on_disk(dir / "q");
  const ExpertFiles& files = *on_disk.expert_files;
  {
    std::fstream f(files.files[0], std::ios::in | std::ios::out | std::ios::binary);
    for (const auto& layer : files.layers)
      for (const ExpertSource& e : layer) {
        const std::string zeros(e.weights[0].bytes, '\0');  // every gate: nibble 0, q = -8
        f.seekp(std::streamoff(e.weights[0].offset));
        f.write(zeros.data(), std::streamsize(zeros.size()));
      }
  }
  const std::string name = files.files[0].string();
  EXPECT_ERROR_MENTIONS(run_engine(on_disk, 3), name.c_str(), "offset ", "nibble 0");
}

TEST(DiskTierFaults, ABudgetTooSmallForTheResidentPartNamesTheMinimum) {
  const ModelConfig c = preset_config("tiny-mixtral");
  HardwareProfile hw = quick_profile(1e10, 1e11);
  hw.disk_bytes_per_s = 1e9;
  const std::vector<WorkloadRequest> work = uniform_workload(4, 16, 8);
  const size_t resident = model_weight_bytes(c) - routed_expert_bytes(c);
  ASSERT_TRUE(experts_stay_on_disk(c, resident));
  MemoryLimits limits{resident, 0, true};
  EXPECT_ERROR_MENTIONS(plan_policy(hw, c, Policy{}, work, limits, {}), "needs at least",
                        "stay on disk", "pool of 2 experts", "--host-mem");
  // With room for the resident part, the smallest KV cache and activations and a few experts the
  // plan fits, and the pool gets what is left.
  limits.host_bytes = resident + (size_t(4) << 20);
  const Plan plan = plan_policy(hw, c, Policy{}, work, limits, {});
  EXPECT_GE(plan.chosen.policy.pool_experts, kMinPoolExperts);
  EXPECT_LE(plan.chosen.memory.total(), limits.host_bytes);
}

// Ranges at misaligned offsets come back byte for byte, with O_DIRECT where the file system
// allows it, through the page cache on tmpfs.
TEST(DirectReader, ReadsMisalignedRangesExactly) {
  std::vector<fs::path> dirs = {fs::temp_directory_path()};
  if (fs::is_directory("/dev/shm")) dirs.push_back("/dev/shm");
  for (const fs::path& where : dirs) {
    const fs::path file = where / fmt::format("sluice-direct-{}.bin", getpid());
    std::string bytes(3 * kDirectAlign + 123, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 7 + i / 4096);
    testing::write_file(file, bytes);
    DirectReader reader({file}, 4);
    const std::vector<std::pair<uint64_t, size_t>> ranges = {
        {0, 10},
        {5, kDirectAlign},
        {kDirectAlign - 1, 2},
        {2 * kDirectAlign + 7, kDirectAlign + 116}};
    std::vector<std::unique_ptr<std::byte, decltype(&std::free)>> buffers;
    std::vector<FileRead> reads;
    for (auto [offset, n] : ranges) {
      buffers.emplace_back(
          static_cast<std::byte*>(std::aligned_alloc(kDirectAlign, direct_buffer_bytes(offset, n))),
          &std::free);
      reads.push_back({0, offset, n, buffers.back().get()});
    }
    std::vector<int> done(reads.size(), 0);
    reader.read(reads, [&](size_t i) { ++done[i]; });
    for (size_t i = 0; i < reads.size(); ++i) {
      EXPECT_EQ(done[i], 1);
      EXPECT_EQ(std::memcmp(direct_data(reads[i]), bytes.data() + reads[i].offset, reads[i].bytes),
                0)
          << where << " range " << i;
    }
    EXPECT_FALSE(reader.note().empty());
    fs::remove(file);
  }
}

// A stream of reads: `next` is asked again as reads land, so one that had none for a moment
// ("none now", with reads in flight) is asked again later; every read lands once, exactly, with
// its tag; the call returns only when `next` has none and nothing is in flight.
TEST(DirectReader, AStreamIsRefilledAsReadsLand) {
  const fs::path file = fs::temp_directory_path() / fmt::format("sluice-stream-{}.bin", getpid());
  std::string bytes(40 * kDirectAlign, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 13 + i / 4096);
  testing::write_file(file, bytes);
  DirectReader reader({file}, 3);
  constexpr size_t kReads = 12;
  std::vector<std::unique_ptr<std::byte, decltype(&std::free)>> buffers;
  std::vector<FileRead> reads;
  for (size_t i = 0; i < kReads; ++i) {
    const uint64_t offset = i * 3 * kDirectAlign + i;
    const size_t n = kDirectAlign + 7 * i;
    buffers.emplace_back(
        static_cast<std::byte*>(std::aligned_alloc(kDirectAlign, direct_buffer_bytes(offset, n))),
        &std::free);
    reads.push_back({0, offset, n, buffers.back().get()});
  }
  size_t handed = 0, asked = 0;
  std::vector<int> landed(kReads, 0);
  reader.read_stream(
      [&]() -> std::optional<DirectReader::TaggedRead> {
        // Every third question has nothing, but only while a read is in flight.
        const bool in_flight = handed > size_t(std::count(landed.begin(), landed.end(), 1));
        if (++asked % 3 == 0 && in_flight) return std::nullopt;
        if (handed == kReads) return std::nullopt;
        const size_t i = handed++;
        return DirectReader::TaggedRead{reads[i], 100 + i};
      },
      [&](uint64_t tag) { ++landed[size_t(tag - 100)]; });
  EXPECT_EQ(handed, kReads);
  for (size_t i = 0; i < kReads; ++i) {
    EXPECT_EQ(landed[i], 1) << "read " << i;
    EXPECT_EQ(std::memcmp(direct_data(reads[i]), bytes.data() + reads[i].offset, reads[i].bytes), 0)
        << "read " << i;
  }
  // With nothing to read, it returns at once.
  reader.read_stream([] { return std::optional<DirectReader::TaggedRead>(); },
                     [](uint64_t) { ADD_FAILURE() << "nothing was asked for"; });
  // A read it cannot make (a misaligned buffer) fails the stream once those in flight landed.
  handed = 0;
  EXPECT_ERROR_MENTIONS(reader.read_stream(
                            [&]() -> std::optional<DirectReader::TaggedRead> {
                              const size_t i = handed++;
                              FileRead r = reads[i % kReads];
                              if (i == 2) ++r.buffer;
                              return DirectReader::TaggedRead{r, i};
                            },
                            [&](uint64_t tag) { ++landed[size_t(tag)]; }),
                        "aligned to 4096 bytes");
  EXPECT_EQ(handed, 3u) << "nothing is asked for after the refusal";
  fs::remove(file);
}

}  // namespace
}  // namespace sluice
