// Decode attention straight from a packed (int4/int8, affine, grouped) KV cache, on the CPU.
//
// MLX's CPU quantized_matmul and dequantize kernels are scalar, so on the CPU backend the
// packed cache was slower to attend than the fp32 cache it replaces. This kernel reads each
// packed K/V row once for all query rows sharing its KV head (GQA and multi-token verify
// rows folded together), dequantizes it in registers, and keeps an online softmax (running
// max and sum). Keys are split into blocks across threads; the partial results are merged
// with the log-sum-exp rule. It is built on first use by kernels/native.py and called
// through ctypes with raw pointers and element strides, so it needs no MLX headers.
//
// Dequantization is w = scale * q + bias per group, as mx.quantize packs it: a uint32 holds
// 32/bits values, lowest bits first.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

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

inline float hsum(v8f v) {
  float total = 0.f;
  for (int i = 0; i < 8; ++i) total += v[i];
  return total;
}

constexpr int kMaxRows = 64;
constexpr int kTile = 32;  // keys scored before their values are accumulated
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline float half_to_float(uint16_t h) {
#if defined(BRISK_F16C)
  return _cvtsh_ss(h);
#else
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 113;
      while (!(man & 0x400)) { man <<= 1; --exp; }
      bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

struct Packed {
  const uint32_t* data;
  const void* scales;
  const void* biases;
  const int64_t* data_strides;   // batch, head, position (elements); the last axis is contiguous
  const int64_t* scale_strides;
  const int64_t* bias_strides;
};

struct Problem {
  const float* q;
  int B, Hq, Hkv, L, S, D, causal, half;  // head dim, group and bits are template parameters
  float scale;
  Packed k, v;
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

// One packed row (D values) to floats, eight at a time: w = scale * q + bias per group of G.
template <int BITS, int D, int G>
inline void dequantize_row(const uint32_t* words, const float* s, const float* z, v8f* out) {
  constexpr int per = 32 / BITS;  // values per uint32
  constexpr int words_per_vec = 8 / per;  // 1 at 4 bits, 2 at 8 bits
  const v8u shifts = BITS == 4 ? v8u{0, 4, 8, 12, 16, 20, 24, 28} : v8u{0, 8, 16, 24, 0, 8, 16, 24};
  const v8u mask = v8u{} + ((1u << BITS) - 1);
  for (int c = 0; c < D / 8; ++c) {
    const int g = c * 8 / G;
    v8u word;
    if (words_per_vec == 1) {
      word = v8u{} + words[c];
    } else {
      const uint32_t a = words[2 * c], b = words[2 * c + 1];
      word = v8u{a, a, a, a, b, b, b, b};
    }
    const v8f values = __builtin_convertvector((word >> shifts) & mask, v8f);
    out[c] = values * s[g] + z[g];
  }
}

inline void load_affine(const Packed& p, int64_t b, int64_t h, int64_t j, int groups, bool half, float* s,
                        float* z) {
  const int64_t so = b * p.scale_strides[0] + h * p.scale_strides[1] + j * p.scale_strides[2];
  const int64_t bo = b * p.bias_strides[0] + h * p.bias_strides[1] + j * p.bias_strides[2];
  if (half) {
    auto sp = static_cast<const uint16_t*>(p.scales) + so;
    auto bp = static_cast<const uint16_t*>(p.biases) + bo;
    for (int g = 0; g < groups; ++g) { s[g] = half_to_float(sp[g]); z[g] = half_to_float(bp[g]); }
  } else {
    auto sp = static_cast<const float*>(p.scales) + so;
    auto bp = static_cast<const float*>(p.biases) + bo;
    for (int g = 0; g < groups; ++g) { s[g] = sp[g]; z[g] = bp[g]; }
  }
}

template <int BITS, int D, int G>
inline void load_row(const Packed& p, int b, int h, int j, bool half, v8f* out) {
  float s[D / G], z[D / G];
  load_affine(p, b, h, j, D / G, half, s, z);
  dequantize_row<BITS, D, G>(p.data + b * p.data_strides[0] + h * p.data_strides[1] + j * p.data_strides[2], s, z,
                             out);
}

template <int BITS, int D, int G>
void attend_block(const Problem& pr, int b, int h, int k0, int k1, Partial& out) {
  constexpr int C = D / 8;  // vectors per row
  constexpr int kRegisterBlock = C % 8 == 0 ? 8 : 4;  // vectors of a row's sums held in registers
  const int rep = pr.Hq / pr.Hkv, rows = rep * pr.L;
  const bool half = pr.half != 0;
  v8f qs[kMaxRows][C];  // this KV head's query rows, pre-scaled
  int limit[kMaxRows];  // keys at or past this are masked for the row
  for (int r = 0; r < rows; ++r) {
    const int qh = h * rep + r / pr.L, l = r % pr.L;
    const float* src = pr.q + ((int64_t(b) * pr.Hq + qh) * pr.L + l) * D;
    for (int c = 0; c < C; ++c)
      for (int i = 0; i < 8; ++i) qs[r][c][i] = src[c * 8 + i] * pr.scale;
    limit[r] = pr.causal ? pr.S - pr.L + l + 1 : pr.S;
  }
  out.max.assign(rows, kNegInf);
  out.sum.assign(rows, 0.f);
  out.acc.assign(size_t(rows) * D, 0.f);

  // A tile of keys is dequantized once into L1, then read by every row.
  v8f tile[kTile][C];
  alignas(32) float scores[kMaxRows][kTile];
  for (int t0 = k0; t0 < k1; t0 += kTile) {
    const int n = std::min(kTile, k1 - t0);
    for (int j = 0; j < n; ++j) load_row<BITS, D, G>(pr.k, b, h, t0 + j, half, tile[j]);
    for (int r = 0; r < rows; ++r) {
      for (int j = 0; j < n; ++j) {
        v8f even = qs[r][0] * tile[j][0], odd = v8f{};  // two chains: FMA latency
        for (int c = 1; c < C; ++c) (c & 1 ? odd : even) += qs[r][c] * tile[j][c];
        scores[r][j] = t0 + j < limit[r] ? hsum(even + odd) : kNegInf;
      }
    }
    for (int r = 0; r < rows; ++r) {  // online softmax: fold the tile into the running max and sum
      float tile_max = kNegInf;
      for (int j = 0; j < n; ++j) tile_max = std::max(tile_max, scores[r][j]);
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
    for (int j = 0; j < n; ++j) load_row<BITS, D, G>(pr.v, b, h, t0 + j, half, tile[j]);
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

template <int BITS>
BlockFn pick_for_bits(int D, int G) {
  if (G == 32) {
    switch (D) {
      case 64: return attend_block<BITS, 64, 32>;
      case 96: return attend_block<BITS, 96, 32>;
      case 128: return attend_block<BITS, 128, 32>;
      case 256: return attend_block<BITS, 256, 32>;
    }
  } else if (G == 64) {
    switch (D) {
      case 64: return attend_block<BITS, 64, 64>;
      case 128: return attend_block<BITS, 128, 64>;
      case 256: return attend_block<BITS, 256, 64>;
    }
  }
  return nullptr;
}

void run(const Problem& pr, BlockFn attend, float* out, int threads) {
  const int rows = (pr.Hq / pr.Hkv) * pr.L, D = pr.D;
  // Enough blocks per head to keep every thread busy, but none shorter than 256 keys.
  const int heads = pr.B * pr.Hkv;
  int splits = std::max(1, (2 * threads + heads - 1) / heads);
  splits = std::min(splits, std::max(1, pr.S / 256));
  const int block = (pr.S + splits - 1) / splits;
  std::vector<Partial> partials(size_t(heads) * splits);
  std::atomic<int> next{0};
  auto worker = [&]() {
    for (int u = next++; u < int(partials.size()); u = next++) {
      const int head = u / splits, part = u % splits;
      const int k0 = part * block, k1 = std::min(pr.S, k0 + block);
      if (k0 < k1) attend(pr, head / pr.Hkv, head % pr.Hkv, k0, k1, partials[u]);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min<int>(threads, int(partials.size())); ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();

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

}  // namespace

extern "C" {

// Returns 0 on success, or a positive code for an unsupported shape (the caller falls back):
// 1 bits, 2 group size, 3 head dim, 4 too many rows per KV head, 5 heads not divisible.
int brisk_packed_attention(const float* q, float* out, int B, int Hq, int Hkv, int L, int S, int D, int group,
                           int bits, int causal, int half, float scale, int threads,
                           const uint32_t* k_data, const void* k_scales, const void* k_biases,
                           const int64_t* k_data_strides, const int64_t* k_scale_strides,
                           const int64_t* k_bias_strides, const uint32_t* v_data, const void* v_scales,
                           const void* v_biases, const int64_t* v_data_strides, const int64_t* v_scale_strides,
                           const int64_t* v_bias_strides) {
  if (bits != 4 && bits != 8) return 1;
  if (group != 32 && group != 64) return 2;
  const BlockFn attend = bits == 4 ? pick_for_bits<4>(D, group) : pick_for_bits<8>(D, group);
  if (attend == nullptr) return 3;  // head dims 64, 96 (group 32), 128, 256
  if (Hkv <= 0 || Hq % Hkv != 0) return 5;
  if ((Hq / Hkv) * L > kMaxRows) return 4;
  Problem pr{q, B, Hq, Hkv, L, S, D, causal, half, scale,
             {k_data, k_scales, k_biases, k_data_strides, k_scale_strides, k_bias_strides},
             {v_data, v_scales, v_biases, v_data_strides, v_scale_strides, v_bias_strides}};
  run(pr, attend, out, std::max(1, threads));
  return 0;
}

int brisk_packed_attention_version() { return 2; }
}
