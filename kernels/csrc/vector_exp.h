// 2^x on eight float lanes, shared by the kernels that exponentiate in bulk (attention's
// online softmax; the softmax weights of sampling and of SpecPrefill's pooled attention,
// exp2_weights below). MLX's CPU exp costs ~22 ns per element; this is a few cycles.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace brisk {

// 2^x for x <= 0 on eight lanes: x = n + f, 2^f by a degree-6 polynomial (rel. error ~2e-7),
// 2^n into the exponent. Lanes under -126 (masked keys: -inf) give 0.
inline __m256 exp2_ps(__m256 x) {
  const __m256 low = _mm256_set1_ps(-126.f);
  const __m256 underflow = _mm256_cmp_ps(x, low, _CMP_LT_OQ);
  x = _mm256_max_ps(x, low);
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);  // [-0.5, 0.5]
  __m256 p = _mm256_set1_ps(1.5353362e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3398874e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504109e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022651e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// The same on sixteen lanes, for CPUs with AVX-512 (callers check at run time: the library is
// built for AVX2). Lane for lane the same operations as exp2_ps, so the same values.
#define BRISK_AVX512_EXP __attribute__((target("avx2,fma,avx512f")))
BRISK_AVX512_EXP inline __m512 exp2_ps512(__m512 x) {
  const __m512 low = _mm512_set1_ps(-126.f);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, low, _CMP_LT_OQ);
  x = _mm512_max_ps(x, low);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.5353362e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3398874e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(~underflow, p, _mm512_castsi512_ps(e));
}

}  // namespace brisk
#endif

#include <cmath>
#include <cstdint>

namespace brisk {

// w[i] = 2^((x[i] - max) * scale) for i < n (0 for -inf and NaN), and their sum: the weights of
// a softmax, shared by the sampler and SpecPrefill's pooled attention.
inline double exp2_weights(const float* x, int64_t n, float max, float scale, float* w) {
  int64_t i = 0;
  double total = 0.0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 m = _mm256_set1_ps(max), s = _mm256_set1_ps(scale);
  __m256 sum = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 ordered = _mm256_cmp_ps(v, v, _CMP_ORD_Q);  // NaN lanes: 0
    const __m256 e = _mm256_and_ps(ordered, exp2_ps(_mm256_mul_ps(_mm256_sub_ps(v, m), s)));
    _mm256_storeu_ps(w + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  for (float lane : lanes) total += lane;
#endif
  for (; i < n; ++i) {
    w[i] = std::isnan(x[i]) ? 0.f : std::exp2((x[i] - max) * scale);
    total += w[i];
  }
  return total;
}

}  // namespace brisk
