// Causal attention for long prefill chunks: the flash-attention recurrence over blocks of
// keys, with q k^T and p v as sgemm calls (MKL where engine/runtime/blas.py loaded it).
//
// attention.cpp's kernel takes one query row at a time against eight keys, reading each key
// from L1 again for every row: ~90 GFLOP/s here, a third of sgemm's, and at 8K tokens
// attention is most of a prefill chunk (issue 18). Here all of a query head's rows meet a
// block of keys in one sgemm, the online softmax runs over the scores with the shared
// vectorized exp (on the pool's threads), and a second sgemm adds p v into the head's output.
// The n x n matrix never exists: scores are one block of keys wide. Same layout and
// arithmetic as attention.cpp (base-2 softmax, float32 accumulation, float16 keys and values
// widened a block at a time). What it does not take (short chunks, no sgemm in the process,
// BRISK_ATTENTION_TILES=0) it declines, and attention.cpp runs. Built into the MLX primitives module.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "half.h"
#include "sgemm.h"
#include "vector_exp.h"
#include "isa.h"

extern "C" void brisk_parallel_for(int units, int threads, void (*task)(void*, int), void* context);
extern "C" int brisk_attention_flash(const float*, const void*, const void*, int, float*, int, int, int, int, int, int,
                                     const int64_t*, const int64_t*, float, int, int, int);  // attention_flash.cpp

namespace {

constexpr int kMinRows = 64;     // shorter chunks (decode, verify passes) keep attention.cpp's kernel
constexpr int kKeyBlock = 256;   // keys per block: a 512-row chunk's scores are 512 KB per query head
constexpr int kRowUnit = 16;     // rows a pool thread takes at a time in the softmax
constexpr float kLog2e = 1.4426950408889634f;

using brisk::find_sgemm, brisk::kNoTrans, brisk::kRowMajor, brisk::kTrans, brisk::Sgemm;

// One block of keys [j0, j0 + n) for rows [first, first + rows) of a KV head's query heads
// stacked (row R is head R / L's query position i = R % L): the scores s (row R at
// s + (R - first) * kKeyBlock, already q k^T) become p = exp2(s * scale - max), masked past
// each row's last visible key, and each row's running max, sum and output o are rescaled.
struct Step {
  float* s;
  float *o, *max, *sum;  // all stacked rows
  int first, rows, L, n, D, j0;
  int base;  // causal: position i sees keys [0, base + i + 1)
  bool causal;
  float scale;
};

#if defined(__AVX2__) && defined(__FMA__)
// A row's scaled scores, their max and p = exp2(s - max) with their sum, 16 lanes at a time
// (AVX-512, checked at run time): at 8K tokens SmolLM2's prefill is three quarters
// attention, and this loop a third of that.
BRISK_AVX512_EXP void softmax_row_512(float* s, int valid, float scale, float old_max, float& new_max, float& total) {
  const __m512 k = _mm512_set1_ps(scale);
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  int j = 0;
  for (; j + 16 <= valid; j += 16) {
    const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(s + j), k);
    _mm512_storeu_ps(s + j, v);
    vmax = _mm512_max_ps(vmax, v);
  }
  float block_max = _mm512_reduce_max_ps(vmax);
  for (; j < valid; ++j) block_max = std::max(block_max, s[j] *= scale);
  new_max = std::max(old_max, block_max);
  const __m512 m = _mm512_set1_ps(new_max);
  __m512 vtotal = _mm512_setzero_ps();
  j = 0;
  for (; j + 16 <= valid; j += 16) {
    const __m512 e = brisk::exp2_ps512(_mm512_sub_ps(_mm512_loadu_ps(s + j), m));
    _mm512_storeu_ps(s + j, e);
    vtotal = _mm512_add_ps(vtotal, e);
  }
  total = _mm512_reduce_add_ps(vtotal);
  for (; j < valid; ++j) total += (s[j] = std::exp2(s[j] - new_max));
}

bool has_avx512() {
  static const bool has = brisk::isa_allows(brisk::kIsaAvx512) && __builtin_cpu_supports("avx512f");
  return has;
}
#endif

// The same with eight lanes where AVX2 is all there is (and a scalar loop without it).
void softmax_row(float* s, int valid, float scale, float old_max, float& new_max, float& total) {
  int j = 0;
  float block_max = -INFINITY;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 k = _mm256_set1_ps(scale);
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  for (; j + 8 <= valid; j += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + j), k);
    _mm256_storeu_ps(s + j, v);
    vmax = _mm256_max_ps(vmax, v);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  for (float lane : lanes) block_max = std::max(block_max, lane);
#endif
  for (; j < valid; ++j) block_max = std::max(block_max, s[j] *= scale);
  new_max = std::max(old_max, block_max);
  total = 0.f;
  j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 m = _mm256_set1_ps(new_max);
  __m256 vtotal = _mm256_setzero_ps();
  for (; j + 8 <= valid; j += 8) {
    const __m256 e = brisk::exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
    _mm256_storeu_ps(s + j, e);
    vtotal = _mm256_add_ps(vtotal, e);
  }
  _mm256_store_ps(lanes, vtotal);
  for (float lane : lanes) total += lane;
#endif
  for (; j < valid; ++j) total += (s[j] = std::exp2(s[j] - new_max));
}

void softmax_unit(void* context, int unit) {
  const Step& st = *static_cast<const Step*>(context);
  for (int r = unit * kRowUnit; r < std::min(st.rows, (unit + 1) * kRowUnit); ++r) {
    const int row = st.first + r, i = row % st.L;
    float* s = st.s + int64_t(r) * kKeyBlock;
    const int valid = st.causal ? std::min(st.n, st.base + i + 1 - st.j0) : st.n;  // >= 1 for rows >= lo
    float new_max, total;
#if defined(__AVX2__) && defined(__FMA__)
    if (has_avx512()) softmax_row_512(s, valid, st.scale, st.max[row], new_max, total);
    else
#endif
      softmax_row(s, valid, st.scale, st.max[row], new_max, total);
    const float correction = std::exp2(st.max[row] - new_max);  // 0 on a row's first block
    std::fill(s + valid, s + st.n, 0.f);  // keys this row must not see
    st.sum[row] = st.sum[row] * correction + total;
    st.max[row] = new_max;
    float* o = st.o + int64_t(row) * st.D;
    for (int d = 0; d < st.D; ++d) o[d] *= correction;
  }
}

// n rows of D float16 values (row r at src + r * stride) as float32 rows of D in dst.
void widen(const uint16_t* src, int64_t stride, int n, int D, float* dst) {
  for (int r = 0; r < n; ++r, src += stride, dst += D) {
    int d = 0;
#if defined(__AVX2__) && defined(__F16C__)
    for (; d + 8 <= D; d += 8)
      _mm256_storeu_ps(dst + d, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + d))));
#endif
    for (; d < D; ++d) dst[d] = brisk::half_to_float(src[d]);
  }
}

}  // namespace

extern "C" {

// attention.cpp's brisk_attention without sinks, for L >= kMinRows: 0 done, 1 declined.
int brisk_attention_tiles(const float* q, const void* k, const void* v, int kv_half, float* out, int B, int Hq,
                          int Hkv, int L, int S, int D, const int64_t* k_strides, const int64_t* v_strides,
                          float scale, int causal, int threads, int coarse) {
  if (L < kMinRows || Hkv < 1 || Hq % Hkv || S < L) return 1;
  if (const char* off = std::getenv("BRISK_ATTENTION_TILES"); off && off[0] == '0') return 1;  // A/B, tests
  // AVX-512 CPUs: both products in registers, no sgemm (attention_flash.cpp).
  if (brisk_attention_flash(q, k, v, kv_half, out, B, Hq, Hkv, L, S, D, k_strides, v_strides, scale, causal, threads,
                            coarse) == 0)
    return 0;
  const Sgemm sgemm = find_sgemm();
  if (!sgemm) return 1;
  const int G = Hq / Hkv;
  // MLX's stream thread reuses these (fresh pages would fault on every call): scores hold the
  // group's G * L rows of one block, o their outputs (Qwen-1.5B, 512 rows: 3 MB and 1.5 MB).
  thread_local std::vector<float> scores, o, max, sum, kv;
  scores.resize(size_t(G) * L * kKeyBlock);
  kv.resize(kv_half ? size_t(2) * kKeyBlock * D : 0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hkv; ++h) {
      // The group's query heads are consecutive (B, Hq, L, D) rows: one (G * L, D) matrix.
      const float* group_q = q + (int64_t(b) * Hq + h * G) * L * D;
      o.assign(size_t(G) * L * D, 0.f);
      max.assign(size_t(G) * L, -INFINITY);
      sum.assign(size_t(G) * L, 0.f);
      const int64_t k_at = b * k_strides[0] + h * k_strides[1], v_at = b * v_strides[0] + h * v_strides[1];
      for (int j0 = 0; j0 < S; j0 += kKeyBlock) {
        const int n = std::min(kKeyBlock, S - j0);
        const int lo = causal ? std::max(0, j0 - (S - L)) : 0;  // positions that see none of the block skip it
        if (lo >= L) break;
        const float *keys, *values;
        int ldk, ldv;
        if (kv_half) {
          widen(static_cast<const uint16_t*>(k) + k_at + j0 * k_strides[2], k_strides[2], n, D, kv.data());
          widen(static_cast<const uint16_t*>(v) + v_at + j0 * v_strides[2], v_strides[2], n, D,
                kv.data() + size_t(kKeyBlock) * D);
          keys = kv.data(), values = kv.data() + size_t(kKeyBlock) * D, ldk = ldv = D;
        } else {
          keys = static_cast<const float*>(k) + k_at + j0 * k_strides[2], ldk = int(k_strides[2]);
          values = static_cast<const float*>(v) + v_at + j0 * v_strides[2], ldv = int(v_strides[2]);
        }
        // Every row sees the block (lo = 0): all heads in one pair of sgemm calls; else head by head.
        const int spans = lo == 0 ? 1 : G, span_rows = lo == 0 ? G * L : L - lo;
        for (int part = 0; part < spans; ++part) {
          const int first = lo == 0 ? 0 : part * L + lo;
          sgemm(kRowMajor, kNoTrans, kTrans, span_rows, n, D, 1.f, group_q + int64_t(first) * D, D, keys, ldk, 0.f,
                scores.data(), kKeyBlock);
          Step step{scores.data(), o.data(), max.data(), sum.data(), first, span_rows, L, n, D, j0, S - L,
                    causal != 0,   scale * kLog2e};
          brisk_parallel_for((span_rows + kRowUnit - 1) / kRowUnit, threads, softmax_unit, &step);
          sgemm(kRowMajor, kNoTrans, kNoTrans, span_rows, D, n, 1.f, scores.data(), kKeyBlock, values, ldv, 1.f,
                o.data() + int64_t(first) * D, D);
        }
      }
      for (int r = 0; r < G; ++r)
        for (int i = 0; i < L; ++i) {
          const float total = sum[size_t(r) * L + i], inverse = total > 0.f ? 1.f / total : 0.f;
          const float* row = o.data() + (size_t(r) * L + i) * D;
          float* dst = out + ((int64_t(b) * Hq + h * G + r) * L + i) * D;
          for (int d = 0; d < D; ++d) dst[d] = row[d] * inverse;
        }
    }
  return 0;
}
}
