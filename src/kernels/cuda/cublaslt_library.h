// cuBLASLt, opened with dlopen on first use rather than linked. Linking it made every sluice
// process, GPU or not, load and relocate its 540 MB at start: about 0.6 s and 210 MB resident
// before main (measured 2026-12-02, AMD EPYC Zen 5, CUDA 13). The entry points keep the types of
// cublasLt.h's declarations, so a call through the table is checked like a direct one.
#pragma once

#include <cublasLt.h>

namespace sluice::cuda {

struct CublasLt {
  decltype(&::cublasLtCreate) create;
  decltype(&::cublasLtDestroy) destroy;
  decltype(&::cublasLtGetStatusName) get_status_name;
  decltype(&::cublasLtGetStatusString) get_status_string;
  decltype(&::cublasLtMatmul) matmul;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) matmul_algo_get_heuristic;
  decltype(&::cublasLtMatmulDescCreate) matmul_desc_create;
  decltype(&::cublasLtMatmulDescDestroy) matmul_desc_destroy;
  decltype(&::cublasLtMatmulDescSetAttribute) matmul_desc_set_attribute;
  decltype(&::cublasLtMatmulPreferenceCreate) matmul_preference_create;
  decltype(&::cublasLtMatmulPreferenceDestroy) matmul_preference_destroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) matmul_preference_set_attribute;
  decltype(&::cublasLtMatrixLayoutCreate) matrix_layout_create;
  decltype(&::cublasLtMatrixLayoutDestroy) matrix_layout_destroy;
};

// The library's entry points, the library opened on the first call (by its soname, through the
// usual search path, then from the CUDA toolkit this was built with) on the first call that
// succeeds. A library or entry point that cannot be found is a sluice::Error naming it.
const CublasLt& cublaslt();

// The soname looked for: libcublasLt.so.<the major version of the headers built against>.
const char* cublaslt_soname();

}  // namespace sluice::cuda
