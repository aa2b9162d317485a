// y = x @ w.T (+ bias) for a few rows of x: the verify pass of speculative decoding.
//
// A verify pass multiplies k+1 token rows by every weight matrix. On the CPU, MLX hands that
// to sgemm, and MKL's sgemm for 2-16 rows is 2-5x slower than for one row, so verifying 5
// tokens cost about 3 plain decode steps and drafting barely paid. The weights dominate:
// read each weight row once, in a pair, and take its dot products with every x row while it
// sits in L1, so a few rows cost about what one does. Threads split the output columns.
// Built on first use by kernels/ctypes_library.py and called through ctypes with raw pointers.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "thread_pool.h"

namespace {

// Eight floats as GCC/Clang vector extensions (AVX on x86, NEON pairs on arm64); the
// unaligned type loads straight from the row, not through a copy on the stack.
typedef float v8f __attribute__((vector_size(32)));
typedef float v8f_unaligned __attribute__((vector_size(32), aligned(4), may_alias));

inline v8f load(const float* p) { return *reinterpret_cast<const v8f_unaligned*>(p); }

inline float hsum(v8f v) {
  float total = 0.f;
  for (int i = 0; i < 8; ++i) total += v[i];
  return total;
}

constexpr int kMaxRows = 16;
constexpr int kRowTile = 6;    // x rows per register tile: 2 x 6 accumulators + 3 loads fit 16 registers
constexpr int kColumnUnit = 64;  // output columns a thread takes at a time

struct Problem {
  const float* x;
  const float* w;
  const float* bias;  // may be null
  float* out;
  int M, K, N;
};

// Rows [m0, m0 + R) of x against weight rows n and n + 1.
template <int R>
void tile_pair(const Problem& p, int m0, int n) {
  const float* w0 = p.w + int64_t(n) * p.K;
  const float* w1 = w0 + p.K;
  const float* x = p.x + int64_t(m0) * p.K;
  v8f a0[R], a1[R];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) a0[r] = a1[r] = v8f{};
  int k = 0;
  for (; k + 8 <= p.K; k += 8) {
    const v8f b0 = load(w0 + k), b1 = load(w1 + k);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const v8f xv = load(x + int64_t(r) * p.K + k);
      a0[r] += xv * b0;
      a1[r] += xv * b1;
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    const float* xr = x + int64_t(r) * p.K;
    float s0 = hsum(a0[r]), s1 = hsum(a1[r]);
    for (int kk = k; kk < p.K; ++kk) {
      s0 += xr[kk] * w0[kk];
      s1 += xr[kk] * w1[kk];
    }
    float* dst = p.out + int64_t(m0 + r) * p.N + n;
    dst[0] = s0 + (p.bias ? p.bias[n] : 0.f);
    dst[1] = s1 + (p.bias ? p.bias[n + 1] : 0.f);
  }
}

void tile_pair_any(const Problem& p, int m0, int rows, int n) {
  switch (rows) {
    case 1: return tile_pair<1>(p, m0, n);
    case 2: return tile_pair<2>(p, m0, n);
    case 3: return tile_pair<3>(p, m0, n);
    case 4: return tile_pair<4>(p, m0, n);
    case 5: return tile_pair<5>(p, m0, n);
    default: return tile_pair<6>(p, m0, n);
  }
}

void last_column(const Problem& p, int n) {  // an odd N leaves one
  const float* w = p.w + int64_t(n) * p.K;
  for (int m = 0; m < p.M; ++m) {
    const float* x = p.x + int64_t(m) * p.K;
    float s = 0.f;
    for (int k = 0; k < p.K; ++k) s += x[k] * w[k];
    p.out[int64_t(m) * p.N + n] = s + (p.bias ? p.bias[n] : 0.f);
  }
}

void columns(const Problem& p, int n0, int n1) {
  // Balanced row tiles (8 rows: 4 + 4, not 6 + 2): a short tile wastes the weight loads.
  const int tiles = (p.M + kRowTile - 1) / kRowTile, rows = (p.M + tiles - 1) / tiles;
  int n = n0;
  for (; n + 2 <= n1; n += 2)  // the pair stays in L1 while every x row passes over it
    for (int m0 = 0; m0 < p.M; m0 += rows) tile_pair_any(p, m0, std::min(rows, p.M - m0), n);
  if (n < n1) last_column(p, n);
}

}  // namespace

extern "C" {

// Returns 0 on success, or a positive code the caller falls back on: 1 too many rows.
int brisk_skinny_matmul(const float* x, const float* w, const float* bias, float* out, int M, int K, int N,
                        int threads) {
  if (M < 1 || M > kMaxRows) return 1;
  const Problem p{x, w, bias, out, M, K, N};
  const int units = (N + kColumnUnit - 1) / kColumnUnit;
  brisk::parallel_units(units, std::max(1, threads),
                        [&](int u) { columns(p, u * kColumnUnit, std::min(N, (u + 1) * kColumnUnit)); });
  return 0;
}

int brisk_skinny_matmul_version() { return 1; }
}
