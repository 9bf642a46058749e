#include "kernels/cpu/gemm.h"

#include <omp.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/convert.h"

namespace sluice::cpu {
namespace {

using dnnl::memory;

std::atomic<GemmRowMode> g_row_mode{GemmRowMode::kExact};

struct ResolvedArgs {
  GemmArgs a;
  bool runtime_rows;
};

ResolvedArgs resolve(const GemmArgs& in) {
  GemmArgs a = in;
  if (a.ldx == 0) a.ldx = a.k;
  if (a.ldw == 0) a.ldw = a.k;
  if (a.ldy == 0) a.ldy = a.n;
  if (a.m < 0 || a.n <= 0 || a.k <= 0)
    fail("gemm: field 'shape': expected m >= 0, n > 0, k > 0, got m={} n={} k={}", a.m, a.n, a.k);
  if (a.ldx < a.k || a.ldw < a.k || a.ldy < a.n)
    fail("gemm: field 'ld': expected ldx >= k, ldw >= k, ldy >= n, got {} {} {} for k={} n={}",
         a.ldx, a.ldw, a.ldy, a.k, a.n);
  if (a.x_dtype != DType::F32 && a.x_dtype != DType::BF16)
    fail("gemm: field 'x_dtype': expected F32 or BF16, got {}", dtype_name(a.x_dtype));
  return {a, g_row_mode.load(std::memory_order_relaxed) == GemmRowMode::kRuntime};
}

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream(cpu_engine());
  return stream;
}

// Everything that changes the primitive. The X that reaches oneDNN is always bf16 (fp32 rows are
// converted into a packed scratch buffer first), so ldx is k for fp32 inputs.
using PrimitiveKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float>;

struct CachedMatmul {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul primitive;
};

std::mutex g_cache_mutex;
std::map<PrimitiveKey, std::shared_ptr<CachedMatmul>> g_cache;

std::shared_ptr<CachedMatmul> get_matmul(const GemmArgs& a, int64_t bf16_ldx, bool runtime_rows) {
  const int64_t m_key = runtime_rows ? DNNL_RUNTIME_DIM_VAL : a.m;
  PrimitiveKey key{m_key, a.n, a.k, bf16_ldx, a.ldw, a.ldy, a.beta};
  std::lock_guard lock(g_cache_mutex);
  auto it = g_cache.find(key);
  if (it != g_cache.end()) return it->second;

  memory::desc src({m_key, a.k}, memory::data_type::bf16, memory::dims{bf16_ldx, 1});
  // W is [n, k] row-major: as the K×N operand it has strides (1, ldw), i.e. format `ba`.
  memory::desc weights({a.k, a.n}, memory::data_type::bf16, memory::dims{1, a.ldw});
  memory::desc dst({m_key, a.n}, memory::data_type::f32, memory::dims{a.ldy, 1});
  dnnl::primitive_attr attr;
  // A cached primitive is executed from whichever thread calls gemm() (the offload stand-in's
  // compute queue and the host, at the same time). oneDNN's default library scratchpad is shared
  // by all primitives and only safe from the thread that created them; with a user scratchpad
  // per calling thread, concurrent calls are safe.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (a.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(a.beta);
    attr.set_post_ops(ops);
  }
  auto entry = std::make_shared<CachedMatmul>();
  entry->pd =
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), attr, cpu_engine());
  entry->primitive = dnnl::matmul(entry->pd);
  g_cache.emplace(key, entry);
  return entry;
}

// fp32 activations → packed bf16 rows in a per-thread buffer reused across calls.
const uint16_t* convert_rows(const GemmArgs& a) {
  thread_local std::vector<uint16_t> scratch;
  const size_t needed = size_t(a.m) * size_t(a.k);
  if (scratch.size() < needed) scratch.resize(needed);
  const float* x = static_cast<const float*>(a.x);
  uint16_t* out = scratch.data();
#pragma omp parallel for schedule(static) if (needed >= (1u << 16))
  for (int64_t r = 0; r < a.m; ++r) f32_to_bf16_row(x + r * a.ldx, out + r * a.k, size_t(a.k));
  return out;
}

}  // namespace

void gemm(const GemmArgs& args) {
  auto [a, runtime_rows] = resolve(args);
  if (a.m == 0) return;
  const uint16_t* x_bf16 = nullptr;
  int64_t bf16_ldx = a.ldx;
  if (a.x_dtype == DType::F32) {
    x_bf16 = convert_rows(a);
    bf16_ldx = a.k;
  } else {
    x_bf16 = static_cast<const uint16_t*>(a.x);
  }
  auto mm = get_matmul(a, bf16_ldx, runtime_rows);

  memory::desc src({a.m, a.k}, memory::data_type::bf16, memory::dims{bf16_ldx, 1});
  memory::desc weights({a.k, a.n}, memory::data_type::bf16, memory::dims{1, a.ldw});
  memory::desc dst({a.m, a.n}, memory::data_type::f32, memory::dims{a.ldy, 1});
  auto& engine = cpu_engine();
  memory src_mem(src, engine, const_cast<uint16_t*>(x_bf16));
  memory weights_mem(weights, engine, const_cast<uint16_t*>(a.w));
  memory dst_mem(dst, engine, a.y);
  auto& stream = thread_stream();
  const memory::desc scratch_desc = mm->pd.scratchpad_desc();
  thread_local std::vector<uint8_t> scratch;
  constexpr size_t kAlign = 64;
  if (scratch.size() < scratch_desc.get_size() + kAlign)
    scratch.resize(scratch_desc.get_size() + kAlign);
  void* aligned = scratch.data() + (kAlign - reinterpret_cast<uintptr_t>(scratch.data()) % kAlign);
  memory scratch_mem(scratch_desc, engine, aligned);
  mm->primitive.execute(stream, {{DNNL_ARG_SRC, src_mem},
                                 {DNNL_ARG_WEIGHTS, weights_mem},
                                 {DNNL_ARG_DST, dst_mem},
                                 {DNNL_ARG_SCRATCHPAD, scratch_mem}});
  stream.wait();
}

void gemm_reference(const GemmArgs& args) {
  const GemmArgs a = resolve(args).a;
  std::vector<float> row(size_t(a.k));
  for (int64_t i = 0; i < a.m; ++i) {
    for (int64_t p = 0; p < a.k; ++p) {
      row[p] = a.x_dtype == DType::F32
                   ? bf16_to_f32(f32_to_bf16(static_cast<const float*>(a.x)[i * a.ldx + p]))
                   : bf16_to_f32(static_cast<const uint16_t*>(a.x)[i * a.ldx + p]);
    }
    for (int64_t j = 0; j < a.n; ++j) {
      const uint16_t* w_row = a.w + j * a.ldw;
      float acc = 0.0f;
      for (int64_t p = 0; p < a.k; ++p) acc += row[p] * bf16_to_f32(w_row[p]);
      float& y = a.y[i * a.ldy + j];
      y = a.beta != 0.0f ? acc + a.beta * y : acc;
    }
  }
}

void set_gemm_row_mode(GemmRowMode mode) {
  g_row_mode.store(mode);
}
GemmRowMode gemm_row_mode() {
  return g_row_mode.load();
}

size_t gemm_cached_primitives() {
  std::lock_guard lock(g_cache_mutex);
  return g_cache.size();
}

const char* gemm_implementation(const GemmArgs& args) {
  auto [a, runtime_rows] = resolve(args);
  const int64_t bf16_ldx = a.x_dtype == DType::F32 ? a.k : a.ldx;
  return get_matmul(a, bf16_ldx, runtime_rows)->pd.impl_info_str();
}

}  // namespace sluice::cpu
