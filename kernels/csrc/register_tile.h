// The float32 register tile shared by the AVX-512 dense kernels (float_gemm.cpp's products,
// attention_flash.cpp's q k^T): R <= 6 rows x 64 columns in 24 zmm accumulators, each step
// one broadcast of a per row against four vectors of a panel packed 64 wide. At ~98% of a
// core's FMA peak in L1 on a Zen 4 (a scratch micro-benchmark), where MKL's sgemm runs its
// generic AMD path at 55-85% of it. Callers' target attributes must include BRISK_TILE's.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)  // x86 only: arm64 builds leave it out
#include <immintrin.h>

#include <cstdint>

#define BRISK_TILE __attribute__((target("avx2,fma,avx512f")))

namespace brisk {

constexpr int kTileColumns = 64;  // four zmm: one panel row

// c (R x 64, row stride ldc, the columns in `cols` only) = scale * (init + a . panel), with
// a R rows of stride lda and panel `depth` rows of 64. init: c itself when `accumulate`, else
// the row `bias` (or zeros when null).
template <int R>
BRISK_TILE __attribute__((always_inline)) inline void register_tile(const float* a, int64_t lda, const float* panel,
                                                                    int depth, float* c, int64_t ldc,
                                                                    const __mmask16 (&cols)[4], const float* bias,
                                                                    bool accumulate, float scale = 1.f) {
  __m512 acc[R][4];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v)
      acc[r][v] = accumulate ? _mm512_maskz_loadu_ps(cols[v], c + r * ldc + 16 * v)
                  : bias     ? _mm512_maskz_loadu_ps(cols[v], bias + 16 * v)
                             : _mm512_setzero_ps();
  for (int k = 0; k < depth; ++k, panel += kTileColumns) {
    const __m512 b0 = _mm512_loadu_ps(panel), b1 = _mm512_loadu_ps(panel + 16), b2 = _mm512_loadu_ps(panel + 32),
                 b3 = _mm512_loadu_ps(panel + 48);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 s = _mm512_set1_ps(a[r * lda + k]);
      acc[r][0] = _mm512_fmadd_ps(s, b0, acc[r][0]), acc[r][1] = _mm512_fmadd_ps(s, b1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(s, b2, acc[r][2]), acc[r][3] = _mm512_fmadd_ps(s, b3, acc[r][3]);
    }
  }
  const __m512 k = _mm512_set1_ps(scale);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) _mm512_mask_storeu_ps(c + r * ldc + 16 * v, cols[v], _mm512_mul_ps(acc[r][v], k));
}

}  // namespace brisk
#endif
