// The process's cblas_sgemm, found by name: MKL's when engine/runtime/blas.py loaded it first
// (RTLD_GLOBAL), else whatever BLAS MLX brought. Shared by the kernels that hand dense
// products to it (quantized_matmul.cpp's prefill tiles, attention_tiles.cpp).
#pragma once

#include <dlfcn.h>

namespace brisk {

enum { kRowMajor = 101, kNoTrans = 111, kTrans = 112 };  // CBLAS's enum values
using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                       int);

inline Sgemm find_sgemm() {
  static const Sgemm found = reinterpret_cast<Sgemm>(dlsym(RTLD_DEFAULT, "cblas_sgemm"));
  return found;
}

}  // namespace brisk
