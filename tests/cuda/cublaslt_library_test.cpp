// cuBLASLt is opened on first use, not linked: the sluice binary starts without it, and the
// library, once opened, gives every entry point the GEMM uses. Needs no GPU: the library loads
// and answers status names without one.
#include "kernels/cuda/cublaslt_library.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "../unit/test_util.h"

namespace sluice {
namespace {

std::string command_output(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return out;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
  pclose(pipe);
  return out;
}

TEST(CublasLtLibrary, TheBinaryDoesNotLinkCublas) {
  const std::string libraries = command_output("ldd " + testing::sluice_binary());
  ASSERT_NE(libraries.find("libcudart"), std::string::npos) << libraries;
  EXPECT_EQ(libraries.find("libcublas"), std::string::npos) << libraries;
}

TEST(CublasLtLibrary, OpensOnFirstUseWithEveryEntryPoint) {
  const cuda::CublasLt& lt = cuda::cublaslt();
  EXPECT_STREQ(lt.get_status_name(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
  EXPECT_NE(std::string(lt.get_status_string(CUBLAS_STATUS_INVALID_VALUE)), "");
  for (const void* entry :
       {(const void*)lt.create, (const void*)lt.destroy, (const void*)lt.matmul,
        (const void*)lt.matmul_algo_get_heuristic, (const void*)lt.matmul_desc_create,
        (const void*)lt.matmul_desc_destroy, (const void*)lt.matmul_desc_set_attribute,
        (const void*)lt.matmul_preference_create, (const void*)lt.matmul_preference_destroy,
        (const void*)lt.matmul_preference_set_attribute, (const void*)lt.matrix_layout_create,
        (const void*)lt.matrix_layout_destroy})
    EXPECT_NE(entry, nullptr);
  std::ifstream maps("/proc/self/maps");
  const std::string mapped{std::istreambuf_iterator<char>(maps), {}};
  EXPECT_NE(mapped.find(cuda::cublaslt_soname()), std::string::npos);
  EXPECT_EQ(&cuda::cublaslt(), &lt);  // opened once
}

}  // namespace
}  // namespace sluice
