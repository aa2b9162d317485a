// Fused causal attention on the CPU: softmax(q k^T * scale) v, flash style, float32 queries
// over float32 or float16 keys and values.
//
// MLX's CPU attention materialises the score matrix and pays ~22 ns per exp: softmax was
// 63% of SmolLM2's prefill at 2K tokens, and a 2K-context decode step spent more time in
// attention than in its 4-bit weights (issues 17, 18). Here keys and values stream through
// in blocks of 32 with an online softmax: scores never leave L1, and exp is a polynomial
// on eight lanes at once.
//
// Layout: q (B, Hq, L, D) row-contiguous; k, v (B, Hkv, S, D) with any batch/head/position
// strides and contiguous rows (a KV cache's sliced views as they are). Float16 keys and
// values (the KV cache's storage: half the bytes a decode step streams) are read in place and
// widened in registers (F16C; without it, a block at a time into float32 scratch). Query i of L sits at
// position S - L + i (MLX's "causal": a chunk after cached tokens). GQA: the Hq / Hkv query
// heads of a KV head share every block of it they read, three rows to a key's load. Attention sinks (a logit per head
// with no value) start each row's softmax. Accumulation is in float32.
// Work units are (batch, KV head, tile of query positions), split over the thread pool of
// quantized_matmul.cpp; when those are too few to share (decode, short verify passes), each
// part of 256 keys is a unit of its own (see kPartKeys).
// Built into the MLX primitives module (mlx_primitives/primitives.cpp).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "half.h"
#include "isa.h"
#include "vector_exp.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define BRISK_AVX2 1
#endif

namespace {

constexpr int kKeyBlock = 32;     // keys per block: K and V blocks stay in L1 for every row
constexpr int kQueryTile = 16;    // query positions per work unit
constexpr int kMaxHeadDim = 256;
constexpr float kLog2e = 1.4426950408889634f;

struct Problem {
  const float* q;
  const void* k;  // float, or float16 bits when `half`
  const void* v;
  float* out;
  int B, Hq, Hkv, L, S, D;
  int64_t k_strides[3], v_strides[3];  // batch, head, position (elements)
  float scale;  // times log2(e): the softmax runs in base 2
  bool causal;
  const float* sinks;  // (Hq,) or null: a logit per query head with no value (gpt-oss)
  bool half;
};

// The next block's keys and values, asked for a few rows at a time while this block's rows
// fold: a decode step's cache streams from DRAM (widening a block into scratch waited on every
// load: 42% of an 8K-key call's samples); asked for all at once, the requests themselves
// stalled.
struct Ahead {
  const char* k;
  const char* v;
  int64_t k_stride, v_stride;  // bytes
  int rows, bytes;             // rows left to ask for, bytes in each

  void ask(int n) {
    for (; n > 0 && rows > 0; --n, --rows, k += k_stride, v += v_stride)
      for (int at = 0; at < bytes; at += 64) __builtin_prefetch(k + at), __builtin_prefetch(v + at);
  }
};

// n rows of D float16 values (row r at src + r * stride) as float32 rows of D in dst.
void widen_rows(const uint16_t* src, int64_t stride, int n, int D, float* dst) {
  for (int r = 0; r < n; ++r, src += stride, dst += D) {
    int d = 0;
#if BRISK_AVX2 && defined(__F16C__)
    for (; d < D; d += 8)
      _mm256_storeu_ps(dst + d, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + d))));
#endif
    for (; d < D; ++d) dst[d] = brisk::half_to_float(src[d]);
  }
}

#if BRISK_AVX2
using brisk::exp2_ps;

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// Eight key or value elements as float32: float16 (the KV cache's storage) widens exactly in
// registers, so a block is read from the cache once, in place, by the rows that use it.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
#if defined(__F16C__)
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
#endif

// R rows' dot products with four keys each: R x 4 accumulators over D (a key's load is shared
// by the rows: GQA's query heads of one KV head read the same keys), then per row a
// horizontal-add tree that leaves the sum with key j in lane j of s[r]. Each row takes the same
// operations for any R, so a row's scores do not depend on which rows share the call.
template <int R, typename T>
__attribute__((always_inline)) inline void dots4(const float* const* q, const T* const* keys, int D, __m128* s) {
  __m256 a[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) a[r][j] = _mm256_setzero_ps();
  for (int d = 0; d < D; d += 8) {
    __m256 qd[R];
    for (int r = 0; r < R; ++r) qd[r] = _mm256_loadu_ps(q[r] + d);
    for (int j = 0; j < 4; ++j) {
      const __m256 kd = load8(keys[j] + d);
      for (int r = 0; r < R; ++r) a[r][j] = _mm256_fmadd_ps(qd[r], kd, a[r][j]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a[r][0], a[r][1]), _mm256_hadd_ps(a[r][2], a[r][3]));
    s[r] = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  }
}
#endif

// One query row's running state: max and sum of the softmax so far, and its output. No
// member initializers: a unit's array of them (room for 1024 rows) was constructed whole on
// every call, a fifth of a decode step's attention; attend_unit sets the rows it uses.
struct Row {
  const float* q;
  float* acc;  // D floats
  int limit;   // keys [0, limit) are visible
  float max, sum;
};

#if BRISK_AVX2
// For R rows: o[d0 .. d0 + 8W) = o * c + sum over j of p[j] * v[j][d0 ..], the R x W output
// vectors in registers and each value vector loaded once for the rows.
template <int R, int W, typename T>
__attribute__((always_inline)) inline void fold_values(Row* const* rows, int d0, const __m256* c,
                                                       const float (*p)[kKeyBlock], const T* const* values, int n) {
  __m256 o[R][W];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < W; ++t) o[r][t] = _mm256_mul_ps(_mm256_loadu_ps(rows[r]->acc + d0 + 8 * t), c[r]);
  for (int j = 0; j < n; ++j) {
    __m256 pj[R];
    for (int r = 0; r < R; ++r) pj[r] = _mm256_set1_ps(p[r][j]);
    for (int t = 0; t < W; ++t) {
      const __m256 vt = load8(values[j] + d0 + 8 * t);
      for (int r = 0; r < R; ++r) o[r][t] = _mm256_fmadd_ps(pj[r], vt, o[r][t]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < W; ++t) _mm256_storeu_ps(rows[r]->acc + d0 + 8 * t, o[r][t]);
}

// Fold keys [j0, j0 + n) into R rows that all see them (query heads of one position).
// Registers bound R: 3 rows x 4 keys of scores, or 3 rows x 4 vectors of output, fill 12 of
// AVX2's 16; six rows need AVX-512VL's 32 (fold_block_wide).
template <int R, typename T>
__attribute__((always_inline)) inline void fold_rows(const Problem& p, Row* const* rows, const T* const* keys,
                                                     const T* const* values, int n, Ahead& ahead) {
  const int D = p.D;
  alignas(32) float s[R][kKeyBlock];
  const __m128 scale = _mm_set1_ps(p.scale);
  const __m128 minus_inf = _mm_set1_ps(-INFINITY);
  const float* q[R];
  for (int r = 0; r < R; ++r) q[r] = rows[r]->q;
  for (int j = 0; j < n; j += 4) {
    ahead.ask(4);
    __m128 d[R];
    dots4<R, T>(q, keys + j, D, d);
    const __m128i lane = _mm_setr_epi32(0, 1, 2, 3);
    const __m128 keep = _mm_castsi128_ps(_mm_cmpgt_epi32(_mm_set1_epi32(n - j), lane));  // lanes past the last key
    for (int r = 0; r < R; ++r) _mm_store_ps(s[r] + j, _mm_blendv_ps(minus_inf, _mm_mul_ps(d[r], scale), keep));
  }
  const int padded = (n + 7) & ~7;
  __m256 c[R];
  for (int r = 0; r < R; ++r) {
    Row& row = *rows[r];
    for (int j = (n + 3) & ~3; j < padded; j += 4) _mm_store_ps(s[r] + j, minus_inf);
    __m256 block_max = _mm256_set1_ps(-INFINITY);
    for (int j = 0; j < padded; j += 8) block_max = _mm256_max_ps(block_max, _mm256_load_ps(s[r] + j));
    const float new_max = std::max(row.max, hmax(block_max));
    const float correction = std::exp2(row.max - new_max);  // 0 on the first block
    const __m256 m = _mm256_set1_ps(new_max);
    __m256 total = _mm256_setzero_ps();
    for (int j = 0; j < padded; j += 8) {
      const __m256 e = exp2_ps(_mm256_sub_ps(_mm256_load_ps(s[r] + j), m));
      _mm256_store_ps(s[r] + j, e);
      total = _mm256_add_ps(total, e);
    }
    row.sum = row.sum * correction + hsum(total);
    row.max = new_max;
    c[r] = _mm256_set1_ps(correction);
  }
  int d0 = 0;  // four vectors of the output rows at a time, then one
  for (; d0 + 32 <= D; d0 += 32) fold_values<R, 4, T>(rows, d0, c, s, values, n);
  for (; d0 < D; d0 += 8) fold_values<R, 1, T>(rows, d0, c, s, values, n);
}
#else
// Fold keys [j0, j0 + n) into each of R rows.
template <int R, typename T>
void fold_rows(const Problem& p, Row* const* rows, const T* const* keys, const T* const* values, int n, Ahead& ahead) {
  const int D = p.D;
  float s[kKeyBlock];
  ahead.ask(kKeyBlock);
  for (int r = 0; r < R; ++r) {
    Row& row = *rows[r];
    float block_max = -INFINITY;
    for (int j = 0; j < n; ++j) {
      float dot = 0.f;
      for (int d = 0; d < D; ++d) dot += row.q[d] * keys[j][d];
      s[j] = dot * p.scale;
      block_max = std::max(block_max, s[j]);
    }
    const float new_max = std::max(row.max, block_max);
    const float correction = std::exp2(row.max - new_max);
    float total = 0.f;
    for (int j = 0; j < n; ++j) total += (s[j] = std::exp2(s[j] - new_max));
    row.sum = row.sum * correction + total;
    row.max = new_max;
    for (int d = 0; d < D; ++d) {
      float o = row.acc[d] * correction;
      for (int j = 0; j < n; ++j) o += s[j] * values[j][d];
      row.acc[d] = o;
    }
  }
}
#endif

// Folds keys [j0, j0 + n) into `count` rows that all see them, R_MAX at a time, then three,
// two, one.
template <int R_MAX, typename T>
__attribute__((always_inline)) inline void fold_rows_by(const Problem& p, Row* const* rows, int count,
                                                        const T* const* keys, const T* const* values, int n,
                                                        Ahead& ahead) {
  if constexpr (R_MAX == 6)
    for (; count >= 6; count -= 6, rows += 6) fold_rows<6, T>(p, rows, keys, values, n, ahead);
  for (; count >= 3; count -= 3, rows += 3) fold_rows<3, T>(p, rows, keys, values, n, ahead);
  if (count == 2) fold_rows<2, T>(p, rows, keys, values, n, ahead);
  if (count == 1) fold_rows<1, T>(p, rows, keys, values, n, ahead);
}

#if BRISK_AVX2
// Six rows a call where AVX-512VL gives 32 vector registers (6 x 4 scores or output vectors,
// six queries and a key): each key's load and widening serve twice the rows, and a verify
// pass's positions share keys too. Every row count folds in this one function here, so a
// row's bits never depend on which code (or target) folded it.
template <typename T>
__attribute__((target("avx2,fma,f16c,avx512f,avx512vl"))) void fold_block_wide(const Problem& p, Row* const* rows,
                                                                                int count, const T* const* keys,
                                                                                const T* const* values, int n,
                                                                                Ahead& ahead) {
  fold_rows_by<6, T>(p, rows, count, keys, values, n, ahead);
}

bool wide_registers() {
  static const bool has =
      brisk::isa_allows(brisk::kIsaAvx512) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  return has;
}
#endif

template <typename T>
void fold_block(const Problem& p, Row* const* rows, int count, const T* const* keys, const T* const* values, int n,
                Ahead& ahead) {
#if BRISK_AVX2
  if (wide_registers()) return fold_block_wide<T>(p, rows, count, keys, values, n, ahead);
#endif
  fold_rows_by<3, T>(p, rows, count, keys, values, n, ahead);
}

#if BRISK_AVX2 && defined(__F16C__)
constexpr bool kHalfInPlace = true;  // float16 keys and values read where they are (load8)
#else
constexpr bool kHalfInPlace = false;  // widened a block at a time into scratch first
#endif

// Keys fold into a row in parts of kPartKeys positions, each with a softmax of its own, merged
// in order into the row's total (as flash decoding does). A row's arithmetic depends only on
// its own limit, never on which rows share its unit or on how units are split: one-row decode
// and a verify pass's rows give the same bits. A decode step has one unit per KV head (3 for
// SmolLM2: on two threads one waited a third of the time); its parts can run as units of their own.
constexpr int kPartKeys = 256;

// A row's softmax state over some keys: running max and sum, and its unnormalised output.
struct State {
  float max, sum;
  float* acc;  // D floats
};

// total <- total merged with a part's max, sum and output (a part that saw no key leaves the
// total as it was).
void merge(State& total, float max, float sum, const float* acc, int D) {
  if (max == -INFINITY) return;
  const float m = std::max(total.max, max);
  const float a = std::exp2(total.max - m), b = std::exp2(max - m);  // a = 0 while total is empty
  total.sum = total.sum * a + sum * b;
  total.max = m;
  for (int d = 0; d < D; ++d) total.acc[d] = total.acc[d] * a + acc[d] * b;
}

// The softmax's output from a row's merged state.
void write_row(const State& total, float* out, int D) {
  const float inv = total.sum > 0.f ? 1.f / total.sum : 0.f;
  for (int d = 0; d < D; ++d) out[d] = total.acc[d] * inv;
}

// One work unit: KV head `h` of batch `b`, query positions [i0, i1), every query head of the
// group, over key parts [part0, part1). With `states` null the unit holds every part its rows
// see and writes their outputs; else it writes each row's merged state there as max, sum and
// D floats of output, in the unit's row order.
void attend_unit(const Problem& p, int b, int h, int i0, int i1, int part0, int part1, float* states,
                 std::vector<float>& scratch, std::vector<float>& widened) {
  const int rep = p.Hq / p.Hkv, D = p.D, tile = i1 - i0;
  const int rows_n = rep * tile;
  scratch.assign(size_t(2 * rows_n) * D, 0.f);  // each row's part output, then its total
  Row rows[kQueryTile * 64];
  State totals[kQueryTile * 64];
  int reach = 0;
  for (int r = 0; r < rep; ++r) {
    for (int i = i0; i < i1; ++i) {
      const int at = r * tile + (i - i0);
      Row& row = rows[at];
      row = Row{nullptr, nullptr, 0, -INFINITY, 0.f};
      const int64_t head = int64_t(b) * p.Hq + h * rep + r;
      row.q = p.q + (head * p.L + i) * D;
      row.acc = scratch.data() + size_t(at) * D;
      row.limit = p.causal ? p.S - p.L + i + 1 : p.S;
      totals[at] = State{-INFINITY, 0.f, scratch.data() + size_t(rows_n + at) * D};
      reach = std::max(reach, row.limit);
    }
  }
  const int64_t k_at = b * p.k_strides[0] + h * p.k_strides[1], v_at = b * p.v_strides[0] + h * p.v_strides[1];
  const float* keys[kKeyBlock];
  const float* values[kKeyBlock];
  if (p.half && !kHalfInPlace) widened.resize(size_t(2) * kKeyBlock * D);
  for (int part = part0; part < part1 && part * kPartKeys < reach; ++part) {
    for (int at = 0; at < rows_n; ++at) {
      Row& row = rows[at];
      row.max = -INFINITY, row.sum = 0.f;
      std::fill_n(row.acc, D, 0.f);
      if (p.sinks && part == 0) {  // the sink's share of the softmax starts the running sum: exp2(0) = 1
        row.max = p.sinks[h * rep + at / tile] * kLog2e;
        row.sum = 1.f;
      }
    }
    const int end = std::min(reach, (part + 1) * kPartKeys);
    for (int j0 = part * kPartKeys; j0 < end; j0 += kKeyBlock) {
      const int n_block = std::min(kKeyBlock, end - j0);
      const int elem = p.half ? 2 : 4;
      const int next = j0 + kKeyBlock;
      Ahead ahead{static_cast<const char*>(p.k) + (k_at + next * p.k_strides[2]) * elem,
                  static_cast<const char*>(p.v) + (v_at + next * p.v_strides[2]) * elem,
                  p.k_strides[2] * elem, p.v_strides[2] * elem, std::max(0, std::min(kKeyBlock, end - next)), D * elem};
      const uint16_t* keys16[kKeyBlock];
      const uint16_t* values16[kKeyBlock];
      const bool in_place = p.half && kHalfInPlace;
      if (in_place) {
        for (int j = 0; j < kKeyBlock; ++j) {  // past the block's end: its first key, read, then masked
          const int at = j0 + (j < n_block ? j : 0);
          keys16[j] = static_cast<const uint16_t*>(p.k) + k_at + at * p.k_strides[2];
          values16[j] = static_cast<const uint16_t*>(p.v) + v_at + at * p.v_strides[2];
        }
      } else if (p.half) {
        float* const block_k = widened.data();
        float* const block_v = block_k + kKeyBlock * D;
        widen_rows(static_cast<const uint16_t*>(p.k) + k_at + j0 * p.k_strides[2], p.k_strides[2], n_block, D, block_k);
        widen_rows(static_cast<const uint16_t*>(p.v) + v_at + j0 * p.v_strides[2], p.v_strides[2], n_block, D, block_v);
        for (int j = 0; j < n_block; ++j) keys[j] = block_k + j * D, values[j] = block_v + j * D;
      } else {
        for (int j = 0; j < n_block; ++j) {
          keys[j] = static_cast<const float*>(p.k) + k_at + (j0 + j) * p.k_strides[2];
          values[j] = static_cast<const float*>(p.v) + v_at + (j0 + j) * p.v_strides[2];
        }
      }
      if (!in_place)
        for (int j = n_block; j < kKeyBlock; ++j) keys[j] = keys[0], values[j] = values[0];  // read, then masked
      // Position i's rows (one per query head) see the same keys, and so do the next
      // positions' while they see as many of the block (all but the causal diagonal's): one
      // group shares each key's load.
      for (int i = 0; i < tile;) {
        const int n = std::min(n_block, rows[i].limit - j0);
        Row* group[kQueryTile * 64];
        int count = 0;
        for (; i < tile && std::min(n_block, rows[i].limit - j0) == n; ++i)
          for (int r = 0; r < rep; ++r) group[count++] = &rows[r * tile + i];
        if (n <= 0) continue;
        if constexpr (kHalfInPlace) {  // not built where load8 cannot widen float16
          if (in_place) {
            fold_block(p, group, count, keys16, values16, n, ahead);
            continue;
          }
        }
        fold_block(p, group, count, keys, values, n, ahead);
      }
    }
    for (int at = 0; at < rows_n; ++at) merge(totals[at], rows[at].max, rows[at].sum, rows[at].acc, D);
  }
  for (int at = 0; at < rows_n; ++at) {
    const State& total = totals[at];
    if (states) {
      float* state = states + size_t(at) * (D + 2);
      state[0] = total.max, state[1] = total.sum;
      std::copy_n(total.acc, D, state + 2);
      continue;
    }
    const int r = at / tile, i = i0 + at % tile;
    const int64_t head = int64_t(b) * p.Hq + h * rep + r;
    write_row(total, p.out + (head * p.L + i) * D, D);
  }
}

}  // namespace

extern "C" {

void brisk_parallel_for(int units, int threads, void (*task)(void*, int), void* context);  // quantized_matmul.cpp
int brisk_attention_tiles(const float*, const void*, const void*, int, float*, int, int, int, int, int, int,
                          const int64_t*, const int64_t*, float, int, int, int);  // attention_tiles.cpp

// Returns 0, or 1 for a shape it does not take (the caller checks these first). kv_half: k
// and v hold float16 bits, else float32. coarse: long chunks may take bfloat16 products
// (attention_flash.cpp; a sparse-prefill draft's reading).
int brisk_attention(const float* q, const void* k, const void* v, int kv_half, float* out, int B, int Hq, int Hkv,
                    int L, int S, int D, const int64_t* k_strides, const int64_t* v_strides, float scale, int causal,
                    const float* sinks, int threads, int coarse) {
  if (B < 1 || Hkv < 1 || Hq % Hkv || Hq / Hkv > 64 || L < 1 || S < L || D < 8 || D % 8 || D > kMaxHeadDim)
    return 1;
  // Long chunks without sinks: whole heads against blocks of keys in sgemm (attention_tiles.cpp).
  if (!sinks && brisk_attention_tiles(q, k, v, kv_half, out, B, Hq, Hkv, L, S, D, k_strides, v_strides, scale, causal,
                                      threads, coarse) == 0)
    return 0;
  Problem p{q, k, v, out, B, Hq, Hkv, L, S, D, {}, {}, scale * kLog2e, causal != 0, sinks, kv_half != 0};
  std::memcpy(p.k_strides, k_strides, sizeof(p.k_strides));
  std::memcpy(p.v_strides, v_strides, sizeof(p.v_strides));
  const int tiles = (L + kQueryTile - 1) / kQueryTile, parts = (S + kPartKeys - 1) / kPartKeys;
  const int rep = Hq / Hkv;
  // Few units (decode, short verify passes): each key part is a unit of its own, the rows'
  // states merged here after.
  const bool split = B * Hkv * tiles < 2 * threads && parts > 1 && tiles == 1;
  const int units = B * Hkv * tiles * (split ? parts : 1);
  thread_local std::vector<float> states;  // per unit: L * rep rows of max, sum and D outputs
  const size_t unit_floats = size_t(L) * rep * (D + 2);
  if (split) states.resize(units * unit_floats);
  float* const unit_states = states.data();  // the caller's: in the lambda `states` names each thread's own
  // Later query tiles see more keys (causal): hand them out first so the threads finish together.
  auto run = [&](int u, std::vector<float>& scratch, std::vector<float>& widened) {
    if (split) {
      const int part = u % parts, h = (u / parts) % Hkv, b = u / (parts * Hkv);
      attend_unit(p, b, h, 0, L, part, part + 1, unit_states + u * unit_floats, scratch, widened);
      return;
    }
    const int t = tiles - 1 - u % tiles, h = (u / tiles) % Hkv, b = u / (tiles * Hkv);
    attend_unit(p, b, h, t * kQueryTile, std::min(L, (t + 1) * kQueryTile), 0, parts, nullptr, scratch, widened);
  };
  auto trampoline = [](void* context, int u) {
    thread_local std::vector<float> scratch, widened;  // the pool's threads live on: so do these
    (*static_cast<decltype(run)*>(context))(u, scratch, widened);
  };
  brisk_parallel_for(units, threads, trampoline, &run);
  if (split) {  // each row's parts merged in order, as one unit holding them all merges them
    float acc[kMaxHeadDim];
    for (int bh = 0; bh < B * Hkv; ++bh)
      for (int at = 0; at < L * rep; ++at) {
        State total{-INFINITY, 0.f, acc};
        std::fill_n(acc, D, 0.f);
        for (int part = 0; part < parts; ++part) {
          const float* state = unit_states + (size_t(bh) * parts + part) * unit_floats + size_t(at) * (D + 2);
          merge(total, state[0], state[1], state + 2, D);
        }
        const int b = bh / Hkv, h = bh % Hkv, r = at / L, i = at % L;
        write_row(total, out + ((int64_t(b) * Hq + h * rep + r) * L + i) * D, D);
      }
  }
  return 0;
}

int brisk_attention_version() { return 4; }
}
