// What the offload executor measures and holds besides its numbers: the streamed weights
// page-locked through the Device (and released), each queue's busy time, the host→device bytes,
// and the figures `sluice bench` derives from them (PCIe fraction, GPU busy, decode bound). On the
// CPU stand-in with a simulated link, so copies take a known time.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "engine/batch_engine.h"
#include "engine/device_report.h"
#include "engine/offload_layout.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "runtime/offload/cpu_standin_device.h"
#include "runtime/offload/host_math.h"
#include "test_util.h"

namespace sluice {
namespace {

Policy small_policy() {
  Policy p;
  p.batch = 4;
  p.attn_micro_batch = 4;
  p.prefill_chunk = 8;
  p.expert_batch = 8;
  p.kv_block_size = 4;
  p.kv_blocks = 32;
  p.threads = 2;
  p.precision = Precision::kBf16;
  return p;
}

std::vector<Request> small_requests(const ModelConfig& c) {
  std::vector<Request> requests;
  for (int i = 0; i < 4; ++i) {
    Request r;
    r.id = i;
    for (int t = 0; t < 5 + i; ++t) r.prompt.push_back(3 + (t * 31 + i * 7) % (c.vocab_size - 3));
    r.max_new_tokens = 10;
    r.ignore_eos = true;
    requests.push_back(r);
  }
  return requests;
}

size_t streamed_expert_bytes(const Model& m) {
  size_t total = 0;
  for (const LayerWeights& L : m.weights.layers)
    total += L.expert_gate.nbytes() + L.expert_up.nbytes() + L.expert_down.nbytes();
  return total;
}

TEST(OffloadAccounting, StreamedWeightsArePinnedOnceAndReleasedAtTeardown) {
  const Model m = make_random_model(preset_config("tiny-mixtral"), 3);
  offload::CpuStandinDevice device(size_t(1) << 30);
  offload::HostMath math;
  const size_t experts = streamed_expert_bytes(m);
  {
    BatchEngine engine(m, small_policy(), EngineDevice{&device, &math, {}});
    // Every expert tensor is covered, widened to whole OS pages (at most two more per tensor);
    // the stand-in refuses overlapping registrations, so the ranges were merged.
    const size_t os_page = size_t(sysconf(_SC_PAGESIZE));
    EXPECT_GE(device.registered_bytes(), experts);
    EXPECT_LE(device.registered_bytes(), experts + 2 * os_page * 3 * m.weights.layers.size());
    engine.run(small_requests(m.config), [](Completion&&) {});
    EXPECT_EQ(engine.stats().device_pinned_weight_bytes, device.registered_bytes());
  }
  EXPECT_EQ(device.registered_bytes(), 0u);
}

// Resident layers' experts are copied to the device once and never streamed: only the streamed
// layers' expert weights are page-locked, and none when every layer is resident.
TEST(OffloadAccounting, OnlyStreamedLayersArePinned) {
  const Model m = make_random_model(preset_config("tiny-mixtral"), 3);
  ASSERT_EQ(m.config.num_layers, 2);
  const LayerWeights& streamed = m.weights.layers[0];  // of 2 with 1 resident, layer 1 is
  const size_t layer0 =
      streamed.expert_gate.nbytes() + streamed.expert_up.nbytes() + streamed.expert_down.nbytes();
  const size_t os_page = size_t(sysconf(_SC_PAGESIZE));
  for (int resident : {1, 2}) {
    offload::CpuStandinDevice device(size_t(1) << 30);
    offload::HostMath math;
    OffloadSettings settings;
    settings.resident_expert_layers = resident;
    BatchEngine engine(m, small_policy(), EngineDevice{&device, &math, settings});
    if (resident == 1) {
      EXPECT_GE(device.registered_bytes(), layer0);
      EXPECT_LE(device.registered_bytes(), layer0 + 2 * os_page * 3);
    } else {
      EXPECT_EQ(device.registered_bytes(), 0u);
    }
    engine.run(small_requests(m.config), [](Completion&&) {});
    EXPECT_EQ(engine.stats().device_pinned_weight_bytes, device.registered_bytes());
  }
}

// Each page copy takes page_bytes / rate on the simulated link (about a millisecond), so the
// weights queue's busy time, the copy rate and the decode bound can be checked against it.
TEST(OffloadAccounting, BusyTimesAndLinkFiguresAreConsistent) {
  const Model m = make_random_model(preset_config("tiny-mixtral"), 4);
  const double page = double(expert_matrix_bytes(m.config));
  const double rate = page / 1e-3;
  offload::CpuStandinDevice device(size_t(1) << 30, rate);
  offload::HostMath math;
  // From before the engine exists: making it already copies the resident weights, and the
  // queues' busy times count those copies too.
  const auto t0 = std::chrono::steady_clock::now();
  BatchEngine engine(m, small_policy(), EngineDevice{&device, &math, {0, 6, 0}});
  engine.run(small_requests(m.config), [](Completion&&) {});
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const EngineStats& s = engine.stats();

  EXPECT_DOUBLE_EQ(s.device_weight_bytes, double(s.device_pages_copied) * page);
  EXPECT_GT(s.device_bytes_to_device, s.device_weight_bytes);  // activations too
  // Every copy was simulated at `rate`: the weights queue was busy at least that long, and no
  // queue longer than the run.
  EXPECT_GE(s.device_weights_busy_seconds, 0.95 * s.device_weight_bytes / rate);
  for (double busy : {s.device_weights_busy_seconds, s.device_transfer_busy_seconds,
                      s.device_compute_busy_seconds}) {
    EXPECT_GT(busy, 0);
    EXPECT_LE(busy, wall);
  }
  EXPECT_GT(s.decode_only_steps, 0);
  EXPECT_GT(s.decode_only_device_weight_bytes, 0);
  EXPECT_LE(s.decode_only_tokens, s.decode_tokens);
  EXPECT_LE(s.decode_only_seconds, s.decode_seconds + s.prefill_seconds);

  const double reference = device.measure_host_to_device(size_t(page) * 16, 3);
  EXPECT_GT(reference, 0.5 * rate);
  EXPECT_LT(reference, 1.05 * rate);
  const DeviceReport r = device_report(s, wall, reference, "measured");
  EXPECT_GT(r.h2d_fraction, 0.5);  // copies ran near the simulated rate
  EXPECT_LE(r.h2d_fraction, 1.5);
  EXPECT_GT(r.link_busy_fraction, 0);
  EXPECT_LE(r.link_busy_fraction, 1);
  EXPECT_GT(r.gpu_busy_fraction, 0);
  EXPECT_LE(r.gpu_busy_fraction, 1);
  // A decode step cannot beat its copies: the bound holds, and copies dominate this run.
  EXPECT_GT(r.decode_bound_tokens_per_s, 0);
  EXPECT_GT(r.decode_bound_fraction, 0.2);
  EXPECT_LE(r.decode_bound_fraction, 1.5);
  EXPECT_DOUBLE_EQ(r.decode_bound_tokens_per_s,
                   double(s.decode_only_tokens) * reference / s.decode_only_device_weight_bytes);
  // The steps with prompt tokens cannot beat their copies either.
  EXPECT_DOUBLE_EQ(r.prefill_weight_bytes,
                   s.device_weight_bytes - s.decode_only_device_weight_bytes);
  EXPECT_GT(r.prefill_weight_bytes, 0);
  EXPECT_GT(r.prefill_bound_fraction, 0);
  EXPECT_LE(r.prefill_bound_fraction, 1.5);
}

TEST(OffloadAccounting, BenchJsonHasTheLinkAndDecodeBoundFields) {
  const auto r = testing::run_command(
      testing::sluice_command(
          "bench --preset tiny-mixtral --requests 3 --prompt-len 6 --gen-len 6 --ignore-eos"
          " --threads 2 --batch 4 --device standin --gpu-mem 64MiB --resident-expert-layers 0"
          // Slots for two experts: fewer than the model's, so decode steps copy (with a slot for
          // every page the device would keep them all after the first step).
          " --page-slots 6 --json"),
      /*with_stderr=*/false);
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j.at("device"), "cpu-standin");
  for (const char* positive :
       {"device_weight_bytes", "device_bytes_to_device", "device_weights_busy_seconds",
        "device_compute_busy_seconds", "pcie_h2d_reference_bytes_per_s", "pcie_h2d_bytes_per_s",
        "pcie_h2d_fraction", "gpu_busy_fraction", "decode_bound_tokens_per_s",
        "decode_bound_fraction", "decode_only_tokens_per_s", "device_pinned_weight_bytes",
        "prefill_weight_bytes", "prefill_step_seconds", "prefill_bound_fraction"})
    EXPECT_GT(j.at(positive).get<double>(), 0) << positive;
  // The host's ceilings do not bound a run whose GEMMs the device did: no fraction of them.
  for (const char* host_bound : {"fraction_of_roofline", "decode_fraction_of_roofline",
                                 "prefill_fraction_of_roofline", "fraction_of_dram"})
    EXPECT_FALSE(j.contains(host_bound)) << host_bound;
  EXPECT_EQ(j.at("pcie_h2d_reference_source"), "measured (3 x 256 MiB)");
}

}  // namespace
}  // namespace sluice
