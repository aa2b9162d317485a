// y = x @ w.T (+ bias) for float32 prefill chunks (64+ rows) on AVX-512 CPUs.
//
// A float32 model's prefill is its linear layers, and MLX hands them to MKL's sgemm, which
// on our AMD CPUs runs its generic code path at 124-155 GFLOP/s of ~220 (two cores of 512-bit
// FMA): Qwen2.5-1.5B with float32 weights took 38 s for a 2K-token prompt, llama.cpp's own
// sgemm 40 (issue 18 asks for 1.2x). Here register_tile.h's 6 x 64 tile (x broadcast, w
// packed 64 columns wide) runs at ~98% of a core's FMA peak in L1; the blocking
// around it keeps a 512 x 128 block of w, packed (256 KB), in L2 while every 6-row tile of x passes.
// Units (a 128-column block of w, and a share of the rows when the columns are few) run on
// the thread pool of quantized_matmul.cpp without meeting. Each output sums its k in order
// within a 512-block, the blocks in order: the same float steps for any M.
// Declines (returns 1) without AVX-512; the caller then uses MLX's matmul.

#include <algorithm>
#include <cstdint>
#include <vector>
#include "isa.h"

extern "C" void brisk_parallel_for(int units, int threads, void (*task)(void*, int), void* context);

#if defined(__AVX2__) && defined(__FMA__)
#include "register_tile.h"

#define BRISK_GEMM BRISK_TILE

namespace {

constexpr int kPanel = brisk::kTileColumns;  // columns a register tile covers
constexpr int kRows = 6;      // rows a register tile covers
constexpr int kDepth = 512;   // k per block: a packed panel is 128 KB
constexpr int kColumns = 128; // columns per unit: two panels, 128 KB packed

struct Gemm {
  const float *x, *w, *bias;
  float* y;
  int M, K, N, column_blocks, row_parts;
};

BRISK_GEMM void tile_rows(int rows, const float* a, int64_t lda, const float* panel, int depth, float* c, int64_t ldc,
                          const __mmask16 (&cols)[4], const float* bias, bool first) {
  switch (rows) {
    case 1: return brisk::register_tile<1>(a, lda, panel, depth, c, ldc, cols, bias, !first);
    case 2: return brisk::register_tile<2>(a, lda, panel, depth, c, ldc, cols, bias, !first);
    case 3: return brisk::register_tile<3>(a, lda, panel, depth, c, ldc, cols, bias, !first);
    case 4: return brisk::register_tile<4>(a, lda, panel, depth, c, ldc, cols, bias, !first);
    case 5: return brisk::register_tile<5>(a, lda, panel, depth, c, ldc, cols, bias, !first);
    default: return brisk::register_tile<6>(a, lda, panel, depth, c, ldc, cols, bias, !first);
  }
}

// w rows [n0, n0 + width) and k [k0, k0 + depth) as panels of [depth][64], zeros past N.
BRISK_GEMM void pack(const float* w, int K, int N, int n0, int width, int k0, int depth, float* out) {
  for (int p = 0; p < width; p += kPanel, out += int64_t(depth) * kPanel)
    for (int j = 0; j < kPanel; ++j) {
      const int n = n0 + p + j;
      if (n >= N) {
        for (int k = 0; k < depth; ++k) out[k * kPanel + j] = 0.f;
        continue;
      }
      const float* row = w + int64_t(n) * K + k0;
      for (int k = 0; k < depth; ++k) out[k * kPanel + j] = row[k];
    }
}

BRISK_GEMM void gemm_unit(void* context, int unit) {
  const Gemm& g = *static_cast<const Gemm*>(context);
  const int block = unit / g.row_parts, part = unit % g.row_parts;
  const int n0 = block * kColumns, width = std::min(kColumns, g.N - n0);
  const int share = (g.M + g.row_parts - 1) / g.row_parts;
  const int m0 = part * share, m1 = std::min(g.M, m0 + share);
  thread_local std::vector<float> packed;
  packed.resize(size_t(kDepth) * kColumns);
  for (int k0 = 0; k0 < g.K; k0 += kDepth) {
    const int depth = std::min(kDepth, g.K - k0);
    pack(g.w, g.K, g.N, n0, width, k0, depth, packed.data());
    for (int p = 0; p < width; p += kPanel) {
      __mmask16 cols[4];
      for (int v = 0; v < 4; ++v) cols[v] = __mmask16((1u << std::clamp(width - p - 16 * v, 0, 16)) - 1);
      const float* panel = packed.data() + int64_t(p / kPanel) * depth * kPanel;
      const float* bias = g.bias ? g.bias + n0 + p : nullptr;
      for (int m = m0; m < m1; m += kRows)
        tile_rows(std::min(kRows, m1 - m), g.x + int64_t(m) * g.K + k0, g.K, panel, depth,
                  g.y + int64_t(m) * g.N + n0 + p, g.N, cols, bias, k0 == 0);
    }
  }
}

}  // namespace

extern "C" {

// y (M, N) = x (M, K) @ w (N, K).T (+ bias (N)), all float32 row-major: 0 done, 1 declined.
int brisk_float_gemm(const float* x, const float* w, const float* bias, float* y, int M, int K, int N, int threads) {
  static const bool avx512 = brisk::isa_allows(brisk::kIsaAvx512) && __builtin_cpu_supports("avx512f");
  if (!avx512 || M < 1 || K < 1 || N < 1) return 1;
  const int blocks = (N + kColumns - 1) / kColumns;
  // Few column blocks (a GQA model's key and value projections): rows are shared out too.
  const int parts = std::max(1, std::min((2 * std::max(1, threads) + blocks - 1) / blocks, (M + kRows - 1) / kRows));
  Gemm g{x, w, bias, y, M, K, N, blocks, parts};
  brisk_parallel_for(blocks * parts, threads, gemm_unit, &g);
  return 0;
}

int brisk_float_gemm_available() {
  return brisk::isa_allows(brisk::kIsaAvx512) && __builtin_cpu_supports("avx512f") ? 1 : 0;
}
}

#else
extern "C" int brisk_float_gemm(const float*, const float*, const float*, float*, int, int, int, int) { return 1; }
extern "C" int brisk_float_gemm_available() { return 0; }
#endif
