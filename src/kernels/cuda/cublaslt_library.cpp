#include "kernels/cuda/cublaslt_library.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <string>

#include "core/error.h"

#define SLUICE_STR2(x) #x
#define SLUICE_STR(x) SLUICE_STR2(x)

namespace sluice::cuda {

namespace {

void* open_library() {
  if (void* h = dlopen(cublaslt_soname(), RTLD_NOW | RTLD_LOCAL)) return h;
  const std::string first_error = dlerror();
#ifdef SLUICE_CUDA_LIBRARY_DIR
  const std::string in_toolkit = std::string(SLUICE_CUDA_LIBRARY_DIR) + "/" + cublaslt_soname();
  if (void* h = dlopen(in_toolkit.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
#endif
  fail("cuBLASLt: cannot open {} ({}); the CUDA backend needs the CUDA toolkit's cuBLAS libraries "
       "on the library path (LD_LIBRARY_PATH)",
       cublaslt_soname(), first_error);
}

template <typename Fn>
void bind(void* library, Fn& slot, const char* name) {
  dlerror();
  void* symbol = dlsym(library, name);
  if (!symbol)
    fail("cuBLASLt: {} has no entry point '{}' (a cuBLAS older than the headers built against?)",
         cublaslt_soname(), name);
  slot = reinterpret_cast<Fn>(symbol);
}

CublasLt load() {
  void* library = open_library();  // kept open for the life of the process
  CublasLt lt{};
  bind(library, lt.create, "cublasLtCreate");
  bind(library, lt.destroy, "cublasLtDestroy");
  bind(library, lt.get_status_name, "cublasLtGetStatusName");
  bind(library, lt.get_status_string, "cublasLtGetStatusString");
  bind(library, lt.matmul, "cublasLtMatmul");
  bind(library, lt.matmul_algo_get_heuristic, "cublasLtMatmulAlgoGetHeuristic");
  bind(library, lt.matmul_desc_create, "cublasLtMatmulDescCreate");
  bind(library, lt.matmul_desc_destroy, "cublasLtMatmulDescDestroy");
  bind(library, lt.matmul_desc_set_attribute, "cublasLtMatmulDescSetAttribute");
  bind(library, lt.matmul_preference_create, "cublasLtMatmulPreferenceCreate");
  bind(library, lt.matmul_preference_destroy, "cublasLtMatmulPreferenceDestroy");
  bind(library, lt.matmul_preference_set_attribute, "cublasLtMatmulPreferenceSetAttribute");
  bind(library, lt.matrix_layout_create, "cublasLtMatrixLayoutCreate");
  bind(library, lt.matrix_layout_destroy, "cublasLtMatrixLayoutDestroy");
  return lt;
}

}  // namespace

const char* cublaslt_soname() { return "libcublasLt.so." SLUICE_STR(CUBLAS_VER_MAJOR); }

const CublasLt& cublaslt() {
  static const CublasLt lt = load();  // a throw leaves it unset: the next call tries again
  return lt;
}

}  // namespace sluice::cuda
