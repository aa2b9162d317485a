// Decode attention straight from a packed (int4/int8, affine, grouped) KV cache, on the CPU.
//
// MLX's CPU quantized_matmul and dequantize kernels are scalar, so on the CPU backend the
// packed cache was slower to attend than the fp32 cache it replaces. This kernel reads each
// packed K/V row once for all query rows sharing its KV head (GQA and multi-token verify
// rows folded together), dequantizes it in registers, and keeps an online softmax (running
// max and sum). Keys are split into blocks across threads; the partial results are merged
// with the log-sum-exp rule. It runs as a lazy MLX primitive (mlx_primitives/, through
// brisk_kv_attention_flat) or, built by kernels/ctypes_library.py, through ctypes with raw pointers
// and element strides; this file needs no MLX headers.
//
// K and V are each dense, packed per token (groups of channels), or, for keys, packed per
// channel (KIVI: groups of 32 tokens, so an outlier channel gets its own scale) followed by
// dense recent rows. Dequantization is w = scale * q + bias per group, as mx.quantize packs
// it: a uint32 holds 32/bits values, lowest bits first.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "half.h"
#include "thread_pool.h"

// BRISK_PORTABLE_HALF forces the plain conversion (what CPUs without F16C run; tested).
#if defined(__F16C__) && !defined(BRISK_PORTABLE_HALF)
#define BRISK_F16C 1
#include <immintrin.h>
#endif

namespace {

// Eight floats / uint32s as GCC/Clang vector extensions: explicit SIMD that compiles to AVX
// on x86 and to NEON pairs on arm64, without per-ISA intrinsics.
typedef float v8f __attribute__((vector_size(32), aligned(32)));
typedef uint32_t v8u __attribute__((vector_size(32), aligned(32)));
typedef int32_t v8i __attribute__((vector_size(32), aligned(32)));

inline float hsum(v8f v) {
  float total = 0.f;
  for (int i = 0; i < 8; ++i) total += v[i];
  return total;
}

constexpr int kMaxRows = 64;
constexpr int kTile = 32;  // keys scored before their values are accumulated
constexpr int kTokenGroup = 32;  // tokens per group of a CHANNEL_PACKED source (one tile)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline float half_to_float(uint16_t h) {
#if defined(BRISK_F16C)
  return _cvtsh_ss(h);
#else
  return brisk::half_to_float(h);
#endif
}

// Where one of K or V comes from. Positions [0, packed) of a CHANNEL_PACKED source are
// packed per channel in groups of kTokenGroup tokens, stored channel-major as mx.quantize
// packs a (D, tokens) matrix; positions from `dense_from` (<= packed) on are dense rows (the
// recent tokens). Query row l reads key j packed when j < limits[l] (all rows: dense_from
// when limits is null), so each row of a verify pass sees the keys as a one-token decode
// step at its position would. Other sources are dense rows or rows packed per token in
// groups of `group` channels.
enum Layout : int32_t { DENSE = 0, TOKEN_PACKED = 1, CHANNEL_PACKED = 2 };

struct Source {  // mirrored by kernels/native_attention.py (_Source): keep the field order
  int32_t layout, bits, group, packed, dense_from, scales_half, dense_half;
  const uint32_t* data;
  const void* scales;
  const void* biases;
  const void* dense;
  const int32_t* limits;     // per query position (L), or null
  int64_t data_strides[3];   // batch, head, then position (rows) or channel (CHANNEL_PACKED)
  int64_t scale_strides[3];  // the last axis is contiguous in every array
  int64_t bias_strides[3];
  int64_t dense_strides[3];  // batch, head, position
};

struct Problem {
  const float* q;
  int B, Hq, Hkv, L, S, D, causal;  // head dim is a template parameter
  float scale;
  Source k, v;
};

struct Partial {  // one block of keys for one (batch, KV head): per row max, sum, weighted values
  std::vector<float> max, sum, acc;
};

// exp(x) for x <= 0 as 2^(x·log2 e): a degree-6 polynomial for 2^f on [-0.5, 0.5] (within
// ~1 ulp) and the exponent put in by hand, so loops over it vectorize. Inputs below -87
// (masked keys) give ~1e-38 instead of 0, which the softmax sum cannot notice.
inline float exp_nonpositive(float x) {
  const float y = std::max(x, -87.f) * 1.44269504f;
  const float n = std::floor(y + 0.5f), f = y - n;
  float p = 1.5403530e-4f;
  p = p * f + 1.3333558e-3f;
  p = p * f + 9.6181291e-3f;
  p = p * f + 5.5504109e-2f;
  p = p * f + 2.4022651e-1f;
  p = p * f + 6.9314718e-1f;
  p = p * f + 1.f;
  const int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// Eight values, lowest bits first. They are converted as signed integers (they are below 256):
// AVX2 has no unsigned conversion, and GCC emulates one in five instructions instead of one.
inline v8f unpack8(const uint32_t* words, int bits) {
  const v8u shifts4 = v8u{0, 4, 8, 12, 16, 20, 24, 28}, shifts8 = v8u{0, 8, 16, 24, 0, 8, 16, 24};
  if (bits == 4) return __builtin_convertvector((v8i)(((v8u{} + words[0]) >> shifts4) & 15u), v8f);
  const uint32_t a = words[0], b = words[1];
  return __builtin_convertvector((v8i)((v8u{a, a, a, a, b, b, b, b} >> shifts8) & 255u), v8f);
}

inline float load_affine_value(const void* base, int64_t index, bool half) {
  return half ? half_to_float(static_cast<const uint16_t*>(base)[index]) : static_cast<const float*>(base)[index];
}

inline int64_t offset3(const int64_t* strides, int64_t b, int64_t h, int64_t j) {
  return b * strides[0] + h * strides[1] + j * strides[2];
}

// Row j of a DENSE or TOKEN_PACKED source (or a CHANNEL_PACKED one past `packed`) as D floats.
template <int D>
inline void load_row(const Source& src, int b, int h, int j, v8f* out) {
  constexpr int C = D / 8;
  if (src.layout != TOKEN_PACKED) {  // dense rows: float32 or float16
    const int64_t at = offset3(src.dense_strides, b, h, j - src.dense_from);
    if (src.dense_half) {
      const uint16_t* row = static_cast<const uint16_t*>(src.dense) + at;
      for (int c = 0; c < C; ++c)
        for (int i = 0; i < 8; ++i) out[c][i] = half_to_float(row[c * 8 + i]);
    } else {
      std::memcpy(out, static_cast<const float*>(src.dense) + at, sizeof(float) * D);
    }
    return;
  }
  const uint32_t* words = src.data + offset3(src.data_strides, b, h, j);
  const int64_t so = offset3(src.scale_strides, b, h, j), bo = offset3(src.bias_strides, b, h, j);
  const bool half = src.scales_half != 0;
  const int words_per_vec = src.bits / 4;  // 1 at 4 bits, 2 at 8 bits
  const int per_group = src.group / 8;  // vectors sharing one scale: no division per vector
  for (int c0 = 0, g = 0; c0 < C; c0 += per_group, ++g) {
    const float s = load_affine_value(src.scales, so + g, half), z = load_affine_value(src.biases, bo + g, half);
    for (int c = c0; c < c0 + per_group; ++c) out[c] = unpack8(words + c * words_per_vec, src.bits) * s + z;
  }
}

// Scores of one tile of kTile keys of a CHANNEL_PACKED source against every query row:
// q·k = Σ_d (q_d·s_d)·k_int + Σ_d q_d·z_d, with the packed integers of a channel read as
// vectors along tokens (eight tokens per vector), so nothing is transposed.
template <int D>
void score_channel_tile(const Source& k, int b, int h, int t0, int rows, const v8f (*qs)[D / 8],
                        float (*scores)[kTile]) {
  constexpr int V = kTile / 8, C = D / 8;  // vectors of eight tokens per tile; of eight channels per row
  static_assert(V == 4, "the scoring loop below holds one tile row in four registers");
  v8f tile[D][V];
  alignas(32) float s[D], z[D];
  const int per = 32 / k.bits, group = t0 / kTokenGroup, words = k.bits / 4;
  const bool half = k.scales_half != 0;
  const uint32_t* w = k.data + offset3(k.data_strides, b, h, 0) + t0 / per;
  const int64_t so = offset3(k.scale_strides, b, h, 0) + group, bo = offset3(k.bias_strides, b, h, 0) + group;
  // A tile reads a few bytes from each of D channel rows, a whole row of the cache apart: too
  // many strided streams for the hardware prefetcher, so ask for each row's next line (and
  // the next line of its scales and biases) now. 1.24-1.29x at 32K keys, measured A/B.
  constexpr int kLineBytes = 64;
  const int scale_bytes = half ? 2 : 4;
  for (int d = 0; d < D; ++d, w += k.data_strides[2]) {
    __builtin_prefetch(reinterpret_cast<const char*>(w) + kLineBytes);
    __builtin_prefetch(static_cast<const char*>(k.scales) + (so + d * k.scale_strides[2]) * scale_bytes + kLineBytes);
    __builtin_prefetch(static_cast<const char*>(k.biases) + (bo + d * k.bias_strides[2]) * scale_bytes + kLineBytes);
    for (int v = 0; v < V; ++v) tile[d][v] = unpack8(w + v * words, k.bits);
    s[d] = load_affine_value(k.scales, so + d * k.scale_strides[2], half);
    z[d] = load_affine_value(k.biases, bo + d * k.bias_strides[2], half);
  }
  for (int r = 0; r < rows; ++r) {
    alignas(32) float scaled[D];  // q·s per channel, read back one broadcast at a time
    v8f shift = v8f{};  // Σ q·z
    for (int c = 0; c < C; ++c) {
      v8f sv, zv;
      std::memcpy(&sv, s + c * 8, sizeof sv);
      std::memcpy(&zv, z + c * 8, sizeof zv);
      const v8f product = qs[r][c] * sv;
      std::memcpy(scaled + c * 8, &product, sizeof product);
      shift += qs[r][c] * zv;
    }
    // Eight named accumulators (two chains per vector of tokens: FMA latency), so they stay
    // in registers; an array of them was spilled to the stack by GCC.
    v8f e0 = v8f{}, e1 = v8f{}, e2 = v8f{}, e3 = v8f{}, o0 = v8f{}, o1 = v8f{}, o2 = v8f{}, o3 = v8f{};
#pragma GCC unroll 4
    for (int d = 0; d < D; d += 2) {
      const float a = scaled[d], e = scaled[d + 1];
      e0 += a * tile[d][0];
      e1 += a * tile[d][1];
      e2 += a * tile[d][2];
      e3 += a * tile[d][3];
      o0 += e * tile[d + 1][0];
      o1 += e * tile[d + 1][1];
      o2 += e * tile[d + 1][2];
      o3 += e * tile[d + 1][3];
    }
    const float offset = hsum(shift);
    const v8f total[V] = {e0 + o0 + offset, e1 + o1 + offset, e2 + o2 + offset, e3 + o3 + offset};
    std::memcpy(scores[r], total, sizeof total);
  }
}

template <int D>
void attend_block(const Problem& pr, int b, int h, int k0, int k1, Partial& out) {
  constexpr int C = D / 8;  // vectors per row
  constexpr int kRegisterBlock = C % 8 == 0 ? 8 : (C % 4 == 0 ? 4 : (C % 2 == 0 ? 2 : 1));
  const int rep = pr.Hq / pr.Hkv, rows = rep * pr.L;
  v8f qs[kMaxRows][C];  // this KV head's query rows, pre-scaled
  int limit[kMaxRows];  // keys at or past this are masked for the row
  int packed_limit[kMaxRows];  // channel-packed keys: read packed before this, dense after
  for (int r = 0; r < rows; ++r) {
    const int qh = h * rep + r / pr.L, l = r % pr.L;
    const float* src = pr.q + ((int64_t(b) * pr.Hq + qh) * pr.L + l) * D;
    for (int c = 0; c < C; ++c)
      for (int i = 0; i < 8; ++i) qs[r][c][i] = src[c * 8 + i] * pr.scale;
    limit[r] = pr.causal ? pr.S - pr.L + l + 1 : pr.S;
    packed_limit[r] = pr.k.limits ? pr.k.limits[l] : pr.k.dense_from;
  }
  out.max.assign(rows, kNegInf);
  out.sum.assign(rows, 0.f);
  out.acc.assign(size_t(rows) * D, 0.f);

  // A tile of keys is dequantized once into L1, then read by every row.
  v8f tile[kTile][C];
  alignas(32) float scores[kMaxRows][kTile];
  alignas(32) float packed_scores[kMaxRows][kTile];
  const bool channel = pr.k.layout == CHANNEL_PACKED;
  for (int t0 = k0; t0 < k1; t0 += kTile) {
    const int n = std::min(kTile, k1 - t0);
    // Blocks start on tile bounds, so a packed tile is a whole group. Below dense_from the
    // keys exist only packed; from `packed` on only dense; between, both (rows choose).
    const bool has_packed = channel && t0 < pr.k.packed, has_dense = !channel || t0 >= pr.k.dense_from;
    if (has_packed) score_channel_tile<D>(pr.k, b, h, t0, rows, qs, has_dense ? packed_scores : scores);
    if (has_dense) {
      for (int j = 0; j < n; ++j) load_row<D>(pr.k, b, h, t0 + j, tile[j]);
      for (int r = 0; r < rows; ++r) {
        if (has_packed && t0 < packed_limit[r]) {  // this row reads the group packed
          std::memcpy(scores[r], packed_scores[r], sizeof(float) * n);
          continue;
        }
        for (int j = 0; j < n; ++j) {
          v8f even = qs[r][0] * tile[j][0], odd = v8f{};  // two chains: FMA latency
          for (int c = 1; c < C; ++c) (c & 1 ? odd : even) += qs[r][c] * tile[j][c];
          scores[r][j] = hsum(even + odd);
        }
      }
    }
    for (int r = 0; r < rows; ++r) {  // online softmax: fold the tile into the running max and sum
      float tile_max = kNegInf;
      for (int j = 0; j < n; ++j) {
        if (t0 + j >= limit[r]) scores[r][j] = kNegInf;
        tile_max = std::max(tile_max, scores[r][j]);
      }
      if (tile_max == kNegInf) {  // every key of the tile is masked for this row
        std::fill(scores[r], scores[r] + n, 0.f);
        continue;
      }
      const float new_max = std::max(out.max[r], tile_max);
      const float correction = exp_nonpositive(out.max[r] - new_max);
      if (correction != 1.f) {
        out.sum[r] *= correction;
        float* acc = out.acc.data() + size_t(r) * D;
        for (int i = 0; i < D; ++i) acc[i] *= correction;
      }
      float total = 0.f;
      for (int j = 0; j < n; ++j) total += (scores[r][j] = exp_nonpositive(scores[r][j] - new_max));
      out.sum[r] += total;
      out.max[r] = new_max;
    }
    for (int j = 0; j < n; ++j) load_row<D>(pr.v, b, h, t0 + j, tile[j]);
    for (int r = 0; r < rows; ++r) {  // values: acc += p * v, a block of the row's sums in registers
      float* saved = out.acc.data() + size_t(r) * D;  // not 32-byte aligned: memcpy in and out
      for (int c0 = 0; c0 < C; c0 += kRegisterBlock) {
        v8f acc[kRegisterBlock];
#pragma GCC unroll 8
        for (int c = 0; c < kRegisterBlock; ++c) std::memcpy(&acc[c], saved + (c0 + c) * 8, sizeof(v8f));
        for (int j = 0; j < n; ++j) {
          const float p = scores[r][j];
#pragma GCC unroll 8
          for (int c = 0; c < kRegisterBlock; ++c) acc[c] += p * tile[j][c0 + c];
        }
#pragma GCC unroll 8
        for (int c = 0; c < kRegisterBlock; ++c) std::memcpy(saved + (c0 + c) * 8, &acc[c], sizeof(v8f));
      }
    }
  }
}

using BlockFn = void (*)(const Problem&, int, int, int, int, Partial&);

BlockFn pick(int D) {
  switch (D) {
    case 64: return attend_block<64>;
    case 80: return attend_block<80>;
    case 96: return attend_block<96>;
    case 128: return attend_block<128>;
    case 256: return attend_block<256>;
  }
  return nullptr;
}

void run(const Problem& pr, BlockFn attend, float* out, int threads) {
  const int rows = (pr.Hq / pr.Hkv) * pr.L, D = pr.D;
  // Enough blocks per head to keep every thread busy, but none shorter than 256 keys;
  // blocks start on tile bounds (a packed group of tokens is never split).
  const int heads = pr.B * pr.Hkv;
  int splits = std::max(1, (2 * threads + heads - 1) / heads);
  splits = std::min(splits, std::max(1, pr.S / 256));
  const int block = ((pr.S + splits - 1) / splits + kTile - 1) / kTile * kTile;
  std::vector<Partial> partials(size_t(heads) * splits);
  brisk::parallel_units(int(partials.size()), threads, [&](int u) {
    const int head = u / splits, part = u % splits;
    const int k0 = part * block, k1 = std::min(pr.S, k0 + block);
    if (k0 < k1) attend(pr, head / pr.Hkv, head % pr.Hkv, k0, k1, partials[u]);
  });

  const int rep = pr.Hq / pr.Hkv;
  for (int head = 0; head < heads; ++head) {  // merge the blocks: log-sum-exp rule
    const int b = head / pr.Hkv, h = head % pr.Hkv;
    for (int r = 0; r < rows; ++r) {
      float m = kNegInf;
      for (int part = 0; part < splits; ++part) {
        const Partial& p = partials[size_t(head) * splits + part];
        if (!p.max.empty()) m = std::max(m, p.max[r]);
      }
      const int qh = h * rep + r / pr.L, l = r % pr.L;
      float* dst = out + ((int64_t(b) * pr.Hq + qh) * pr.L + l) * D;
      std::fill(dst, dst + D, 0.f);
      float total = 0.f;
      for (int part = 0; part < splits; ++part) {
        const Partial& p = partials[size_t(head) * splits + part];
        if (p.max.empty() || p.max[r] == kNegInf) continue;
        const float w = std::exp(p.max[r] - m);
        total += w * p.sum[r];
        for (int i = 0; i < D; ++i) dst[i] += w * p.acc[size_t(r) * D + i];
      }
      const float inv = total > 0.f ? 1.f / total : 0.f;  // a fully masked row gives zeros
      for (int i = 0; i < D; ++i) dst[i] *= inv;
    }
  }
}

// 0 when `src` is a layout this kernel reads for head dim D, else the caller's error code.
int check_source(const Source& src, int D, int S, int L, bool is_key) {
  if (src.layout == DENSE) return 0;
  if (src.bits != 4 && src.bits != 8) return 1;
  if (src.layout == TOKEN_PACKED) return (src.group == 32 || src.group == 64) && D % src.group == 0 ? 0 : 2;
  if (src.layout != CHANNEL_PACKED || !is_key) return 6;
  if (src.packed % kTokenGroup || src.packed > S || src.dense_from % kTokenGroup || src.dense_from > src.packed)
    return 2;
  for (int l = 0; src.limits && l < L; ++l)
    if (src.limits[l] < src.dense_from || src.limits[l] > src.packed || src.limits[l] % kTokenGroup) return 7;
  return 0;
}

}  // namespace

extern "C" {

// Returns 0 on success, or a positive code for an unsupported call (the caller falls back):
// 1 bits, 2 group size, 3 head dim, 4 too many rows per KV head, 5 heads not divisible,
// 6 layout, 7 a row's packed limit.
int brisk_kv_attention(const float* q, float* out, int B, int Hq, int Hkv, int L, int S, int D, int causal,
                       float scale, int threads, const Source* k, const Source* v) {
  const BlockFn attend = pick(D);
  if (attend == nullptr) return 3;  // head dims 64, 80, 96, 128, 256
  if (const int code = check_source(*k, D, S, L, true)) return code;
  if (const int code = check_source(*v, D, S, L, false)) return code;
  if (Hkv <= 0 || Hq % Hkv != 0) return 5;
  if ((Hq / Hkv) * L > kMaxRows) return 4;
  Problem pr{q, B, Hq, Hkv, L, S, D, causal, scale, *k, *v};
  run(pr, attend, out, std::max(1, threads));
  return 0;
}

// The same call with each Source flattened, for a caller without this file's struct (the MLX
// primitive, kernels/csrc/mlx_primitives): meta is layout, bits, group, packed, dense_from,
// scales_half, dense_half; pointers are data, scales, biases, dense, limits; strides are
// those of data, scales, biases and dense, three each.
int brisk_kv_attention_flat(const float* q, float* out, int B, int Hq, int Hkv, int L, int S, int D, int causal,
                            float scale, int threads, const int32_t* k_meta, const void* const* k_pointers,
                            const int64_t* k_strides, const int32_t* v_meta, const void* const* v_pointers,
                            const int64_t* v_strides) {
  const auto unflatten = [](const int32_t* m, const void* const* p, const int64_t* st) {
    Source src{m[0], m[1], m[2], m[3], m[4], m[5], m[6], static_cast<const uint32_t*>(p[0]), p[1], p[2], p[3],
               static_cast<const int32_t*>(p[4]), {}, {}, {}, {}};
    std::memcpy(src.data_strides, st, sizeof src.data_strides);
    std::memcpy(src.scale_strides, st + 3, sizeof src.scale_strides);
    std::memcpy(src.bias_strides, st + 6, sizeof src.bias_strides);
    std::memcpy(src.dense_strides, st + 9, sizeof src.dense_strides);
    return src;
  };
  const Source k = unflatten(k_meta, k_pointers, k_strides), v = unflatten(v_meta, v_pointers, v_strides);
  return brisk_kv_attention(q, out, B, Hq, Hkv, L, S, D, causal, scale, threads, &k, &v);
}

int brisk_packed_attention_version() { return 4; }
}
