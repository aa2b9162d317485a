// Causal attention for long prefill chunks on AVX-512 CPUs: flash attention with both
// products in registers, no sgemm.
//
// attention_tiles.cpp hands q k^T and p v to MKL's sgemm a block of keys at a time: with
// K = 64 (the head dim) MKL runs at ~100 GFLOP/s here (its AMD code path), its threads
// meet three times per block and head, and SmolLM2's prefill attention ran at ~82 GFLOP/s
// of ~220 (two cores of 512-bit FMA). Here each work unit is six query rows of one head;
// it walks the head's keys 64 at a time: s = q k^T in register_tile.h's 24 registers (keys
// packed transposed, 64 to a panel), the online softmax on s (base 2, the shared vectorized
// exp), then o += p v six rows at a time from L1. Units run on the pool without meeting.
// Same arithmetic as the other paths up to summation order: float32 throughout, float16
// keys and values widened into packed float32 once per call, one KV head at a time.
// `coarse` (kernels/coarse.py: a sparse-prefill draft's reading, which only ranks tokens): on
// CPUs with AVX512-BF16 both products take bfloat16 pairs with float32 sums instead.
// What it does not take (no AVX-512, a head dim not a multiple of 16, BRISK_ATTENTION_FLASH=0)
// it declines, and attention_tiles.cpp runs. Built into the MLX primitives module.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "register_tile.h"
#include "vector_exp.h"
#include "isa.h"

extern "C" void brisk_parallel_for(int units, int threads, void (*task)(void*, int), void* context);

#if defined(__AVX2__) && defined(__FMA__)
#define BRISK_FLASH __attribute__((target("avx2,fma,f16c,avx512f,avx512dq")))
// `coarse` (a sparse-prefill draft's reading, which only ranks tokens): both products in
// bfloat16 pairs with float32 sums (vdpbf16ps, twice the float32 FMA rate), on CPUs with it.
#define BRISK_FLASH_BF16 __attribute__((target("avx2,fma,f16c,avx512f,avx512dq,avx512bw,avx512bf16")))

namespace {

constexpr int kPanel = brisk::kTileColumns;  // keys per panel: a six-row score tile is 24 zmm registers
constexpr __mmask16 kAll[4] = {0xffff, 0xffff, 0xffff, 0xffff};  // every column of a score tile
constexpr int kRows = 6;  // query rows per unit
constexpr float kLog2e = 1.4426950408889634f;

struct Flash {  // one (batch, KV head) and its query heads
  const float* q;  // the KV head's first query head's (L, D) rows; the others follow
  float* out;      // likewise
  const float *kp, *vp;  // packed: panels of [D][64] keys, rows of D values
  int L, S, D, tiles;
  int base;  // causal: query i sees keys [0, base + i + 1)
  bool causal;
  float scale;  // scale * log2(e)
};

struct Pack {  // one (batch, KV head)
  const char *k, *v;  // its first key and value
  int64_t k_row, v_row;  // bytes from one position to the next
  bool half;
  float *kp, *vp;
  int S, D;
};

BRISK_FLASH inline void load_row(const void* src, bool half, int D, float* dst) {
  if (!half) {
    std::copy_n(static_cast<const float*>(src), D, dst);
    return;
  }
  const uint16_t* h = static_cast<const uint16_t*>(src);
  for (int d = 0; d < D; d += 16)
    _mm512_storeu_ps(dst + d, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + d))));
}

// Panel `unit` of one (batch, KV head): 64 keys transposed, their values as float32 rows;
// past S, zeros.
BRISK_FLASH void pack_panel(void* context, int unit) {
  const Pack& p = *static_cast<const Pack*>(context);
  const int D = p.D;
  float* panel = p.kp + int64_t(unit) * D * kPanel;
  alignas(64) float row[256];
  for (int j = unit * kPanel; j < (unit + 1) * kPanel; ++j) {
    float* values = p.vp + int64_t(j) * D;
    if (j < p.S) {
      load_row(p.k + j * p.k_row, p.half, D, row);
      for (int d = 0; d < D; ++d) panel[d * kPanel + j % kPanel] = row[d];
      load_row(p.v + j * p.v_row, p.half, D, values);
    } else {
      for (int d = 0; d < D; ++d) panel[d * kPanel + j % kPanel] = 0.f;
      std::fill_n(values, D, 0.f);
    }
  }
}

// o (R x 16 NV, row stride D) += p (R x 64) . v (64 rows of D, from column 0 of the chunk).
template <int R, int NV>
BRISK_FLASH __attribute__((always_inline)) inline void add_values(const float* p, const float* v, int D, float* o,
                                                                  int keys) {
  __m512 acc[R][NV];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_loadu_ps(o + r * D + 16 * c);
  for (int j = 0; j < keys; ++j, v += D) {
    __m512 w[NV];
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) w[c] = _mm512_loadu_ps(v + 16 * c);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(p[r * kPanel + j]);
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_fmadd_ps(x, w[c], acc[r][c]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) _mm512_storeu_ps(o + r * D + 16 * c, acc[r][c]);
}

template <int R>
BRISK_FLASH void add_all_values(const float* p, const float* v, int D, float* o, int keys) {
  int d = 0;
  for (; d + 64 <= D; d += 64) add_values<R, 4>(p, v + d, D, o + d, keys);
  switch ((D - d) / 16) {
    case 1: add_values<R, 1>(p, v + d, D, o + d, keys); break;
    case 2: add_values<R, 2>(p, v + d, D, o + d, keys); break;
    case 3: add_values<R, 3>(p, v + d, D, o + d, keys); break;
    default: break;
  }
}

// --- bfloat16 pairs (coarse) ---------------------------------------------------------------
// A word holds two bfloat16 values, the first in its low half (vdpbf16ps multiplies halves
// pairwise and adds both products). Keys: per panel [D / 2][64] words, the pair of dims
// (2e, 2e + 1) of one key; values: [positions / 2][D] words, dim d of two consecutive keys.

BRISK_FLASH_BF16 inline void to_bf16(const float* x, int n, uint16_t* out) {  // n a multiple of 16
  for (int i = 0; i < n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
}

// Panel `unit` (64 keys) of one (batch, KV head) as bfloat16 words; past S, zeros.
BRISK_FLASH_BF16 void pack_panel_bf16(void* context, int unit) {
  const Pack& p = *static_cast<const Pack*>(context);
  const int D = p.D;
  uint32_t* keys = reinterpret_cast<uint32_t*>(p.kp) + int64_t(unit) * (D / 2) * kPanel;
  uint32_t* values = reinterpret_cast<uint32_t*>(p.vp) + int64_t(unit) * (kPanel / 2) * D;
  alignas(64) float row[256];
  alignas(64) uint16_t pair[2][256];
  for (int j = unit * kPanel; j < (unit + 1) * kPanel; j += 2) {
    for (int t = 0; t < 2; ++t) {  // keys j, j + 1: the key's dims paired, then the values across the two
      if (j + t < p.S) load_row(p.k + (j + t) * p.k_row, p.half, D, row);
      else std::fill_n(row, D, 0.f);
      to_bf16(row, D, pair[t]);
      const uint32_t* words = reinterpret_cast<const uint32_t*>(pair[t]);
      for (int e = 0; e < D / 2; ++e) keys[e * kPanel + (j + t) % kPanel] = words[e];
    }
    for (int t = 0; t < 2; ++t) {
      if (j + t < p.S) load_row(p.v + (j + t) * p.v_row, p.half, D, row);
      else std::fill_n(row, D, 0.f);
      to_bf16(row, D, pair[t]);
    }
    uint32_t* out = values + int64_t((j % kPanel) / 2) * D;
    for (int d = 0; d < D; ++d) out[d] = uint32_t(pair[0][d]) | uint32_t(pair[1][d]) << 16;
  }
}

// s (R rows of 64) = q (R rows of D / 2 words) . panel, scaled.
template <int R>
BRISK_FLASH_BF16 __attribute__((always_inline)) inline void scores_bf16(const uint32_t* q, int D, const uint32_t* panel,
                                                                         float scale, float* s) {
  __m512 acc[R][4];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int e = 0; e < D / 2; ++e, panel += kPanel) {
    __m512bh k[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) k[c] = (__m512bh)_mm512_loadu_si512(panel + 16 * c);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(int(q[r * (D / 2) + e]));
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], x, k[c]);
    }
  }
  const __m512 k = _mm512_set1_ps(scale);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(s + r * kPanel + 16 * c, _mm512_mul_ps(acc[r][c], k));
}

// o (R x 16 NV, row stride D) += p (R rows of 64 bfloat16) . v (pairs of keys, rows of D words).
template <int R, int NV>
BRISK_FLASH_BF16 __attribute__((always_inline)) inline void add_values_bf16(const uint16_t* p, const uint32_t* v, int D,
                                                                             float* o, int pairs) {
  __m512 acc[R][NV];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_loadu_ps(o + r * D + 16 * c);
  for (int e = 0; e < pairs; ++e, v += D) {
    __m512bh w[NV];
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) w[c] = (__m512bh)_mm512_loadu_si512(v + 16 * c);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(int(reinterpret_cast<const uint32_t*>(p + r * kPanel)[e]));
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], x, w[c]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) _mm512_storeu_ps(o + r * D + 16 * c, acc[r][c]);
}

template <int R>
BRISK_FLASH_BF16 void add_all_values_bf16(const uint16_t* p, const uint32_t* v, int D, float* o, int pairs) {
  int d = 0;
  for (; d + 64 <= D; d += 64) add_values_bf16<R, 4>(p, v + d, D, o + d, pairs);
  switch ((D - d) / 16) {
    case 1: add_values_bf16<R, 1>(p, v + d, D, o + d, pairs); break;
    case 2: add_values_bf16<R, 2>(p, v + d, D, o + d, pairs); break;
    case 3: add_values_bf16<R, 3>(p, v + d, D, o + d, pairs); break;
    default: break;
  }
}

// The panel's products: float32 through register_tile.h, or bfloat16 pairs.
template <int R, bool BF16>
struct Products;

template <int R>
struct Products<R, false> {
  const float* q;
  BRISK_FLASH Products(const float* rows, int) : q(rows) {}
  BRISK_FLASH void scores(const Flash& f, int j0, float* p) const {
    brisk::register_tile<R>(q, f.D, f.kp + int64_t(j0 / kPanel) * f.D * kPanel, f.D, p, kPanel, kAll, nullptr, false,
                            f.scale);
  }
  BRISK_FLASH void values(const Flash& f, int j0, const float* p, float* o, int keys) const {
    add_all_values<R>(p, f.vp + int64_t(j0) * f.D, f.D, o, keys);
  }
};

template <int R>
struct Products<R, true> {
  alignas(64) uint16_t q[kRows * 256];
  BRISK_FLASH_BF16 Products(const float* rows, int D) { to_bf16(rows, R * D, q); }
  BRISK_FLASH_BF16 void scores(const Flash& f, int j0, float* p) const {
    const uint32_t* panel = reinterpret_cast<const uint32_t*>(f.kp) + int64_t(j0 / kPanel) * (f.D / 2) * kPanel;
    scores_bf16<R>(reinterpret_cast<const uint32_t*>(q), f.D, panel, f.scale, p);
  }
  BRISK_FLASH_BF16 void values(const Flash& f, int j0, const float* p, float* o, int keys) const {
    alignas(64) uint16_t pb[kRows * kPanel];
    to_bf16(p, R * kPanel, pb);
    const uint32_t* v = reinterpret_cast<const uint32_t*>(f.vp) + int64_t(j0 / 2) * f.D;
    add_all_values_bf16<R>(pb, v, f.D, o, (keys + 1) / 2);
  }
};

// Rows i0 .. i0 + R - 1 of the KV head's query head g.
template <int R, bool BF16>
BRISK_FLASH_BF16 void rows_of_head(const Flash& f, int g, int i0) {
  const int D = f.D;
  const Products<R, BF16> products(f.q + (int64_t(g) * f.L + i0) * D, D);
  alignas(64) float o[kRows * 256];
  alignas(64) float p[kRows * kPanel];  // the panel's scores, then their exponentials
  float run_max[R], run_sum[R];
  int last[R];  // keys row r sees: [0, last[r])
  for (int r = 0; r < R; ++r) {
    run_max[r] = -INFINITY, run_sum[r] = 0.f;
    last[r] = f.causal ? f.base + i0 + r + 1 : f.S;
  }
  std::fill_n(o, R * D, 0.f);
  const int keys_end = last[R - 1];
  for (int j0 = 0; j0 < keys_end; j0 += kPanel) {
    products.scores(f, j0, p);
    for (int r = 0; r < R; ++r) {
      float* row = p + r * kPanel;
      // A row sees key 0 and so panel 0, but the tile's earlier rows may see none of its last.
      const int valid = std::min(kPanel, last[r] - j0);
      if (valid <= 0) {
        std::fill_n(row, kPanel, 0.f);
        continue;
      }
      __m512 s[4];
      for (int c = 0; c < 4; ++c) {
        const int lanes = std::clamp(valid - 16 * c, 0, 16);
        s[c] = _mm512_mask_blend_ps(__mmask16((1u << lanes) - 1), _mm512_set1_ps(-INFINITY), _mm512_load_ps(row + 16 * c));
      }
      const __m512 m4 = _mm512_max_ps(_mm512_max_ps(s[0], s[1]), _mm512_max_ps(s[2], s[3]));
      const float new_max = std::max(run_max[r], _mm512_reduce_max_ps(m4));
      const __m512 m = _mm512_set1_ps(new_max);
      __m512 total = _mm512_setzero_ps();
      for (int c = 0; c < 4; ++c) {
        const __m512 e = brisk::exp2_ps512(_mm512_sub_ps(s[c], m));
        _mm512_store_ps(row + 16 * c, e);
        total = _mm512_add_ps(total, e);
      }
      if (new_max != run_max[r]) {  // rescale what the row holds (nothing on its first panel)
        const float correction = std::exp2(run_max[r] - new_max);
        const __m512 k = _mm512_set1_ps(correction);
        for (int d = 0; d < D; d += 16) _mm512_storeu_ps(o + r * D + d, _mm512_mul_ps(_mm512_loadu_ps(o + r * D + d), k));
        run_sum[r] *= correction;
        run_max[r] = new_max;
      }
      run_sum[r] += _mm512_reduce_add_ps(total);
    }
    products.values(f, j0, p, o, std::min(kPanel, keys_end - j0));
  }
  float* y = f.out + (int64_t(g) * f.L + i0) * D;
  for (int r = 0; r < R; ++r) {
    const __m512 inverse = _mm512_set1_ps(run_sum[r] > 0.f ? 1.f / run_sum[r] : 0.f);
    for (int d = 0; d < D; d += 16) _mm512_storeu_ps(y + r * D + d, _mm512_mul_ps(_mm512_loadu_ps(o + r * D + d), inverse));
  }
}

// Units run query head by query head, the later (longer) row tiles of a head first so the
// last units to run are short ones.
template <bool BF16>
BRISK_FLASH_BF16 void flash_unit(void* context, int unit) {
  const Flash& f = *static_cast<const Flash*>(context);
  const int g = unit / f.tiles, i0 = (f.tiles - 1 - unit % f.tiles) * kRows;
  switch (std::min(kRows, f.L - i0)) {
    case 1: return rows_of_head<1, BF16>(f, g, i0);
    case 2: return rows_of_head<2, BF16>(f, g, i0);
    case 3: return rows_of_head<3, BF16>(f, g, i0);
    case 4: return rows_of_head<4, BF16>(f, g, i0);
    case 5: return rows_of_head<5, BF16>(f, g, i0);
    default: return rows_of_head<6, BF16>(f, g, i0);
  }
}

}  // namespace

extern "C" {

// attention_tiles.cpp's brisk_attention_tiles, register-tiled (the caller checked the shapes
// and L against its minimum): 0 done, 1 declined.
int brisk_attention_flash(const float* q, const void* k, const void* v, int kv_half, float* out, int B, int Hq, int Hkv,
                          int L, int S, int D, const int64_t* k_strides, const int64_t* v_strides, float scale,
                          int causal, int threads, int coarse) {
  static const bool avx512 =
      brisk::isa_allows(brisk::kIsaAvx512) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  static const bool bf16 = avx512 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16");
  const bool pairs = coarse && bf16;
  if (!avx512 || D % 16 || D > 256 || S < L) return 1;
  if (const char* off = std::getenv("BRISK_ATTENTION_FLASH"); off && off[0] == '0') return 1;  // A/B, tests
  const int panels = (S + kPanel - 1) / kPanel, G = Hq / Hkv, tiles = (L + kRows - 1) / kRows;
  const size_t head_floats = size_t(panels) * kPanel * D, elem = kv_half ? 2 : 4;
  // One KV head packed at a time (float32, twice a float16 cache's bytes for that head).
  // MLX's stream thread keeps the buffers between calls (fresh pages would fault every
  // chunk), unless a long context made them large.
  thread_local std::vector<float> keys, values;
  keys.resize(head_floats);
  values.resize(head_floats);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hkv; ++h) {
      const char* kh = static_cast<const char*>(k) + (b * k_strides[0] + h * k_strides[1]) * elem;
      const char* vh = static_cast<const char*>(v) + (b * v_strides[0] + h * v_strides[1]) * elem;
      Pack pack{kh, vh, int64_t(k_strides[2] * elem), int64_t(v_strides[2] * elem), kv_half != 0, keys.data(),
                values.data(), S, D};
      brisk_parallel_for(panels, threads, pairs ? pack_panel_bf16 : pack_panel, &pack);
      const int64_t first = (int64_t(b) * Hq + h * G) * L * D;
      Flash f{q + first, out + first, keys.data(), values.data(), L, S, D, tiles, S - L, causal != 0, scale * kLog2e};
      brisk_parallel_for(G * tiles, threads, pairs ? flash_unit<true> : flash_unit<false>, &f);
    }
  if (head_floats > (size_t(16) << 20)) {  // over 64 MB each: give them back
    std::vector<float>().swap(keys);
    std::vector<float>().swap(values);
  }
  return 0;
}
}

#else
extern "C" int brisk_attention_flash(const float*, const void*, const void*, int, float*, int, int, int, int, int, int,
                                     const int64_t*, const int64_t*, float, int, int, int) {
  return 1;
}
#endif
