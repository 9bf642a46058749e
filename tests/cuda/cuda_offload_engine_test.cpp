// The offload executor on a real GPU (CudaDevice + CudaMath) against the CPU engine, and the
// kernels CudaMath adds (offload_ops.h) against their CPU counterparts. Skipped, with a message,
// on machines without a GPU; compiled everywhere nvcc is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>

#include "../unit/test_util.h"
#include "../unit/tiny_model_cases.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "engine/batch_engine.h"
#include "kernels/cpu/gemm_f32.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/offload_ops.h"
#include "model/expert_quant.h"
#include "model/presets.h"
#include "model/synthetic.h"

namespace sluice {
namespace {

template <typename T>
T* to_device(const std::vector<T>& host) {
  T* p = nullptr;
  SLUICE_CUDA_CHECK(
      cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(1, host.size()) * sizeof(T)));
  SLUICE_CUDA_CHECK(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
template <typename T>
std::vector<T> to_host(const T* p, size_t n) {
  std::vector<T> out(n);
  SLUICE_CUDA_CHECK(cudaDeviceSynchronize());
  SLUICE_CUDA_CHECK(cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return out;
}

TEST(CudaOffloadOps, RouterGemmMatchesGemmF32) {
  SKIP_WITHOUT_GPU("CUDA offload test");
  std::mt19937 rng(7);
  std::normal_distribution<float> d;
  for (auto [m, n, k] : {std::tuple{1, 8, 64}, {37, 5, 4096}, {300, 160, 7168}, {3, 33, 31}}) {
    std::vector<float> x(size_t(m) * k), y0(size_t(m) * n);
    std::vector<uint16_t> w(size_t(n) * k);
    for (float& v : x) v = d(rng);
    for (uint16_t& v : w) v = f32_to_bf16(d(rng));
    for (float& v : y0) v = d(rng);
    for (float beta : {0.0f, 1.0f}) {
      std::vector<float> want = y0;
      cpu::gemm_f32({m, n, k, x.data(), w.data(), want.data(), beta});
      float *dx = to_device(x), *dy = to_device(y0);
      uint16_t* dw = to_device(w);
      cuda::gemm_f32_bf16w(dx, dw, dy, m, n, k, beta, nullptr);
      const std::vector<float> got = to_host(dy, want.size());
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-4f * (1.0f + std::fabs(want[i])) * std::sqrt(float(k)))
            << "m=" << m << " n=" << n << " k=" << k << " i=" << i;
      cudaFree(dx), cudaFree(dy), cudaFree(dw);
    }
  }
}

TEST(CudaOffloadOps, ConversionAndGatherAreExact) {
  SKIP_WITHOUT_GPU("CUDA offload test");
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 100.0f);
  const int64_t rows = 13, cols = 1001;
  std::vector<float> src(size_t(rows * cols));
  for (float& v : src) v = d(rng);
  src[5] = std::nanf("");
  std::vector<int32_t> pick = {12, 0, 7, 7 - 1, 3};
  float* ds = to_device(src);
  int32_t* dp = to_device(pick);
  uint16_t* db = nullptr;
  float* dg = nullptr;
  SLUICE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&db), src.size() * 2));
  SLUICE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dg), pick.size() * cols * 4));
  cuda::f32_to_bf16(ds, db, int64_t(src.size()), nullptr);
  cuda::gather_rows_f32(ds, cols, dp, int64_t(pick.size()), dg, nullptr);
  const auto b = to_host(db, src.size());
  const auto g = to_host(dg, pick.size() * cols);
  for (size_t i = 0; i < src.size(); ++i)
    if (!std::isnan(src[i])) {
      ASSERT_EQ(b[i], f32_to_bf16(src[i])) << i;
    }
  EXPECT_TRUE(std::isnan(bf16_to_f32(b[5])));
  for (size_t j = 0; j < pick.size(); ++j)
    for (int64_t c = 0; c < cols; ++c) {
      const float want = src[size_t(pick[j] * cols + c)], got = g[j * cols + size_t(c)];
      if (!std::isnan(want)) {
        ASSERT_EQ(got, want);
      }
    }
  cudaFree(ds), cudaFree(dp), cudaFree(db), cudaFree(dg);
}

// The whole engine on the GPU: greedy tokens and logits against the CPU engine, with every
// expert streamed and the lm_head on the host, with one of the two layers' experts resident and
// the lm_head on the device, and with every layer resident (no expert page copied); each with
// all attention on the CPU (ω = 1) and with half the sequences' attention on the GPU over its
// KV pool (ω = 0.5: the write_kv and paged attention kernels; refused for multi-head latent
// attention, which runs on the host only). Every family's tiny model and its feature variants
// (biases, clip_qkv, shared experts, dense layers, LayerNorm, MLA).
void expect_gpu_engine_matches_cpu_engine(const Model& m) {
  struct Variant {
    int resident;
    LmHeadPlace lm_head;
    double omega;
  };
  const int L = m.config.num_layers;
  for (Precision precision : {Precision::kF32, Precision::kBf16}) {
    Policy p = testing::exercising_policy(precision, 16);
    p.kv_blocks = 64;
    auto run = [&](BatchEngine& engine) {
      std::map<std::pair<int64_t, int>, std::vector<float>> logits;
      std::map<int64_t, std::vector<int>> tokens;
      engine.set_logits_observer([&](int64_t id, int pos, std::span<const float> row) {
        logits[{id, pos}] = std::vector<float>(row.begin(), row.end());
      });
      std::vector<Request> requests;
      for (int i = 0; i < 6; ++i) {
        Request r;
        r.id = i;
        r.prompt = testing::prompt_of(1 + 6 * i, i, m.config.vocab_size);
        r.max_new_tokens = 16;
        requests.push_back(r);
      }
      engine.run(requests, [&](Completion&& c) { tokens[c.id] = c.tokens; });
      return std::pair{tokens, logits};
    };
    BatchEngine cpu_engine(m, p);
    const auto [want_tokens, want_logits] = run(cpu_engine);
    for (const Variant v :
         {Variant{0, LmHeadPlace::kHost, 1.0}, Variant{1, LmHeadPlace::kDevice, 1.0},
          Variant{L, LmHeadPlace::kDevice, 1.0}, Variant{0, LmHeadPlace::kHost, 0.5},
          Variant{L, LmHeadPlace::kDevice, 0.5}}) {
      DeviceOptions o;
      o.kind = DeviceKind::kCuda;
      o.gpu_mem = "256MiB";
      o.settings.page_slots = 3;
      o.settings.cpu_expert_max_tokens = 2;
      o.settings.resident_expert_layers = v.resident;
      o.settings.lm_head = v.lm_head;
      o.settings.cpu_attention_share = v.omega;
      if (v.omega < 1 && m.config.attention == AttentionKind::kLatent) {
        // Multi-head latent attention runs on the host only (its latent cache and absorbed-form
        // kernel are the CPU's): a GPU share is refused by name, not run.
        EXPECT_THROW(
            {
              try {
                BatchEngine refused(m, p, o);
              } catch (const std::exception& e) {
                EXPECT_NE(std::string(e.what()).find("cpu_attention_share"), std::string::npos)
                    << e.what();
                throw;
              }
            },
            std::exception);
        continue;
      }
      BatchEngine gpu_engine(m, p, o);
      const auto [got_tokens, got_logits] = run(gpu_engine);
      // Request by request, position by position: the logits agree and so does the argmax, up to
      // the first position where the GPU picks another token. That may only be a near-tie (the
      // CPU's top two logits closer than the two engines' difference there): other summation
      // orders (cuBLASLt, warp reductions) may flip one; after it the contexts differ, and the
      // request's later positions are not compared.
      int compared = 0, same_argmax = 0, near_tie_flips = 0;
      double worst = 0;
      for (const auto& [id, want] : want_tokens) {
        for (auto w = want_logits.lower_bound({id, 0});
             w != want_logits.end() && w->first.first == id; ++w) {
          const int pos = w->first.second;
          const std::vector<float>& row = w->second;
          const std::vector<float>& got = got_logits.at({id, pos});
          double diff = 0, scale = 0;
          for (size_t i = 0; i < row.size(); ++i) {
            diff = std::max(diff, double(std::fabs(got[i] - row[i])));
            scale = std::max(scale, double(std::fabs(row[i])));
          }
          worst = std::max(worst, diff / scale);
          ++compared;
          const int a = argmax(row), b = argmax(got);
          if (a == b) {
            ++same_argmax;
          } else {
            std::vector<float> sorted = row;
            std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(),
                              std::greater<float>());
            EXPECT_LE(sorted[0] - sorted[1], 2 * diff)
                << "request " << id << " position " << pos << ": the GPU picked " << b
                << ", the CPU " << a << ", which is not a near-tie";
            ++near_tie_flips;
            break;
          }
        }
      }
      std::printf(
          "%s, %d of %d layers resident, lm_head on the %s, omega %.1f: worst relative logit "
          "error %.3g, same argmax %d of %d compared, %d near-tie flips\n",
          precision_name(precision), v.resident, L,
          v.lm_head == LmHeadPlace::kDevice ? "device" : "host", v.omega, worst, same_argmax,
          compared, near_tie_flips);
      // Different summation orders (cuBLASLt, warp reductions): the bf16 engine tests' tolerance.
      EXPECT_LT(worst, 1e-2);
      EXPECT_EQ(same_argmax + near_tie_flips, compared);
      if (precision == Precision::kF32 && near_tie_flips == 0) {
        EXPECT_EQ(got_tokens, want_tokens);
      }
      if (v.omega < 1) {
        EXPECT_GT(gpu_engine.stats().device_gpu_attention_rows, 0);
      } else {
        EXPECT_EQ(gpu_engine.stats().device_gpu_attention_rows, 0);
      }
      const int64_t pages = gpu_engine.stats().device_pages_copied;
      if (v.resident == L) {
        EXPECT_EQ(pages, 0);
        EXPECT_EQ(gpu_engine.stats().device_cpu_experts, 0);
      } else {
        EXPECT_GT(pages, 3);
      }
    }
  }
}

class CudaOffloadEngine : public ::testing::TestWithParam<testing::TinyModelCase> {};

TEST_P(CudaOffloadEngine, MatchesTheCpuEngine) {
  SKIP_WITHOUT_GPU("CUDA offload test");
  ModelConfig config = preset_config("tiny-mixtral");
  GetParam().edit(config);
  expect_gpu_engine_matches_cpu_engine(make_random_model(config, 42));
}

INSTANTIATE_TEST_SUITE_P(TinyModels, CudaOffloadEngine,
                         ::testing::ValuesIn(testing::family_cases()),
                         [](const auto& case_info) { return std::string(case_info.param.name); });

// Quantized experts (--expert-dtype int8/int4) on the GPU: the packed bytes streamed and the
// quantized GEMM kernel (kernels/cuda/quant_gemm.h), against the CPU engine on the same
// quantized model, in every setting above.
class CudaQuantizedEngine : public ::testing::TestWithParam<testing::QuantizedTinyCase> {};

TEST_P(CudaQuantizedEngine, MatchesTheCpuEngine) {
  SKIP_WITHOUT_GPU("CUDA quantized offload test");
  Model m = make_random_model(preset_config(GetParam().preset), 42);
  quantize_model_experts(m, {GetParam().dtype, GetParam().group});
  expect_gpu_engine_matches_cpu_engine(m);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, CudaQuantizedEngine,
                         ::testing::ValuesIn(testing::quantized_tiny_cases()),
                         testing::quantized_case_name);

}  // namespace
}  // namespace sluice
