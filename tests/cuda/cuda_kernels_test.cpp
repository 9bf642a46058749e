// Each CUDA kernel against its CPU kernel (kernels/cpu/), over awkward sizes. Skipped, with a
// message, on machines without a GPU; compiled everywhere nvcc is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/routing.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"
#include "runtime/gpu/cuda_device.h"
#include "runtime/kv_cache.h"

namespace sluice {
namespace {

using testing::DeviceVec;

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float rel,
                  float abs_tol, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], abs_tol + rel * std::fabs(want[i])) << what << " at " << i;
}

TEST(CudaKernels, RmsNormMatchesCpu) {
  SKIP_WITHOUT_GPU("CUDA kernel test");
  for (int64_t dim : {1, 7, 128, 4096, 5000}) {
    const int64_t rows = 5;
    auto x = random_floats(size_t(rows * dim), 1), w = random_floats(size_t(dim), 2);
    std::vector<float> want(x.size());
    cpu::RmsNormArgs a;
    a.x = x.data();
    a.y = want.data();
    a.rows = rows;
    a.dim = dim;
    a.weight = w.data();
    a.weight_dtype = DType::F32;
    cpu::rms_norm_reference(a);
    DeviceVec<float> dx(x), dw(w), dy(std::vector<float>(x.size()));
    cuda::rms_norm(dx.ptr, dy.ptr, rows, dim, dw.ptr, a.eps, nullptr);
    expect_close(dy.get(), want, 2e-6f, 1e-6f, "rms_norm");
  }
}

TEST(CudaKernels, LayerNormMatchesCpu) {
  SKIP_WITHOUT_GPU("CUDA kernel test");
  for (int64_t dim : {1, 7, 128, 4096, 5000}) {
    const int64_t rows = 5;
    auto x = random_floats(size_t(rows * dim), 11), w = random_floats(size_t(dim), 12);
    for (float& v : x) v += 2.0f;  // off zero, so the centring matters
    std::vector<float> want(x.size());
    cpu::RmsNormArgs a;
    a.x = x.data();
    a.y = want.data();
    a.rows = rows;
    a.dim = dim;
    a.weight = w.data();
    a.weight_dtype = DType::F32;
    cpu::layer_norm_reference(a);
    DeviceVec<float> dx(x), dw(w);
    cuda::layer_norm(dx.ptr, dx.ptr, rows, dim, dw.ptr, a.eps, nullptr);  // in place
    // fp32 sums in another order than the double reference: as cpu::layer_norm's own test.
    expect_close(dx.get(), want, 1e-5f, 1e-5f, "layer_norm");
  }
}

// add_bias, clamp and sigmoid are exact against the host loops of HostMath (one rounding each;
// sigmoid's exp rounded from double, which the host's expf matches to the last bit or one ulp).
TEST(CudaKernels, BiasClampSigmoidAndScaledRowsMatchTheHostLoops) {
  SKIP_WITHOUT_GPU("CUDA kernel test");
  const int64_t rows = 7, cols = 333;
  auto y = random_floats(size_t(rows * cols), 13, 3.0f), bias = random_floats(size_t(cols), 14);
  DeviceVec<float> dy(y), db(bias);
  cuda::add_bias(dy.ptr, db.ptr, rows, cols, nullptr);
  cuda::clamp(dy.ptr, rows * cols, 1.5f, nullptr);
  std::vector<float> want = y;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < cols; ++i) {
      float& v = want[size_t(r * cols + i)];
      v = std::min(std::max(v + bias[size_t(i)], -1.5f), 1.5f);
    }
  expect_close(dy.get(), want, 0, 0, "add_bias+clamp");
  auto z = random_floats(100003, 15, 6.0f);
  DeviceVec<float> dz(z);
  cuda::sigmoid(dz.ptr, int64_t(z.size()), nullptr);
  for (float& v : z) v = 1.0f / (1.0f + std::exp(-v));
  expect_close(dz.get(), z, 2.4e-7f, 0, "sigmoid");
  auto src = random_floats(size_t(rows * cols), 16), dst = random_floats(size_t(rows * cols), 17);
  auto scales = random_floats(size_t(rows), 18);
  DeviceVec<float> ds(src), dd(dst), dsc(scales);
  cuda::add_scaled_rows(ds.ptr, cols, dsc.ptr, rows, dd.ptr, nullptr);
  cuda::add_scaled_rows(ds.ptr, cols, nullptr, rows, dd.ptr, nullptr);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < cols; ++i) {
      float& d = dst[size_t(r * cols + i)];
      d += scales[size_t(r)] * src[size_t(r * cols + i)];
      d += 1.0f * src[size_t(r * cols + i)];
    }
  expect_close(dd.get(), dst, 0, 0, "add_scaled_rows");
}

TEST(CudaKernels, RopeMatchesCpuAtLongPositions) {
  SKIP_WITHOUT_GPU("CUDA kernel test");
  const int heads = 3, head_dim = 128;
  const std::vector<int32_t> pos = {0, 1, 17, 4095, 32767, 131071};
  auto x = random_floats(pos.size() * heads * head_dim, 3);
  auto inv_freq = cpu::rope_inv_freq(head_dim, 1e6f);
  std::vector<float> want = x;
  cpu::RopeArgs a;
  a.x = want.data();
  a.rows = int64_t(pos.size());
  a.n_heads = heads;
  a.head_dim = head_dim;
  a.positions = pos.data();
  a.inv_freq = inv_freq.data();
  cpu::apply_rope_reference(a);
  DeviceVec<float> dx(x), df(inv_freq);
  DeviceVec<int32_t> dp(pos);
  cuda::apply_rope(dx.ptr, a.rows, heads, head_dim, 0, dp.ptr, df.ptr, nullptr);
  // Same fp32 angle and rounding; cos/sin of CUDA's double math may differ by one float ulp.
  expect_close(dx.get(), want, 3e-7f, 1e-7f, "rope");
}

TEST(CudaKernels, SiluMulMatchesCpu) {
  SKIP_WITHOUT_GPU("CUDA kernel test");
  auto g = random_floats(100003, 4, 4.0f), u = random_floats(100003, 5);
  std::vector<float> want(g.size());
  cpu::silu_mul_reference(g.data(), u.data(), want.data(), int64_t(g.size()));
  DeviceVec<float> dg(g), du(u);
  cuda::silu_mul(dg.ptr, du.ptr, dg.ptr, int64_t(g.size()), nullptr);
  expect_close(dg.get(), want, 1e-6f, 1e-7f, "silu_mul");
}

TEST(CudaKernels, RoutingMatchesCpu) {
  SKIP_WITHOUT_GPU("CUDA kernel test");
  for (auto [E, K] : {std::pair{8, 2}, {64, 6}, {160, 8}}) {
    const int64_t T = 301;
    auto logits = random_floats(size_t(T * E), 6, 2.0f);
    for (int e = 0; e < E; e += 5) logits[size_t(e)] = logits[0];  // ties in token 0
    std::vector<int32_t> ids(size_t(T * K));
    std::vector<float> w(size_t(T * K));
    cpu::route_top_k({logits.data(), T, E, K, true, ids.data(), w.data()});
    DeviceVec<float> dl(logits), dw(w);
    DeviceVec<int32_t> di(ids);
    cuda::route_top_k(dl.ptr, T, E, K, true, di.ptr, dw.ptr, nullptr);
    EXPECT_EQ(di.get(), ids) << "E=" << E;
    expect_close(dw.get(), w, 2e-6f, 1e-7f, "routing weights");
  }
}

// DeepSeek's rules (sigmoid or softmax scores, the selection bias, groups ranked by their best
// or best two, renormalised or not, scaled) through the rule kernel against the CPU kernel.
TEST(CudaKernels, RoutingRulesMatchCpu) {
  SKIP_WITHOUT_GPU("CUDA kernel test");
  struct Rule {
    int E, K, groups, groups_per_token;
    cpu::RouterScoreFn score;
    cpu::GroupRank rank;
    bool bias, renormalize;
    float scale;
  };
  const Rule rules[] = {
      {64, 6, 1, 1, cpu::RouterScoreFn::kSoftmax, cpu::GroupRank::kBest, false, false, 1.0f},
      {160, 6, 8, 3, cpu::RouterScoreFn::kSoftmax, cpu::GroupRank::kBest, false, false, 16.0f},
      {256, 8, 8, 4, cpu::RouterScoreFn::kSigmoid, cpu::GroupRank::kBestTwoSum, true, true, 2.5f},
      {21, 5, 7, 3, cpu::RouterScoreFn::kSigmoid, cpu::GroupRank::kBestTwoSum, true, false, 1.0f}};
  for (const Rule& r : rules) {
    const int64_t T = 301;
    auto logits = random_floats(size_t(T * r.E), 8, 2.0f);
    auto bias = random_floats(size_t(r.E), 9, 0.2f);
    std::vector<int32_t> ids(size_t(T * r.K));
    std::vector<float> w(size_t(T * r.K));
    cpu::RoutingArgs a{logits.data(), T, r.E, r.K, r.renormalize, ids.data(), w.data()};
    a.score = r.score;
    a.selection_bias = r.bias ? bias.data() : nullptr;
    a.groups = r.groups;
    a.groups_per_token = r.groups_per_token;
    a.group_rank = r.rank;
    a.scale = r.scale;
    cpu::route_top_k(a);
    DeviceVec<float> dl(logits), db(bias), dw(w);
    DeviceVec<int32_t> di(ids);
    a.logits = dl.ptr;
    a.selection_bias = r.bias ? db.ptr : nullptr;
    a.expert_ids = di.ptr;
    a.weights = dw.ptr;
    cuda::route_top_k(a, nullptr);
    EXPECT_EQ(di.get(), ids) << "E=" << r.E;
    expect_close(dw.get(), w, 2e-6f, 1e-7f, "routing weights");
  }
}

TEST(CudaKernels, GatherAndWeightedScatterAdd) {
  SKIP_WITHOUT_GPU("CUDA kernel test");
  const int64_t rows = 50, cols = 777;
  auto x = random_floats(size_t(rows * cols), 7);
  const std::vector<int32_t> pick = {3, 49, 0, 17, 18};
  const std::vector<float> weights = {0.5f, -1.0f, 2.0f, 0.25f, 1.0f};
  DeviceVec<float> dx(x), dw(weights);
  DeviceVec<int32_t> dp(pick);
  DeviceVec<uint16_t> dg(std::vector<uint16_t>(pick.size() * cols));
  cuda::gather_rows_bf16(dx.ptr, cols, dp.ptr, int64_t(pick.size()), dg.ptr, nullptr);
  const auto gathered = dg.get();
  for (size_t j = 0; j < pick.size(); ++j)
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(gathered[j * cols + c], f32_to_bf16(x[size_t(pick[j] * cols + c)]));
  auto src = random_floats(pick.size() * cols, 8);
  DeviceVec<float> ds(src);
  cuda::scatter_add_rows(ds.ptr, cols, dp.ptr, dw.ptr, int64_t(pick.size()), dx.ptr, nullptr);
  std::vector<float> want = x;
  for (size_t j = 0; j < pick.size(); ++j)
    for (int64_t c = 0; c < cols; ++c)
      want[size_t(pick[j] * cols + c)] += weights[j] * src[j * cols + c];
  expect_close(dx.get(), want, 0, 0, "scatter_add");
}

TEST(CudaKernels, ArgmaxKeepsLowestIndexOfTies) {
  SKIP_WITHOUT_GPU("CUDA kernel test");
  const int64_t cols = 32003;
  auto logits = random_floats(size_t(3 * cols), 9);
  logits[100] = logits[20000] = 50.0f;      // row 0: tie, 100 wins
  logits[size_t(cols + cols - 1)] = 60.0f;  // row 1: last column
  DeviceVec<float> dl(logits);
  DeviceVec<int32_t> out(std::vector<int32_t>(3));
  cuda::argmax_rows(dl.ptr, 3, cols, out.ptr, nullptr);
  const auto got = out.get();
  EXPECT_EQ(got[0], 100);
  EXPECT_EQ(got[1], int32_t(cols - 1));
  EXPECT_EQ(got[2], int32_t(std::max_element(logits.begin() + 2 * cols, logits.end()) -
                            (logits.begin() + 2 * cols)));
}

std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
  auto f = random_floats(n, seed, 0.1f);
  std::vector<uint16_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = f32_to_bf16(f[i]);
  return b;
}

TEST(CudaKernels, GemmAndExpertGemmsMatchCpu) {
  SKIP_WITHOUT_GPU("CUDA kernel test");
  gpu::CudaDevice device(0, size_t(1) << 30);
  offload::DeviceBuffer workspace(device, cuda::GemmContext::kWorkspaceBytes, "workspace");
  cuda::GemmContext ctx(workspace.ptr, workspace.bytes);
  for (auto [m, n, k] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 64, 64}, {37, 300, 257}, {512, 1024, 4096}}) {
    auto x = random_bf16(size_t(m * k), 10), w = random_bf16(size_t(n * k), 11);
    auto y0 = random_floats(size_t(m * n), 12);
    for (float beta : {0.0f, 1.0f}) {
      std::vector<float> want = y0;
      cpu::GemmArgs a;
      a.m = m;
      a.n = n;
      a.k = k;
      a.x = x.data();
      a.x_dtype = DType::BF16;
      a.w = w.data();
      a.y = want.data();
      a.beta = beta;
      cpu::gemm_reference(a);
      DeviceVec<uint16_t> dx(x), dw(w);
      DeviceVec<float> dy(y0);
      ctx.gemm({m, n, k}, dx.ptr, dw.ptr, dy.ptr, beta, nullptr);
      // Same bf16 products, fp32 sums in a different order.
      expect_close(dy.get(), want, 1e-4f, 1e-4f, "gemm");
    }
  }
  // Two experts with different token counts in one call.
  const int64_t n = 96, k = 200;
  auto w0 = random_bf16(size_t(n * k), 13), w1 = random_bf16(size_t(n * k), 14);
  auto x0 = random_bf16(size_t(5 * k), 15), x1 = random_bf16(size_t(33 * k), 16);
  DeviceVec<uint16_t> dw0(w0), dw1(w1), dx0(x0), dx1(x1);
  DeviceVec<float> dy0(std::vector<float>(size_t(5 * n))), dy1(std::vector<float>(size_t(33 * n)));
  const cuda::GemmContext::ExpertGemm calls[] = {{5, dx0.ptr, dw0.ptr, dy0.ptr},
                                                 {33, dx1.ptr, dw1.ptr, dy1.ptr}};
  ctx.expert_gemms(n, k, calls, nullptr);
  for (auto [m, xs, ws, dy] :
       {std::tuple{int64_t(5), &x0, &w0, &dy0}, {int64_t(33), &x1, &w1, &dy1}}) {
    std::vector<float> want(size_t(m * n));
    cpu::GemmArgs a;
    a.m = m;
    a.n = n;
    a.k = k;
    a.x = xs->data();
    a.x_dtype = DType::BF16;
    a.w = ws->data();
    a.y = want.data();
    cpu::gemm_reference(a);
    expect_close(dy->get(), want, 1e-4f, 1e-4f, "expert gemm");
  }
}

TEST(CudaKernels, PagedAttentionMatchesCpuOverTheSamePool) {
  SKIP_WITHOUT_GPU("CUDA kernel test");
  KvCacheConfig cfg;
  cfg.n_layers = 1;
  cfg.kv_heads = 2;
  cfg.head_dim = 64;
  cfg.block_size = 16;
  cfg.total_blocks = 40;
  PagedKvCache kv(cfg);
  const int heads = 8, kvd = cfg.kv_heads * cfg.head_dim;
  const std::vector<int> lengths = {1, 37, 300};
  for (int s = 0; s < int(lengths.size()); ++s) {
    kv.allocate(s);
    ASSERT_TRUE(kv.append_slots(s, lengths[size_t(s)]));
    auto k = random_floats(size_t(lengths[size_t(s)] * kvd), 20 + s);
    auto v = random_floats(size_t(lengths[size_t(s)] * kvd), 30 + s);
    kv.write_tokens(0, s, 0, lengths[size_t(s)], k.data(), v.data());
  }
  for (int window : {0, 20}) {
    // Each sequence's last two positions query (one for length 1).
    std::vector<int32_t> row_pos, row_table, tables;
    std::vector<cpu::AttentionSequence> seqs;
    const int rows_total = 1 + 2 + 2;
    auto q = random_floats(size_t(rows_total * heads * cfg.head_dim), 40);
    std::vector<float> want(q.size());
    int row = 0;
    for (int s = 0; s < int(lengths.size()); ++s) {
      const int n_q = std::min(2, lengths[size_t(s)]);
      const auto table = kv.block_table(s);
      cpu::AttentionSequence a;
      a.q = &q[size_t(row) * heads * cfg.head_dim];
      a.out = &want[size_t(row) * heads * cfg.head_dim];
      a.n_q = n_q;
      a.q_start = lengths[size_t(s)] - n_q;
      a.kv_len = lengths[size_t(s)];
      a.block_table = table;
      seqs.push_back(a);
      for (int i = 0; i < n_q; ++i) {
        row_pos.push_back(a.q_start + i);
        row_table.push_back(int32_t(tables.size()));
      }
      tables.insert(tables.end(), table.begin(), table.end());
      row += n_q;
    }
    cpu::AttentionParams params;
    params.heads = heads;
    params.kv_heads = cfg.kv_heads;
    params.head_dim = cfg.head_dim;
    params.sliding_window = window;
    cpu::paged_attention(params, kv.layer_view(0), seqs);

    const KvLayerView view = kv.layer_view(0);
    std::vector<uint16_t> pool(view.base, view.base + view.block_elems() * cfg.total_blocks);
    DeviceVec<uint16_t> dpool(pool);
    DeviceVec<float> dq(q), dout(std::vector<float>(q.size()));
    DeviceVec<int32_t> dpos(row_pos), drt(row_table), dt(tables);
    cuda::PagedAttentionArgs a;
    a.heads = heads;
    a.kv_heads = cfg.kv_heads;
    a.head_dim = cfg.head_dim;
    a.block_size = cfg.block_size;
    a.sliding_window = window;
    a.kv = dpool.ptr;
    a.rows = rows_total;
    a.q = dq.ptr;
    a.out = dout.ptr;
    a.row_pos = dpos.ptr;
    a.row_table = drt.ptr;
    a.tables = dt.ptr;
    cuda::paged_attention(a, nullptr);
    expect_close(dout.get(), want, 1e-4f, 1e-5f, "paged attention");
  }
}

TEST(CudaDevice, BudgetIsHardAndErrorsNameTheRequest) {
  SKIP_WITHOUT_GPU("CUDA kernel test");
  gpu::CudaDevice device(0, size_t(64) << 20);
  void* a = device.allocate(size_t(48) << 20, "first");
  try {
    device.allocate(size_t(32) << 20, "expert slot");
    FAIL() << "expected the budget to refuse";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert slot"), std::string::npos) << e.what();
  }
  device.deallocate(a, size_t(48) << 20);
  EXPECT_EQ(device.budget().used(), 0u);
}

TEST(CudaDevice, CudaErrorsReportOperationAndMessage) {
  SKIP_WITHOUT_GPU("CUDA kernel test");
  try {
    SLUICE_CUDA_CHECK(cudaSetDevice(9999));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cudaSetDevice(9999)"), std::string::npos) << m;
    EXPECT_NE(m.find("cudaErrorInvalidDevice"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace sluice
