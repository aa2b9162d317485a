// y = x @ dequantize(w).T (+ bias) for MLX's affine-quantized weights (bits 4, 5, 6 or 8,
// groups of 32 or 64, scales and biases in float32, float16 or bfloat16).
//
// MLX stores row n of a quantized (N, K) weight as K * bits / 8 bytes, element k at bits
// [bits * k, bits * (k + 1)) of the row read as one little-endian bit string (for 4 and 8
// bits: nibbles and bytes in order; for 5 bits 8 elements in every 5 bytes), and one scale
// s and bias b per group: w = s * q + b (5 bits holds GGUF's Q5_0/Q5_1 exactly). On the
// CPU, MLX's own quantized matmul reads those bytes at about 1 GB/s, 4x slower than a
// float32 gemv; decode is bound by the bytes of weights read per token, so that gave up
// everything quantization buys.
//
// Few rows (decode, the speculative verify pass; 1-32 rows): each weight block is read once
// and multiplied by every row of x. By default (AVX2) x is rounded to 15-bit integers per
// block of 32 values with a float scale, and weights and x meet in integer multiply-adds
// (vpmaddubsw; vpdpbusd with VNNI-512) 64 weights at a time, for 4, 5, 6 and 8 bits: that
// made decode layers about 2x faster than widening every weight to float, which bound the
// old path. Each group's bias term b * sum(x) uses
// the float x. The float-x path stays for exact comparisons (integer_x = 0) and for CPUs
// without AVX2.
// Many rows (prefill): tiles of the weight are dequantized to float32 and multiplied by
// the process's cblas_sgemm (MKL when engine/runtime/blas.py loaded it), so prefill runs at sgemm
// speed plus one pass of dequantization; on CPUs with AMX, 4-, 5- and 8-bit weights go to
// amx_matmul.cpp's integer tiles instead (about 1.7x sgemm here).
// Threads come from the library's one persistent pool (thread_pool.h): a decode step makes ~200
// of these calls, too many to start threads for each. Built by kernels/ctypes_library.py and called through ctypes, and
// built into the lazy MLX primitives of mlx_primitives/primitives.cpp (kernels/mlx_extension.py).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "half.h"
#include "isa.h"
#include "sgemm.h"
#include "thread_pool.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define BRISK_AVX2 1
#endif

namespace {

using brisk::parallel_units;

constexpr int kBlock = 32;       // weights widened at a time; every group is 1 or 2 blocks
constexpr int kMaxRows = 32;  // above this, dequantized tiles + sgemm win (see kernels/quantized_matmul.py)
constexpr int kColumnUnit = 16;  // a thread's stretch of output columns is a multiple of this
// Few-row paths prefetch the weights this far ahead of their loads (into the next columns'
// rows): a 1.5B model's weights stream from DRAM, and the hardware prefetcher alone left the
// loads waiting (Qwen-1.5B decode 1.3x with it, A/B).
constexpr int kPrefetchBytes = 1024;

enum ScaleType { kF32 = 0, kF16 = 1, kBF16 = 2 };

using brisk::half_to_float;

inline float read_scale(const void* p, int type, int64_t i) {
  switch (type) {
    case kF16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case kBF16: {
      const uint32_t bits = uint32_t(static_cast<const uint16_t*>(p)[i]) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    default: return static_cast<const float*>(p)[i];
  }
}

// ---------------------------------------------------------------------------------------
// Few rows: packed weights widened in registers against float x.

struct Weights {
  const uint32_t* w;
  const void* scales;
  const void* biases;
  int scale_type;
  int K, N, bits, group;
  int64_t row_bytes() const { return int64_t(K) * bits / 8; }
  const uint8_t* row(int n) const { return reinterpret_cast<const uint8_t*>(w) + n * row_bytes(); }
  int groups() const { return K / group; }
};

bool supported(int bits, int group) {
  return (bits == 4 || bits == 5 || bits == 6 || bits == 8) && (group == 32 || group == 64);
}

// The 32 values of a 5-bit block (20 bytes), in order.
inline void unpack5(const uint8_t* block, uint8_t q[kBlock]) {
  for (int c = 0; c < 4; ++c) {
    uint64_t chunk = 0;
    std::memcpy(&chunk, block + 5 * c, 5);
    for (int j = 0; j < 8; ++j) q[8 * c + j] = uint8_t((chunk >> (5 * j)) & 31);
  }
}

// The 32 values of a 6-bit block (24 bytes), in order: 4 in every 3 bytes (the float-x path and
// odd block counts; the integer paths unpack whole spans in registers).
inline void unpack6(const uint8_t* block, uint8_t q[kBlock]) {
  for (int c = 0; c < 8; ++c) {
    const uint8_t* b = block + 3 * c;
    const uint32_t chunk = b[0] | (uint32_t(b[1]) << 8) | (uint32_t(b[2]) << 16);
    for (int j = 0; j < 4; ++j) q[4 * c + j] = uint8_t((chunk >> (6 * j)) & 63);
  }
}

// Group scales of rows [n, n + 1) as float32, `count` of them starting at `first`.
void scales_to_float(const void* p, int type, int64_t first, int count, float* out) {
  int i = 0;
#if defined(BRISK_AVX2) && defined(__F16C__)
  if (type == kF16)
    for (; i + 8 <= count; i += 8)
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                    reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + first + i))));
#endif
  for (; i < count; ++i) out[i] = read_scale(p, type, first + i);
}

// Rows of x with each weight group's float sum (the bias term). For 4-bit weights a block's
// 32 values are stored evens first, then odds: the order of its low and high nibbles.
struct Rows {
  int M = 0, K = 0, blocks = 0, groups = 0;
  std::vector<float> x;    // M x K, reordered per block
  std::vector<float> sum;  // M x groups
  const float* row(int m) const { return x.data() + int64_t(m) * K; }
};

void prepare_rows(const float* x, int M, int K, int bits, int group, Rows& out) {
  out.M = M, out.K = K, out.blocks = K / kBlock, out.groups = K / group;
  out.x.resize(int64_t(M) * K);
  out.sum.assign(int64_t(M) * out.groups, 0.f);
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < out.blocks; ++b) {
      const float* v = x + int64_t(m) * K + b * kBlock;
      float* dst = out.x.data() + int64_t(m) * K + b * kBlock;
      float total = 0.f;
      for (int i = 0; i < kBlock; ++i) {
        dst[bits == 4 ? (i % 2) * 16 + i / 2 : i] = v[i];
        total += v[i];
      }
      out.sum[int64_t(m) * out.groups + b * kBlock / group] += total;
    }
}

#ifdef BRISK_AVX2
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Block b's 32 weights widened to float (4-bit ones as evens | odds, matching Rows).
template <int BITS>
inline void widen_block(const uint8_t* row, int b, __m256 q[4]) {
  if (BITS == 4) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * 16));
    const __m128i low = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(raw, low), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
    q[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    q[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
    q[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    q[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
  } else {
    uint8_t unpacked[kBlock];
    const uint8_t* bytes = row + b * 32;
    if (BITS == 5) unpack5(row + b * 20, unpacked), bytes = unpacked;
    if (BITS == 6) unpack6(row + b * 24, unpacked), bytes = unpacked;
    for (int i = 0; i < 4; ++i)
      q[i] = _mm256_cvtepi32_ps(
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + 8 * i))));
  }
}

// sum over k of s[k / group] * q[k] * x[k] for R rows of x against one weight row: each
// block is widened once and used for every row while it sits in registers.
template <int BITS, int R>
void column_dots(const uint8_t* row, const float* scale, int per_group_shift, const float* const* xf, int blocks,
                 float* dots) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int b = 0; b < blocks; ++b) {
    __m256 q[4];
    _mm_prefetch(reinterpret_cast<const char*>(row + b * BITS * 4 + kPrefetchBytes), _MM_HINT_T0);
    widen_block<BITS>(row, b, q);
    const __m256 s = _mm256_set1_ps(scale[b >> per_group_shift]);
    for (int r = 0; r < R; ++r) {
      const float* x = xf[r] + b * kBlock;
      __m256 t = _mm256_mul_ps(q[0], _mm256_loadu_ps(x));
      t = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(x + 8), t);
      t = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(x + 16), t);
      t = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(x + 24), t);
      acc[r] = _mm256_fmadd_ps(t, s, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) dots[r] = hsum(acc[r]);
}
#else
template <int BITS, int R>
void column_dots(const uint8_t* row, const float* scale, int per_group_shift, const float* const* xf, int blocks,
                 float* dots) {
  for (int r = 0; r < R; ++r) dots[r] = 0.f;
  for (int b = 0; b < blocks; ++b) {
    float q[kBlock];
    uint8_t five[kBlock];
    if (BITS == 5) unpack5(row + b * 20, five);
    if (BITS == 6) unpack6(row + b * 24, five);
    for (int i = 0; i < kBlock; ++i) {
      const int slot = BITS == 4 ? (i % 2) * 16 + i / 2 : i;
      q[slot] = float(BITS == 4   ? (row[b * 16 + i / 2] >> (4 * (i % 2))) & 15
                      : BITS == 8 ? row[b * 32 + i]
                                  : five[i]);
    }
    const float s = scale[b >> per_group_shift];
    for (int r = 0; r < R; ++r) {
      float total = 0.f;
      for (int i = 0; i < kBlock; ++i) total += q[i] * xf[r][b * kBlock + i];
      dots[r] += total * s;
    }
  }
}
#endif

// Decode reads each column's group scales and biases (a quarter of a 4-bit g32 layer's bytes)
// from arrays of their own, which the weights' prefetch does not cover: column n fetches
// those of the column about 12 KB of weights ahead. SmolLM2's decode waited on them
// (scales_to_float 8.6% of its step in perf, nearly all on the first use of the loaded
// value): +3-8% decode tok/s in interleaved A/B within one build (4 columns ahead gained
// nothing, 16-64 about the same; Qwen-1.5B at 16 columns unchanged).
constexpr int64_t kScalesAheadBytes = 12 << 10;
inline void prefetch_scales(const Weights& w, int n) {
  const int ahead = int(std::clamp<int64_t>(kScalesAheadBytes / w.row_bytes(), 4, 64));
  if (n + ahead >= w.N) return;
  const int size = w.scale_type == kF32 ? 4 : 2;
  const int64_t at = int64_t(n + ahead) * w.groups() * size, bytes = int64_t(w.groups()) * size;
  for (int64_t line = 0; line < bytes; line += 64) {
    __builtin_prefetch(static_cast<const char*>(w.scales) + at + line);
    __builtin_prefetch(static_cast<const char*>(w.biases) + at + line);
  }
}

constexpr int kRowTile = 4;
constexpr int kMaxGroups = 1 << 12;  // K up to 131072 in groups of 32

// Output column n of M rows: each row's dot plus, per group, the group's bias times the float
// sum of x over it (sums: M x groups), plus the layer's bias.
void finish_column(const Weights& w, const float* dots, const float* offset, const float* sums, int M,
                   const float* bias, float* out, int n) {
  const int groups = w.groups();
  for (int m = 0; m < M; ++m) {
    const float* row_sums = sums + int64_t(m) * groups;
    float total = dots[m];
    for (int g = 0; g < groups; ++g) total += offset[g] * row_sums[g];
    out[int64_t(m) * w.N + n] = total + (bias ? bias[n] : 0.f);
  }
}

template <int BITS>
void few_rows_column(const Weights& w, const Rows& x, const float* bias, float* out, int n) {
  const int groups = w.groups(), shift = w.group == 64 ? 1 : 0;
  float scale[kMaxGroups], offset[kMaxGroups], dots[kMaxRows];
  scales_to_float(w.scales, w.scale_type, int64_t(n) * groups, groups, scale);
  scales_to_float(w.biases, w.scale_type, int64_t(n) * groups, groups, offset);
  const uint8_t* row = w.row(n);
  for (int m0 = 0; m0 < x.M; m0 += kRowTile) {
    const int tile = std::min(kRowTile, x.M - m0);
    const float* xf[kRowTile];
    for (int r = 0; r < tile; ++r) xf[r] = x.row(m0 + r);
    switch (tile) {
      case 1: column_dots<BITS, 1>(row, scale, shift, xf, x.blocks, dots + m0); break;
      case 2: column_dots<BITS, 2>(row, scale, shift, xf, x.blocks, dots + m0); break;
      case 3: column_dots<BITS, 3>(row, scale, shift, xf, x.blocks, dots + m0); break;
      default: column_dots<BITS, 4>(row, scale, shift, xf, x.blocks, dots + m0); break;
    }
  }
  finish_column(w, dots, offset, x.sum.data(), x.M, bias, out, n);
}

// Whole columns per thread: each thread streams one contiguous stretch of the weight, which
// the hardware prefetcher follows (units of 16 columns handed out in turn read 20-30% slower).
template <class Stretch>
void parallel_column_stretches(int N, int threads, const Stretch& stretch) {
  const int share = (N + std::max(1, threads) - 1) / std::max(1, threads);
  const int per = std::max(kColumnUnit, (share + kColumnUnit - 1) / kColumnUnit * kColumnUnit);
  const int units = (N + per - 1) / per;
  parallel_units(units, threads, [&](int u) { stretch(u * per, std::min(N, (u + 1) * per)); });
}

template <class Column>
void parallel_columns(int N, int threads, const Column& column) {
  parallel_column_stretches(N, threads, [&](int begin, int end) {
    for (int n = begin; n < end; ++n) column(n);
  });
}

#ifdef BRISK_AVX2
// ---------------------------------------------------------------------------------------
// Few rows with integer x: each block of 32 values of x is rounded to q = x / d, |q| <= 127 *
// 128 (15 bits), stored as two int8 bytes hi = q >> 7 and lo = q & 127, so the weights meet
// both in vpmaddubsw. Plain int8 x (llama.cpp's Q8 activations) was tried first: twice as
// cheap, but a block holding one of SmolLM2's outlier channels rounds its other values to
// 0 or 1, and decode agreed with float x on only 95.7% of 256 greedy tokens.
// Every width takes it: 4, 5 and 6 bits as unsigned bytes, 8 bits as q - 128 (see
// signed_pair_sums). On an AVX2-only CPU 6-bit weights (the Q6_K layers of a Q4_K_M import)
// had only the float path, which unpacked every block in scalar code.
// Weights are read 64 (a "span", two blocks) at a time as two registers of 32 bytes whose
// low 128 bits hold block 0's values and high 128 bits block 1's, so the sums of the span's
// two blocks land in the low and high halves of one register. x is stored per span in the
// same order as the two registers:
// - 4 bits: a span's 32 bytes split into low nibbles (its even elements) and high nibbles
//   (its odd ones): x as the span's 32 evens, then its 32 odds;
// - 5, 6 and 8 bits: each block's values 0-15 and 16-31 (5 and 6 bits unpacked from its 20 or
//   24 bytes): x as block 0's 0-15, block 1's 0-15, block 0's 16-31, block 1's 16-31.

constexpr int kSpan = 64;
constexpr float kLevels = 127.f * 128.f;  // |q| at most: hi stays within [-127, 127]

// Where element e (0-63) of a span sits among its 64 stored values of x.
inline int span_slot(int bits, int e) {
  const int block = e / kBlock, i = e % kBlock;
  return bits == 4 ? (e % 2) * 32 + e / 2 : (i / 16) * 32 + block * 16 + i % 16;
}

struct IntegerRows {
  int M = 0, K = 0, spans = 0, groups = 0;
  std::vector<int8_t> hi, lo;  // M x K each, per span in the weights' register order
  std::vector<float> d;        // M x spans x 8: each block's scale d, four times per half
  std::vector<float> sum;      // M x groups: float sum of x (the bias term)
  std::vector<float> rounded_sum;  // M x groups: sum of the rounded x, q * d (8 bits on AVX2)
  int64_t at(int m, int span) const { return int64_t(m) * K + span * kSpan; }
  const float* d_row(int m) const { return d.data() + int64_t(m) * spans * 8; }
};

// With `paired` (the 512-bit path), each whole pair of spans q = (2q, 2q + 1) stores its x as
// span 2q's first half, span 2q + 1's first half, then both second halves: one 64-byte load
// then meets the two spans' weights held in one register. A last unpaired span keeps the
// plain order.
inline int paired_slot(int spans, int span, int slot) {
  if (span / 2 * 2 + 1 >= spans) return span * kSpan + slot;
  return span / 2 * 2 * kSpan + slot / 32 * 64 + span % 2 * 32 + slot % 32;
}

void prepare_integer_rows(const float* x, int M, int K, int bits, int group, IntegerRows& out, bool paired = false) {
  out.M = M, out.K = K, out.spans = K / kSpan, out.groups = K / group;
  out.hi.resize(int64_t(M) * K);
  out.lo.resize(int64_t(M) * K);
  out.d.resize(int64_t(M) * out.spans * 8);
  out.sum.assign(int64_t(M) * out.groups, 0.f);
  out.rounded_sum.assign(int64_t(M) * out.groups, 0.f);
  for (int m = 0; m < M; ++m)
    for (int block = 0; block < K / kBlock; ++block) {
      const int k0 = block * kBlock, half = block % 2;
      int rounded = 0;
      const float* v = x + int64_t(m) * K + k0;
      float amax = 0.f, total = 0.f;
      for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(v[i])), total += v[i];
      const float d = amax / kLevels, inverse = d > 0.f ? 1.f / d : 0.f;
      const int64_t row = int64_t(m) * K;
      for (int i = 0; i < kBlock; ++i) {
        const int q = int(std::nearbyint(v[i] * inverse));
        rounded += q;
        const int in_span = span_slot(bits, half * kBlock + i);
        const int64_t slot = row + (paired ? paired_slot(out.spans, block / 2, in_span) : block / 2 * kSpan + in_span);
        out.hi[slot] = int8_t(q >> 7);  // arithmetic shift: floor(q / 128)
        out.lo[slot] = int8_t(q & 127);
      }
      std::fill_n(out.d.data() + (int64_t(m) * out.spans + block / 2) * 8 + half * 4, 4, d);
      out.sum[int64_t(m) * out.groups + k0 / group] += total;
      out.rounded_sum[int64_t(m) * out.groups + k0 / group] += float(rounded) * d;
    }
}

inline __m256i load32(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// hi * 128 + lo from the int16 pair sums of each byte plane.
inline __m256i combine(__m256i hi_pairs, __m256i lo_pairs) {
  const __m256i ones = _mm256_set1_epi16(1);
  return _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(hi_pairs, ones), 7), _mm256_madd_epi16(lo_pairs, ones));
}

// 5- and 6-bit unpacking: the 8 elements of a chunk (5 or 6 bytes), one per 16-bit lane (the
// two bytes that hold it, or one), shifted right into place by a multiply-high: element j
// starts at bit s = BITS * j % 8, and (word * 2^(16 - s)) >> 16 = word >> s. For s = 0 the
// byte goes in the lane's high half and the multiplier is 2^8, which fits where 2^16 would
// not. A block's chunks 0 and 1 come from a 16-byte load at its start, 2 and 3 from one at
// kBackLoad (4 for 5 bits, 8 for 6), so no load leaves the block's 20 or 24 bytes.
template <int BITS>
struct UnpackChunks {
  static constexpr int kBackLoad = BITS == 5 ? 4 : 8;
  __m256i pick[4], shift;
  UnpackChunks() {
    alignas(32) int8_t bytes[4][32];
    alignas(32) uint16_t mul[16];
    int at[4];
    for (int c = 0; c < 4; ++c) at[c] = BITS * c - (c < 2 ? 0 : kBackLoad);
    constexpr int8_t kZero = int8_t(0x80);  // pshufb writes 0 for an index with its top bit set
    for (int c = 0; c < 4; ++c)
      for (int lane = 0; lane < 2; ++lane)
        for (int j = 0; j < 8; ++j) {
          const int byte = at[c] + BITS * j / 8, bit = BITS * j % 8;
          int8_t* pair = &bytes[c][lane * 16 + 2 * j];
          pair[0] = bit == 0 ? kZero : int8_t(byte);
          pair[1] = bit == 0 ? int8_t(byte) : bit + BITS > 8 ? int8_t(byte + 1) : kZero;
        }
    for (int lane = 0; lane < 2; ++lane)
      for (int j = 0; j < 8; ++j) mul[lane * 8 + j] = uint16_t(BITS * j % 8 == 0 ? 1 << 8 : 1 << (16 - BITS * j % 8));
    for (int c = 0; c < 4; ++c) pick[c] = _mm256_load_si256(reinterpret_cast<const __m256i*>(bytes[c]));
    shift = _mm256_load_si256(reinterpret_cast<const __m256i*>(mul));
  }
};
// Built once as the library loads: no guard on the per-column path.
const UnpackChunks<5> kUnpack5;
const UnpackChunks<6> kUnpack6;

inline __m256i two_lanes(const uint8_t* low, const uint8_t* high) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(low))),
                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(high)), 1);
}

// A span's 64 weights as two registers (see above), values 0..2^bits - 1.
template <int BITS>
inline void span_weights(const uint8_t* row, int p, __m256i& first, __m256i& second) {
  if constexpr (BITS == 4) {
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + p * 32));
    first = _mm256_and_si256(raw, nibble), second = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nibble);
  } else if constexpr (BITS == 8) {  // block 0's bytes 0-15 | block 1's 0-15, then each block's 16-31
    const uint8_t* span = row + p * 64;
    first = two_lanes(span, span + 32), second = two_lanes(span + 16, span + 48);
  } else {  // 5 or 6 bits: every load stays inside its own block's 20 or 24 bytes
    const __m256i* unpack = BITS == 5 ? kUnpack5.pick : kUnpack6.pick;
    const __m256i shift = BITS == 5 ? kUnpack5.shift : kUnpack6.shift;
    constexpr int kBlockBytes = 4 * BITS, kBack = UnpackChunks<BITS == 6 ? 6 : 5>::kBackLoad;
    const uint8_t* span = row + p * 2 * kBlockBytes;
    const __m256i front = two_lanes(span, span + kBlockBytes);
    const __m256i back = two_lanes(span + kBack, span + kBlockBytes + kBack);
    const __m256i mask = _mm256_set1_epi16((1 << BITS) - 1);  // before packing: packus saturates above 255
    auto chunk = [&](__m256i bytes, int c) {
      return _mm256_and_si256(_mm256_mulhi_epu16(_mm256_shuffle_epi8(bytes, unpack[c]), shift), mask);
    };
    first = _mm256_packus_epi16(chunk(front, 0), chunk(front, 1));
    second = _mm256_packus_epi16(chunk(back, 2), chunk(back, 3));
  }
}

// 8-bit weights q meet x as q - 128 in [-128, 127]: vpmaddubsw takes |q - 128| as its unsigned
// operand and x with the sign of q - 128 as its signed one (vpsignb), so a pair sums at most 2 *
// 128 * 127, inside int16, where q * x (up to 2 * 255 * 127) would saturate. The caller adds
// back 128 * s times each group's sum of the rounded x (IntegerRows::rounded_sum): with it the
// sums are those of q itself. llama.cpp's AVX2 Q8_0 dot takes signed weights the same way.
inline __m256i signed_pair_sums(__m256i magnitude, __m256i sign, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(x, sign)), _mm256_set1_epi16(1));
}

// sum over k of s[k / group] * w[k] * q[k] * d[k / 32] for R rows against one row of 4, 5 or 6
// bits (8 bits: of w - 128, see above). For 6 bits a pair sums at most 2 * 63 * 127 and two
// pairs 32,004: the int16 add before vpmaddwd still holds.
template <int BITS, int GROUP, int R>
void integer_dots(const uint8_t* row, const float* scale, const IntegerRows& x, int m0, float* dots) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int p = 0; p < x.spans; ++p) {
    const __m256 s = GROUP == 64 ? _mm256_broadcast_ss(scale + p)
                                 : _mm256_set_m128(_mm_broadcast_ss(scale + 2 * p + 1), _mm_broadcast_ss(scale + 2 * p));
    __m256i first, second;
    _mm_prefetch(reinterpret_cast<const char*>(row + p * BITS * 8 + kPrefetchBytes), _MM_HINT_T0);
    span_weights<BITS>(row, p, first, second);
    __m256i first_size = first, second_size = second;
    if constexpr (BITS == 8) {
      const __m256i flip = _mm256_set1_epi8(char(0x80));
      first = _mm256_xor_si256(first, flip), second = _mm256_xor_si256(second, flip);  // q - 128 as int8
      first_size = _mm256_sign_epi8(first, first), second_size = _mm256_sign_epi8(second, second);  // -128 reads 128
    }
    for (int r = 0; r < R; ++r) {
      const int64_t at = x.at(m0 + r, p);
      __m256i total;
      if constexpr (BITS == 8) {
        const __m256i hi = _mm256_add_epi32(signed_pair_sums(first_size, first, load32(&x.hi[at])),
                                            signed_pair_sums(second_size, second, load32(&x.hi[at + 32])));
        const __m256i lo = _mm256_add_epi32(signed_pair_sums(first_size, first, load32(&x.lo[at])),
                                            signed_pair_sums(second_size, second, load32(&x.lo[at + 32])));
        total = _mm256_add_epi32(_mm256_slli_epi32(hi, 7), lo);
      } else {
        const __m256i hi = _mm256_add_epi16(_mm256_maddubs_epi16(first, load32(&x.hi[at])),
                                            _mm256_maddubs_epi16(second, load32(&x.hi[at + 32])));
        const __m256i lo = _mm256_add_epi16(_mm256_maddubs_epi16(first, load32(&x.lo[at])),
                                            _mm256_maddubs_epi16(second, load32(&x.lo[at + 32])));
        total = combine(hi, lo);
      }
      const __m256 sums = _mm256_cvtepi32_ps(total);
      acc[r] = _mm256_fmadd_ps(sums, _mm256_mul_ps(s, _mm256_loadu_ps(x.d_row(m0 + r) + p * 8)), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) dots[r] = hsum(acc[r]);
}

// VNNI-512 (AVX512 F, BW, VL and VNNI, found at run time: the library is built for AVX2).
// vpdpbusd sums four u8 x s8 products straight into each int32 lane, where the path above
// needs vpmaddubsw, an int16 add and vpmaddwd; and a 512-bit register holds two spans, so a
// decode layer issues about half the instructions per weight (the AVX2 path is bound by
// them, not by memory). Lanes 0-7 hold span 2q's sums exactly as the AVX2 path has them, lanes
// 8-15 span 2q + 1's; the float accumulation differs in order only. With no int16 step
// 8-bit weights need no sign trick (255 * 127 * 2 overflows vpmaddubsw's int16).
#define BRISK_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

bool cpu_has_vnni() {
  static const bool has = brisk::isa_allows(brisk::kIsaVnni) && __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vnni");
  return has;
}

// Spans 2q and 2q + 1 as two registers: each span's `first` in 256-bit halves, then `second`.
template <int BITS>
BRISK_VNNI inline void span_pair_weights(const uint8_t* row, int q, __m512i& first, __m512i& second) {
  if (BITS == 4) {  // 64 bytes: both spans' low nibbles, then their high nibbles
    const __m512i nibble = _mm512_set1_epi8(0x0f);
    const __m512i raw = _mm512_loadu_si512(row + q * 64);
    first = _mm512_and_si512(raw, nibble), second = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
  } else if (BITS == 8) {  // 16-byte quarters: first = 0, 2, 4, 6 (block starts), second = 1, 3, 5, 7
    const __m512i a = _mm512_loadu_si512(row + q * 128), b = _mm512_loadu_si512(row + q * 128 + 64);
    first = _mm512_permutex2var_epi64(a, _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), b);
    second = _mm512_permutex2var_epi64(a, _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15), b);
  } else {
    __m256i f0, s0, f1, s1;
    span_weights<BITS>(row, 2 * q, f0, s0);
    span_weights<BITS>(row, 2 * q + 1, f1, s1);
    first = _mm512_inserti64x4(_mm512_castsi256_si512(f0), f1, 1);
    second = _mm512_inserti64x4(_mm512_castsi256_si512(s0), s1, 1);
  }
}

// One column's scales for span pair q, straight from MLX's array (f16 and bf16 widen exactly,
// so these are scales_to_float's values): groups of 32 give four, of 64 two.
template <int GROUP>
BRISK_VNNI inline __m128 pair_scales(const void* p, int type, int64_t first) {
  constexpr int kCount = GROUP == 64 ? 2 : 4;
  if (type == kF32) {
    const float* f = static_cast<const float*>(p) + first;
    if constexpr (kCount == 4) return _mm_loadu_ps(f);
    else return _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(f)));
  }
  uint64_t raw = 0;
  std::memcpy(&raw, static_cast<const uint16_t*>(p) + first, kCount * 2);
  const __m128i halves = _mm_cvtsi64_si128(int64_t(raw));
  if (type == kF16) return _mm_cvtph_ps(halves);
  return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(halves), 16));
}

// acc plus each group's bias b times the float sum of x over the group, 16 groups a step
// (lanes mix freely: the caller sums them all).
BRISK_VNNI inline __m512 add_bias_terms(__m512 acc, const Weights& w, int64_t first, const float* sums) {
  const int groups = w.groups();
  for (int g = 0; g < groups; g += 16) {
    const __mmask16 keep = groups - g >= 16 ? __mmask16(0xffff) : __mmask16((1u << (groups - g)) - 1);
    __m512 b;
    if (w.scale_type == kF32) {
      b = _mm512_maskz_loadu_ps(keep, static_cast<const float*>(w.biases) + first + g);
    } else {
      const __m256i h = _mm256_maskz_loadu_epi16(keep, static_cast<const uint16_t*>(w.biases) + first + g);
      b = w.scale_type == kF16 ? _mm512_cvtph_ps(h) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    acc = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(keep, sums + g), acc);
  }
  return acc;
}

// Output columns n0 .. n0 + C - 1 of rows m0 .. m0 + R - 1 (C * R <= 4). Every (row, column)
// runs the same operations in the same order whatever C and R are, so decode's one row (four
// columns at a time: their loads and dependency chains overlap, and x is loaded once for
// them) and a verify pass's tiles of four rows agree bit for bit. Scales are widened in
// registers and the bias terms summed in 16 lanes: the per-column float arrays and the
// scalar loop over groups they replace cost SmolLM2's short (K = 576) columns a third of
// their time.
template <int BITS, int GROUP, int C, int R>
BRISK_VNNI void integer_block_vnni(const Weights& w, int n0, const IntegerRows& x, int m0, const float* bias,
                                   float* out) {
  // Each 128-bit lane of the scales is one block: groups of 32 take four scales, of 64 two.
  const __m512i lanes = GROUP == 64 ? _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
                                    : _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  constexpr int kPerPair = GROUP == 64 ? 2 : 4;
  const int pairs = x.spans / 2, groups = w.groups();
  __m512 acc[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) acc[c][r] = _mm512_setzero_ps();
  for (int q = 0; q < pairs; ++q) {
    __m512i hi0[R], hi1[R], lo0[R], lo1[R];
    __m512 d[R];
    for (int r = 0; r < R; ++r) {
      const int8_t *hi = &x.hi[x.at(m0 + r, 2 * q)], *lo = &x.lo[x.at(m0 + r, 2 * q)];
      hi0[r] = _mm512_loadu_si512(hi), hi1[r] = _mm512_loadu_si512(hi + 64);
      lo0[r] = _mm512_loadu_si512(lo), lo1[r] = _mm512_loadu_si512(lo + 64);
      d[r] = _mm512_loadu_ps(x.d_row(m0 + r) + q * 16);
    }
    for (int c = 0; c < C; ++c) {
      const uint8_t* row = w.row(n0 + c);
      // The same place in the next block's rows: the block reads C rows side by side, and 1 KB
      // ahead of each (the one-column distance) left Qwen-1.5B's decode 12% slower.
      _mm_prefetch(reinterpret_cast<const char*>(row + q * BITS * 16 + C * w.row_bytes()), _MM_HINT_T0);
      const int64_t first = int64_t(n0 + c) * groups + q * kPerPair;
      const __m512 s =
          _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(pair_scales<GROUP>(w.scales, w.scale_type, first)));
      __m512i first_half, second_half;
      span_pair_weights<BITS>(row, q, first_half, second_half);
      for (int r = 0; r < R; ++r) {
        // hi's sums times 128, then lo's added into them: (h << 7) + l without a separate add
        __m512i t = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), first_half, hi0[r]), second_half,
                                        hi1[r]);
        t = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_slli_epi32(t, 7), first_half, lo0[r]), second_half, lo1[r]);
        const __m512 sums = _mm512_cvtepi32_ps(t);
        acc[c][r] = _mm512_fmadd_ps(sums, _mm512_mul_ps(s, d[r]), acc[c][r]);
      }
    }
  }
  if (x.spans % 2) {  // the last span alone, in 256 bits
    const int p = x.spans - 1;
    for (int c = 0; c < C; ++c) {
      const int64_t first = int64_t(n0 + c) * groups;
      const __m256 s = GROUP == 64 ? _mm256_set1_ps(read_scale(w.scales, w.scale_type, first + p))
                                   : _mm256_set_m128(_mm_set1_ps(read_scale(w.scales, w.scale_type, first + 2 * p + 1)),
                                                     _mm_set1_ps(read_scale(w.scales, w.scale_type, first + 2 * p)));
      __m256i first_half, second_half;
      span_weights<BITS>(w.row(n0 + c), p, first_half, second_half);
      for (int r = 0; r < R; ++r) {
        const int64_t at = x.at(m0 + r, p);
        __m256i t = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), first_half, load32(&x.hi[at])),
                                        second_half, load32(&x.hi[at + 32]));
        t = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_slli_epi32(t, 7), first_half, load32(&x.lo[at])), second_half,
                                load32(&x.lo[at + 32]));  // (h << 7) + l, as in the pairs above
        const __m256 sums = _mm256_cvtepi32_ps(t);
        const __m256 sd = _mm256_mul_ps(s, _mm256_loadu_ps(x.d_row(m0 + r) + p * 8));
        acc[c][r] = _mm512_fmadd_ps(_mm512_zextps256_ps512(sums), _mm512_zextps256_ps512(sd), acc[c][r]);
      }
    }
  }
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) {
      const __m512 total = add_bias_terms(acc[c][r], w, int64_t(n0 + c) * groups, x.sum.data() + int64_t(m0 + r) * groups);
      out[int64_t(m0 + r) * w.N + n0 + c] = _mm512_reduce_add_ps(total) + (bias ? bias[n0 + c] : 0.f);
    }
}

// Columns [begin, end) of every row: one row four columns at a time, more rows in tiles of up to four.
template <int BITS, int GROUP>
BRISK_VNNI void integer_columns_vnni(const Weights& w, const IntegerRows& x, const float* bias, float* out, int begin,
                                     int end) {
  int n = begin;
  if (x.M == 1)
    for (; n + 4 <= end; n += 4) {
      for (int c = 0; c < 4; ++c) prefetch_scales(w, n + c);
      integer_block_vnni<BITS, GROUP, 4, 1>(w, n, x, 0, bias, out);
    }
  for (; n < end; ++n) {
    prefetch_scales(w, n);
    int m = 0;
    for (; m + 4 <= x.M; m += 4) integer_block_vnni<BITS, GROUP, 1, 4>(w, n, x, m, bias, out);
    switch (x.M - m) {  // the rows left, as one tile: each row's weights widened once for them all
      case 1: integer_block_vnni<BITS, GROUP, 1, 1>(w, n, x, m, bias, out); break;
      case 2: integer_block_vnni<BITS, GROUP, 1, 2>(w, n, x, m, bias, out); break;
      case 3: integer_block_vnni<BITS, GROUP, 1, 3>(w, n, x, m, bias, out); break;
      default: break;
    }
  }
}

template <int BITS, int GROUP>
void integer_column(const Weights& w, const IntegerRows& x, const float* bias, float* out, int n) {
  const int groups = w.groups();
  float scale[kMaxGroups], offset[kMaxGroups], dots[kMaxRows];
  prefetch_scales(w, n);
  scales_to_float(w.scales, w.scale_type, int64_t(n) * groups, groups, scale);
  scales_to_float(w.biases, w.scale_type, int64_t(n) * groups, groups, offset);
  int m = 0;  // the same sums in the same order for a row alone or in a tile of 4
  for (; m + 4 <= x.M; m += 4) integer_dots<BITS, GROUP, 4>(w.row(n), scale, x, m, dots + m);
  for (; m < x.M; ++m) integer_dots<BITS, GROUP, 1>(w.row(n), scale, x, m, dots + m);
  if constexpr (BITS == 8)  // the dots summed q - 128: add 128 * s times each group's rounded x
    for (m = 0; m < x.M; ++m) {
      const float* rounded = x.rounded_sum.data() + int64_t(m) * groups;
      float back = 0.f;
      for (int g = 0; g < groups; ++g) back += scale[g] * rounded[g];
      dots[m] += 128.f * back;
    }
  finish_column(w, dots, offset, x.sum.data(), x.M, bias, out, n);
}

template <int BITS, bool VNNI>
void integer_matmul(const Weights& w, const float* x, const float* bias, float* out, int M, int threads) {
  // Kept between calls (a decode step makes ~200 of them); the pool's threads read the
  // caller's through this reference (in a lambda the name of a thread_local is their own).
  thread_local IntegerRows kept;
  IntegerRows& rows = kept;
  prepare_integer_rows(x, M, w.K, BITS, w.group, rows, VNNI);
  if constexpr (VNNI) {
    parallel_column_stretches(w.N, threads, [&](int begin, int end) {
      w.group == 64 ? integer_columns_vnni<BITS, 64>(w, rows, bias, out, begin, end)
                    : integer_columns_vnni<BITS, 32>(w, rows, bias, out, begin, end);
    });
  } else {
    parallel_columns(w.N, threads, [&](int n) {
      w.group == 64 ? integer_column<BITS, 64>(w, rows, bias, out, n) : integer_column<BITS, 32>(w, rows, bias, out, n);
    });
  }
}
#endif

// ---------------------------------------------------------------------------------------
// Many rows: dequantize a tile of weight rows, then sgemm.

#ifdef BRISK_AVX2
// A 5- or 6-bit row's spans unpacked as the integer path reads them, then scaled (no scalar
// loop per element: a prefill chunk dequantizes every weight of the model once).
template <int BITS>
void dequantize_row_spans(const Weights& w, int n, float* out) {
  const int groups = w.groups();
  float scale[kMaxGroups], offset[kMaxGroups];
  scales_to_float(w.scales, w.scale_type, int64_t(n) * groups, groups, scale);
  scales_to_float(w.biases, w.scale_type, int64_t(n) * groups, groups, offset);
  alignas(32) uint8_t q[kSpan];
  for (int p = 0; p < w.K / kSpan; ++p) {
    __m256i first, second;
    span_weights<BITS>(w.row(n), p, first, second);
    _mm256_store_si256(reinterpret_cast<__m256i*>(q), first);
    _mm256_store_si256(reinterpret_cast<__m256i*>(q + 32), second);
    for (int e = 0; e < kSpan; e += 8) {  // 8 elements at a time, in order (consecutive slots)
      const int g = (p * kSpan + e) / w.group;
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + span_slot(BITS, e)));
      const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
      _mm256_storeu_ps(out + p * kSpan + e, _mm256_fmadd_ps(v, _mm256_set1_ps(scale[g]), _mm256_set1_ps(offset[g])));
    }
  }
}
#endif

#ifdef BRISK_AVX2
// s * q + b for one group of a 4- or 8-bit row, eight values at a time in element order (4-bit
// rows hold element 2i in byte i's low nibble and 2i + 1 in its high one). The scalar loop
// was ~7% of a Qwen-1.5B prefill.
void dequantize_group(const uint8_t* row, int bits, int k0, int group, float s, float b, float* out) {
  const __m256 scale = _mm256_set1_ps(s), offset = _mm256_set1_ps(b);
  auto store8 = [&](__m128i bytes, int k) {  // the low 8 bytes of `bytes`, elements k..k+7
    const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    _mm256_storeu_ps(out + k, _mm256_fmadd_ps(v, scale, offset));
  };
  for (int k = k0; k < k0 + group; k += kBlock) {
    if (bits == 4) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2));
      const __m128i nibble = _mm_set1_epi8(0x0f);
      const __m128i lo = _mm_and_si128(raw, nibble), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), nibble);
      const __m128i first = _mm_unpacklo_epi8(lo, hi), second = _mm_unpackhi_epi8(lo, hi);
      store8(first, k), store8(_mm_srli_si128(first, 8), k + 8);
      store8(second, k + 16), store8(_mm_srli_si128(second, 8), k + 24);
    } else {
      for (int i = 0; i < kBlock; i += 8) store8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k + i)), k + i);
    }
  }
}
#endif

void dequantize_rows(const Weights& w, int n0, int n1, float* dst) {
  const int groups = w.K / w.group;
  for (int n = n0; n < n1; ++n) {
#ifdef BRISK_AVX2
    if ((w.bits == 5 || w.bits == 6) && w.K % kSpan == 0) {
      (w.bits == 5 ? dequantize_row_spans<5> : dequantize_row_spans<6>)(w, n, dst + int64_t(n - n0) * w.K);
      continue;
    }
#endif
    const uint8_t* row = w.row(n);
    float* out = dst + int64_t(n - n0) * w.K;
    for (int g = 0; g < groups; ++g) {
      const float s = read_scale(w.scales, w.scale_type, int64_t(n) * groups + g);
      const float b = read_scale(w.biases, w.scale_type, int64_t(n) * groups + g);
      const int k0 = g * w.group;
#ifdef BRISK_AVX2
      if (w.bits == 4 || w.bits == 8) {  // vectorized: a prefill chunk dequantizes the whole model
        dequantize_group(row, w.bits, k0, w.group, s, b, out);
        continue;
      }
#endif
      if (w.bits == 4) {
        for (int k = k0; k < k0 + w.group; k += 2) {
          const uint8_t byte = row[k / 2];
          out[k] = s * float(byte & 15) + b;
          out[k + 1] = s * float(byte >> 4) + b;
        }
      } else if (w.bits == 5 || w.bits == 6) {
        uint8_t q[kBlock];
        for (int k = k0; k < k0 + w.group; k += kBlock) {
          if (w.bits == 5) unpack5(row + k / kBlock * 20, q);
          else unpack6(row + k / kBlock * 24, q);
          for (int i = 0; i < kBlock; ++i) out[k + i] = s * float(q[i]) + b;
        }
      } else {
        for (int k = k0; k < k0 + w.group; ++k) out[k] = s * float(row[k]) + b;
      }
    }
  }
}

using brisk::find_sgemm, brisk::kNoTrans, brisk::kRowMajor, brisk::kTrans, brisk::Sgemm;

constexpr int64_t kTileBytes = 8 << 20;  // dequantized weight per sgemm call: stays in L3-ish

}  // namespace

extern "C" {

int brisk_amx_quantized_matmul(const float*, const uint32_t*, const void*, const void*, int, const float*, float*, int,
                               int, int, int, int, int);  // amx_matmul.cpp

// Returns 0 on success, or a positive code the caller falls back on:
// 1 unsupported bits/group/shape, 2 too many rows for this entry, 3 no cblas_sgemm.
// integer_x: round x to 15-bit integers per block of 32 (the fast path) where this build,
// K allows it (AVX2; any of the four widths; K a multiple of 64): 1 with the fastest integer
// products this CPU has (VNNI-512, else AVX2), 2
// without VNNI (the comparison path), 3 as 1 here (it keeps prefill off AMX: see the dense
// entry); 0 keeps x in float32.
int brisk_quantized_matmul_rows(const float* x, const uint32_t* w, const void* scales, const void* biases,
                                int scale_type, const float* bias, float* out, int M, int K, int N, int bits,
                                int group, int threads, int integer_x) {
  if (!supported(bits, group) || K % group || N < 1) return 1;
  if (M < 1 || M > kMaxRows) return 2;
  if (K / group > kMaxGroups) return 1;
  const Weights weights{w, scales, biases, scale_type, K, N, bits, group};
#ifdef BRISK_AVX2
  const bool vnni = (integer_x == 1 || integer_x == 3) && cpu_has_vnni();
  if (integer_x && K % kSpan == 0 && vnni) {
    if (bits == 4) return integer_matmul<4, true>(weights, x, bias, out, M, threads), 0;
    if (bits == 5) return integer_matmul<5, true>(weights, x, bias, out, M, threads), 0;
    if (bits == 6) return integer_matmul<6, true>(weights, x, bias, out, M, threads), 0;
    return integer_matmul<8, true>(weights, x, bias, out, M, threads), 0;
  }
  if (integer_x && K % kSpan == 0) {
    if (bits == 4) return integer_matmul<4, false>(weights, x, bias, out, M, threads), 0;
    if (bits == 5) return integer_matmul<5, false>(weights, x, bias, out, M, threads), 0;
    if (bits == 6) return integer_matmul<6, false>(weights, x, bias, out, M, threads), 0;
    return integer_matmul<8, false>(weights, x, bias, out, M, threads), 0;
  }
#endif
  (void)integer_x;
  Rows rows;
  prepare_rows(x, M, K, bits, group, rows);
  parallel_columns(N, threads, [&](int n) {
    if (bits == 4) few_rows_column<4>(weights, rows, bias, out, n);
    else if (bits == 5) few_rows_column<5>(weights, rows, bias, out, n);
    else if (bits == 6) few_rows_column<6>(weights, rows, bias, out, n);
    else few_rows_column<8>(weights, rows, bias, out, n);
  });
  return 0;
}

// 1 when this build rounds few-row x to integers on request (AVX2).
int brisk_quantized_matmul_has_integer_x() {
#ifdef BRISK_AVX2
  return 1;
#else
  return 0;
#endif
}

// 1 when integer x runs on VNNI here (AVX512-VNNI and -VL), else on AVX2.
int brisk_quantized_matmul_has_vnni() {
#ifdef BRISK_AVX2
  return cpu_has_vnni() ? 1 : 0;
#else
  return 0;
#endif
}

// integer_x 1: on a CPU with AMX, 4-, 5- and 8-bit weights take amx_matmul.cpp's tiles (x rounded
// to integers as in the few-row path); otherwise, and for 0, 2 and 3, dequantized tiles + sgemm.
int brisk_quantized_matmul_dense(const float* x, const uint32_t* w, const void* scales, const void* biases,
                                 int scale_type, const float* bias, float* out, int M, int K, int N, int bits,
                                 int group, int threads, int integer_x) {
  if (!supported(bits, group) || K % group || N < 1 || M < 1) return 1;
  if (integer_x == 1 && brisk_amx_quantized_matmul(x, w, scales, biases, scale_type, bias, out, M, K, N, bits, group,
                                                   threads) == 0)
    return 0;
  const Sgemm sgemm = find_sgemm();
  if (!sgemm) return 3;
  const Weights weights{w, scales, biases, scale_type, K, N, bits, group};
  const int tile = int(std::max<int64_t>(64, std::min<int64_t>(N, kTileBytes / (4 * int64_t(K)))));
  thread_local std::vector<float> buffer;  // reused: fresh pages would fault on every call
  buffer.resize(int64_t(tile) * K);
  float* const tile_buffer = buffer.data();  // the pool's threads must not name the thread_local
  for (int n0 = 0; n0 < N; n0 += tile) {
    const int n1 = std::min(N, n0 + tile);
    // Dequantize on the pool's threads; the sgemm below brings its own.
    const int units = (n1 - n0 + 63) / 64;
    parallel_units(units, threads, [&](int u) {
      const int a = n0 + u * 64, b = std::min(n1, a + 64);
      dequantize_rows(weights, a, b, tile_buffer + int64_t(a - n0) * K);
    });
    sgemm(kRowMajor, kNoTrans, kTrans, M, n1 - n0, K, 1.f, x, K, tile_buffer, K, 0.f, out + n0, N);
  }
  if (bias)
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) out[int64_t(m) * N + n] += bias[n];
  return 0;
}

// Rows `ids` of a quantized (V, K) embedding, dequantized: the embedding lookup.
int brisk_quantized_gather(const int32_t* ids, int count, const uint32_t* w, const void* scales,
                           const void* biases, int scale_type, float* out, int V, int K, int bits, int group) {
  if (!supported(bits, group) || K % group) return 1;
  const Weights weights{w, scales, biases, scale_type, K, V, bits, group};
  for (int i = 0; i < count; ++i) {
    if (ids[i] < 0 || ids[i] >= V) return 4;
    dequantize_rows(weights, ids[i], ids[i] + 1, out + int64_t(i) * K);
  }
  return 0;
}

// The library's pool (thread_pool.h) for sources that declare only this C function:
// task(context, u) for u in [0, units) over up to `threads` threads.
void brisk_parallel_for(int units, int threads, void (*task)(void*, int), void* context) {
  parallel_units(units, threads, [&](int u) { task(context, u); });
}

// 1 when the process has a cblas_sgemm for the many-row path (MLX's lazy primitive asks
// before it builds a node, since a node cannot decline once queued).
int brisk_quantized_matmul_has_sgemm() { return find_sgemm() != nullptr; }

int brisk_quantized_matmul_version() { return 7; }
}
