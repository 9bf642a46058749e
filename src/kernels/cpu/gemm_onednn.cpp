#include "kernels/cpu/gemm_onednn.h"

#include <spdlog/spdlog.h>

#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <vector>

#include "kernels/cpu/convert.h"

namespace sluice::cpu::onednn {
namespace {

using dnnl::memory;

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
// A null entry records that oneDNN has no primitive for that key on this CPU.
std::map<PrimitiveKey, std::shared_ptr<CachedMatmul>> g_cache;

std::shared_ptr<CachedMatmul> create(const GemmArgs& a, int64_t m_key, int64_t bf16_ldx) {
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
  try {
    auto entry = std::make_shared<CachedMatmul>();
    entry->pd =
        dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), attr, cpu_engine());
    entry->primitive = dnnl::matmul(entry->pd);
    return entry;
  } catch (const dnnl::error& e) {
    spdlog::debug("oneDNN has no bf16 matmul for m={} n={} k={} here ({}); using sluice's own",
                  m_key, a.n, a.k, e.what());
    return nullptr;
  }
}

std::shared_ptr<CachedMatmul> get_matmul(const GemmArgs& a, int64_t bf16_ldx, bool runtime_rows) {
  const int64_t m_key = runtime_rows ? DNNL_RUNTIME_DIM_VAL : a.m;
  PrimitiveKey key{m_key, a.n, a.k, bf16_ldx, a.ldw, a.ldy, a.beta};
  std::lock_guard lock(g_cache_mutex);
  auto it = g_cache.find(key);
  if (it != g_cache.end()) return it->second;
  return g_cache.emplace(key, create(a, m_key, bf16_ldx)).first->second;
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

int64_t bf16_stride(const GemmArgs& a) {
  return a.x_dtype == DType::F32 ? a.k : a.ldx;
}

void execute(const CachedMatmul& mm, const GemmArgs& a, const uint16_t* x_bf16, int64_t ldx) {
  memory::desc src({a.m, a.k}, memory::data_type::bf16, memory::dims{ldx, 1});
  memory::desc weights({a.k, a.n}, memory::data_type::bf16, memory::dims{1, a.ldw});
  memory::desc dst({a.m, a.n}, memory::data_type::f32, memory::dims{a.ldy, 1});
  auto& engine = cpu_engine();
  memory src_mem(src, engine, const_cast<uint16_t*>(x_bf16));
  memory weights_mem(weights, engine, const_cast<uint16_t*>(a.w));
  memory dst_mem(dst, engine, a.y);
  const memory::desc scratch_desc = mm.pd.scratchpad_desc();
  thread_local std::vector<uint8_t> scratch;
  constexpr size_t kAlign = 64;
  if (scratch.size() < scratch_desc.get_size() + kAlign)
    scratch.resize(scratch_desc.get_size() + kAlign);
  void* aligned = scratch.data() + (kAlign - reinterpret_cast<uintptr_t>(scratch.data()) % kAlign);
  memory scratch_mem(scratch_desc, engine, aligned);
  auto& stream = thread_stream();
  mm.primitive.execute(stream, {{DNNL_ARG_SRC, src_mem},
                                {DNNL_ARG_WEIGHTS, weights_mem},
                                {DNNL_ARG_DST, dst_mem},
                                {DNNL_ARG_SCRATCHPAD, scratch_mem}});
  stream.wait();
}

}  // namespace

bool try_gemm(const GemmArgs& a, bool runtime_rows) {
  const int64_t ldx = bf16_stride(a);
  auto mm = get_matmul(a, ldx, runtime_rows);
  if (!mm) return false;
  const uint16_t* x_bf16 =
      a.x_dtype == DType::F32 ? convert_rows(a) : static_cast<const uint16_t*>(a.x);
  execute(*mm, a, x_bf16, ldx);
  return true;
}

std::string implementation(const GemmArgs& a, bool runtime_rows) {
  auto mm = get_matmul(a, bf16_stride(a), runtime_rows);
  return mm ? std::string(mm->pd.impl_info_str()) : std::string();
}

size_t cached_primitives() {
  std::lock_guard lock(g_cache_mutex);
  size_t n = 0;
  for (const auto& [key, entry] : g_cache) n += entry != nullptr;
  return n;
}

}  // namespace sluice::cpu::onednn
