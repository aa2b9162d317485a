// y = x @ dequantize(w).T (+ bias) for affine-quantized weights repacked into column tiles,
// on CPUs with AVX512-VNNI (found at run time; the library stays an AVX2 build).
//
// MLX keeps each output column's weights as one row of K values. A one-row product then
// needs a horizontal sum per column and block, and rows of x can share little: on a Zen 4
// (AVX-512 VNNI, no AMX) those products read Qwen-1.5B's weights at 15-20 GB/s of 34, and
// prefill fell back to dequantized tiles and sgemm. Here 16 output columns are interleaved,
// four consecutive k values of each in one 32-bit lane, so one vpdpbusd adds four products
// for each of 16 columns and 32 k values (a block) leave each lane holding the exact integer
// sum of its column's block, with no reduction: llama.cpp's repacked layouts (Q4_0x8 and
// its kind) do the same. x is rounded per block of 32 values to 15-bit integers (hi and lo
// bytes, as quantized_matmul.cpp's few-row path rounds it), and each (row, column) then
// takes the same float steps in the same order, whatever the number of rows or columns a
// pass works on: decode, a verify pass and prefill agree bit for bit, row by row.
//
// Layout (repack below), per tile t of columns 16t..16t+15 and block j of k values
// 32j..32j+31, tile-major, blocks in order:
// - 4 bits: 256 bytes, four chunks of 64; byte 4c + i of chunk p holds column c's value
//   k = 32j + 8p + i in its low nibble and k + 4 in its high one (i < 4);
// - 5 bits: those 256 bytes for the low four bits, then eight 64-bit masks, mask u
//   (u = 2p + h) holding the fifth bit of the value the nibble layout puts at byte 4c + i
//   of quad u, as bit 4c + i;
// - 6 bits: those 256 bytes for the low four bits, then two chunks of 64; byte 4c + i of
//   chunk h holds the top two bits of the value the nibble layout puts at byte 4c + i of quad
//   4h + r, at bits 2r and 2r + 1 (r < 4);
// - 8 bits: 512 bytes, eight chunks of 64; byte 4c + i of chunk u holds k = 32j + 4u + i.
// Scales and biases (N, K / group), as MLX stores them, become [tile][group][16 columns].
// Every weight array keeps its shape, dtype and size: only the order of its bytes changes.
// Scale codes (kCodes, kernels/scale_codes.py): a K-quant's scales and biases are a float16
// per 256 k values times a small integer, so a table per tile holds, per 256 k values, the
// 16 columns' float16 factors (32 bytes) then one byte per group and column, and the kernel
// takes code x factor in float32. For 4-bit groups of 32: 4.625 bits a weight instead of 5.
// Symmetric layers (kSymmetric) take each bias from its scale and read no biases.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include "isa.h"

extern "C" void brisk_parallel_for(int units, int threads, void (*task)(void*, int), void* context);

// x86-64 only (arm64 and other builds export the same symbols, each answering 2: no VNNI-512).
#if defined(__x86_64__)
#define BRISK_TILED_BUILD 1
#include <immintrin.h>

namespace {

constexpr int kTile = 16;   // output columns per tile: one per 32-bit lane of a 512-bit register
constexpr int kBlock = 32;  // k values per block: x's integer scale and the smallest weight group
// Bytes of a tile's weights asked for (into L2) before they are read. Into L1 4 KB ahead, one
// row read 17 GB/s a core from DRAM against 37 from L3: the misses in flight a core's L1 can
// hold bounded it. Into L2 8 KB ahead: 0.82x the CPU time of 7B-shaped 4-bit layers, 1 and 2
// threads (2 KB-16 KB, L1 and L2 hints tried; 4-row products 0.98x, prefill's unchanged).
constexpr int kPrefetchAhead = 8192;
constexpr float kLevels = 127.f * 128.f;  // |q| of x at most: its hi byte stays within [-127, 127]

enum ScaleType { kF32 = 0, kF16 = 1, kBF16 = 2, kCodes = 3 };
// Or'ed into a scale type: every bias is -2^(bits - 1) x its scale (Q4_0, Q5_0, Q8_0, Q6_K as
// imported): no bias array is read, and the product is the same as with one.
constexpr int kSymmetric = 8;
constexpr int kSuper = 256;  // k values per float16 factor of a code table

#define BRISK_TILED __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

bool cpu_has_vnni() {
  static const bool has = brisk::isa_allows(brisk::kIsaVnni) && __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vnni");
  return has;
}

constexpr int tile_block_bytes(int bits) { return kTile * kBlock * bits / 8; }

// ---------------------------------------------------------------------------------------
// Repacking (once, as a model loads): a tile's block is its 16 columns' 32 values each, laid
// out as quads. A load of Qwen2.5-1.5B repacks 1.3 GB, so each tile's values are unpacked
// into bytes, transposed a quad (32 bits) at a time and packed again in vector registers.

// The 32 values of block j of one MLX row, one per byte.
BRISK_TILED inline void mlx_block(const uint8_t* row, int bits, int j, uint8_t q[kBlock]) {
  if (bits == 8) {
    std::memcpy(q, row + j * kBlock, kBlock);
  } else if (bits == 4) {  // byte m holds values 2m (low nibble) and 2m + 1
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + j * 16)), nibble = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(raw, nibble), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), nibble);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm_unpacklo_epi8(lo, hi));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm_unpackhi_epi8(lo, hi));
  } else if (bits == 6) {  // one little-endian bit string, 4 values in every 3 bytes
    for (int c = 0; c < 8; ++c) {
      const uint8_t* b = row + j * 24 + 3 * c;
      const uint32_t chunk = b[0] | (uint32_t(b[1]) << 8) | (uint32_t(b[2]) << 16);
      for (int i = 0; i < 4; ++i) q[4 * c + i] = uint8_t((chunk >> (6 * i)) & 63);
    }
  } else {  // 5 bits: one little-endian bit string, 8 values in every 5 bytes
    for (int c = 0; c < 4; ++c) {
      uint64_t chunk = 0;
      std::memcpy(&chunk, row + j * 20 + 5 * c, 5);
      for (int i = 0; i < 8; ++i) q[8 * c + i] = uint8_t((chunk >> (5 * i)) & 31);
    }
  }
}

BRISK_TILED void repack_tile_block(const uint8_t* const rows[kTile], int bits, int j, uint8_t* dst) {
  alignas(64) uint8_t q[kTile][kBlock];
  for (int c = 0; c < kTile; ++c) mlx_block(rows[c], bits, j, q[c]);
  // quad[u]: byte 4c + i = column c's value 4u + i
  const __m512i columns = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32(kBlock));
  __m512i quad[8];
  for (int u = 0; u < 8; ++u) quad[u] = _mm512_i32gather_epi32(columns, q[0] + 4 * u, 1);
  if (bits == 8) {
    for (int u = 0; u < 8; ++u) _mm512_storeu_si512(dst + 64 * u, quad[u]);
    return;
  }
  const __m512i nibble = _mm512_set1_epi8(15);
  for (int p = 0; p < 4; ++p) {  // low nibble: quad 2p, high nibble: quad 2p + 1
    const __m512i high = _mm512_slli_epi16(_mm512_and_si512(quad[2 * p + 1], nibble), 4);
    _mm512_storeu_si512(dst + 64 * p, _mm512_or_si512(_mm512_and_si512(quad[2 * p], nibble), high));
  }
  if (bits == 5)
    for (int u = 0; u < 8; ++u) {
      const uint64_t mask = _cvtmask64_u64(_mm512_test_epi8_mask(quad[u], _mm512_set1_epi8(16)));
      std::memcpy(dst + 256 + 8 * u, &mask, 8);
    }
  if (bits == 6)
    for (int h = 0; h < 2; ++h) {
      __m512i top = _mm512_setzero_si512();
      for (int r = 0; r < 4; ++r) {  // (v >> 4) & 3 at bits 2r: 16-bit shifts, masked per byte
        const __m512i two = _mm512_and_si512(_mm512_srli_epi16(quad[4 * h + r], 4), _mm512_set1_epi8(3));
        top = _mm512_or_si512(top, _mm512_slli_epi16(two, 2 * r));
      }
      _mm512_storeu_si512(dst + 256 + 64 * h, top);
    }
}

struct RepackTask {
  const uint8_t* w;
  uint8_t* out;
  int64_t row_bytes;
  int blocks, bits, tiles_per_unit, tiles;
};

// ---------------------------------------------------------------------------------------
// x as integers: per row, hi and lo bytes of q = round(x / d) in natural order, d per block,
// and the float sum of x per group (each group's bias term b * sum(x)).

struct IntegerX {
  int M = 0, K = 0, blocks = 0, groups = 0;
  bool coarse = false;         // hi alone, rounded: q ~ 128 hi (the lo plane is zeros, and skipped)
  std::vector<int8_t> hi, lo;  // M x K
  std::vector<float> d;        // M x blocks
  std::vector<float> sum;      // M x groups
};

BRISK_TILED void round_row(const float* x, int K, int group, bool coarse, int8_t* hi, int8_t* lo, float* d,
                           float* sum) {
  const int per_group = group / kBlock;
  for (int j = 0; j < K / kBlock; ++j) {
    const __m512 a = _mm512_loadu_ps(x + j * kBlock), b = _mm512_loadu_ps(x + j * kBlock + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    const float scale = amax / kLevels, inverse = scale > 0.f ? 1.f / scale : 0.f;
    const __m512 inv = _mm512_set1_ps(inverse);
    // round to nearest even, as std::nearbyint in the default mode
    __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));
    __m512i low = _mm512_set1_epi32(127);
    if (coarse) {  // hi = round(q / 128), within [-127, 127] as |q| <= 127 * 128; lo = 0
      const __m512i half = _mm512_set1_epi32(64);
      qa = _mm512_add_epi32(qa, half), qb = _mm512_add_epi32(qb, half), low = _mm512_setzero_si512();
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(hi + j * kBlock), _mm512_cvtepi32_epi8(_mm512_srai_epi32(qa, 7)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(hi + j * kBlock + 16), _mm512_cvtepi32_epi8(_mm512_srai_epi32(qb, 7)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + j * kBlock), _mm512_cvtepi32_epi8(_mm512_and_si512(qa, low)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + j * kBlock + 16), _mm512_cvtepi32_epi8(_mm512_and_si512(qb, low)));
    d[j] = scale;
    const float total = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
    if (j % per_group == 0) sum[j / per_group] = total;
    else sum[j / per_group] += total;
  }
}

struct RoundTask {
  const float* x;
  IntegerX* out;
  int group, rows_per_unit;
};

void round_rows(const float* x, int M, int K, int group, bool coarse, int threads, IntegerX& out) {
  out.M = M, out.K = K, out.blocks = K / kBlock, out.groups = K / group, out.coarse = coarse;
  out.hi.resize(int64_t(M) * K);
  out.lo.resize(int64_t(M) * K);
  out.d.resize(int64_t(M) * out.blocks);
  out.sum.resize(int64_t(M) * out.groups);
  RoundTask task{x, &out, group, 16};
  auto run = [](void* p, int u) {
    const auto& t = *static_cast<RoundTask*>(p);
    IntegerX& o = *t.out;
    const int end = std::min(o.M, (u + 1) * t.rows_per_unit);
    for (int m = u * t.rows_per_unit; m < end; ++m)
      round_row(t.x + int64_t(m) * o.K, o.K, t.group, o.coarse, &o.hi[int64_t(m) * o.K], &o.lo[int64_t(m) * o.K],
                &o.d[int64_t(m) * o.blocks], &o.sum[int64_t(m) * o.groups]);
  };
  const int units = (M + task.rows_per_unit - 1) / task.rows_per_unit;
  if (units == 1) run(&task, 0);
  else brisk_parallel_for(units, threads, run, &task);
}

// ---------------------------------------------------------------------------------------
// The products.

struct Tiled {
  const uint8_t* w;
  const void* scales;
  const void* biases;
  int scale_type, K, N, bits, group;
  bool symmetric = false;  // biases are -2^(bits - 1) x scales, and `biases` is not read
  Tiled(const uint8_t* w, const void* scales, const void* biases, int type, int K, int N, int bits, int group)
      : w(w), scales(scales), biases(biases), scale_type(type & ~kSymmetric), K(K), N(N), bits(bits), group(group),
        symmetric((type & kSymmetric) != 0) {}
  int blocks() const { return K / kBlock; }
  int groups() const { return K / group; }
  int per_super() const { return kSuper / group; }
  int super_bytes() const { return 2 * kTile + per_super() * kTile; }  // 16 factors, then codes
  // Bytes of one tile's scales (or biases).
  int64_t table_stride() const {
    if (scale_type == kCodes) return int64_t(K / kSuper) * super_bytes();
    return int64_t(groups()) * kTile * (scale_type == kF32 ? 4 : 2);
  }
  const uint8_t* tile(int t) const { return w + int64_t(t) * blocks() * tile_block_bytes(bits); }
};

// 16 scales (or biases) of tile t, group g, as float32 (f16 and bf16 widen exactly).
BRISK_TILED inline __m512 sixteen(const void* p, int type, int64_t at = 0) {
  if (type == kF32) return _mm512_loadu_ps(static_cast<const float*>(p) + at);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + at));
  if (type == kF16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The 16 values of group g in one tile's table (`p`: its start). Codes: code x factor, exact
// in float32 (8 x 11 bits): the K-quant's own value, which MLX's float16 array rounded.
BRISK_TILED __attribute__((always_inline)) inline __m512 group_values(const char* p, int type, int g, int per_super) {
  if (type != kCodes) return sixteen(p, type, int64_t(g) * kTile);
  const char* super = p + int64_t(g / per_super) * (2 * kTile + per_super * kTile);
  const __m512 factor = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(super)));
  const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(super + 2 * kTile + (g % per_super) * kTile));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(codes)), factor);
}

// A symmetric layer's biases from its scales: -2^(bits - 1) x s, exact (a power of two).
BRISK_TILED __attribute__((always_inline)) inline __m512 symmetric_biases(__m512 scales, int bits) {
  return _mm512_mul_ps(scales, _mm512_set1_ps(-float(1 << (bits - 1))));
}

inline int32_t quad(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Quads u and u + 1 (u even) of one tile's block, as unsigned bytes.
template <int BITS>
BRISK_TILED __attribute__((always_inline)) inline void unpack(const uint8_t* blk, int u, __m512i& wa, __m512i& wb) {
  if (BITS == 8) {
    wa = _mm512_loadu_si512(blk + u * 64), wb = _mm512_loadu_si512(blk + u * 64 + 64);
    return;
  }
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  const __m512i raw = _mm512_loadu_si512(blk + u * 32);
  wa = _mm512_and_si512(raw, nibble), wb = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
  if (BITS == 5) {
    const __m512i sixteen = _mm512_set1_epi8(16);
    uint64_t ma, mb;
    std::memcpy(&ma, blk + 256 + 8 * u, 8), std::memcpy(&mb, blk + 256 + 8 * u + 8, 8);
    wa = _mm512_mask_add_epi8(wa, _cvtu64_mask64(ma), wa, sixteen);
    wb = _mm512_mask_add_epi8(wb, _cvtu64_mask64(mb), wb, sixteen);
  }
  if (BITS == 6) {  // quads u, u + 1 of chunk u / 4 at bits 2r, 2r + 2 (r = u % 4): to bits 4-5
    const __m512i top = _mm512_srli_epi16(_mm512_loadu_si512(blk + 256 + 64 * (u / 4)), 2 * (u % 4));
    const __m512i place = _mm512_set1_epi8(0x30);
    wa = _mm512_or_si512(wa, _mm512_and_si512(_mm512_slli_epi16(top, 4), place));
    wb = _mm512_or_si512(wb, _mm512_and_si512(_mm512_slli_epi16(top, 2), place));
  }
}

// One byte plane of x (hi or lo) for R rows against C tiles' block: total += w * x per lane.
template <int BITS, int R, int C>
BRISK_TILED __attribute__((always_inline)) inline void plane_pass(const uint8_t* weights, int64_t tile_bytes,
                                                                  const int8_t* xp, int64_t row, int k0,
                                                                  __m512i (&total)[R][C]) {
  for (int u = 0; u < 8; u += 2) {
    const int ka = k0 + 4 * u, kb = ka + 4;
    __m512i wa[C], wb[C];
    for (int c = 0; c < C; ++c) unpack<BITS>(weights + c * tile_bytes, u, wa[c], wb[c]);
    for (int r = 0; r < R; ++r) {
      const __m512i a = _mm512_set1_epi32(quad(xp + r * row + ka)), b = _mm512_set1_epi32(quad(xp + r * row + kb));
      for (int c = 0; c < C; ++c) total[r][c] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(total[r][c], wa[c], a), wb[c], b);
    }
  }
}

// Columns of C tiles from t0 and rows m0 .. m0 + R - 1. Per block, each (row, column) lane
// gathers its hi and lo integer sums (exact, in any order), then takes the same float steps:
// acc += float((hi << 7) + lo) * (s * d), and at each group's end acc += b * sum(x).
// The C tiles and R rows are addressed as one base and a stride each (sixteen pointers for
// four tiles spilled to vector registers), and the group is a template parameter (a division
// per block did more harm than the rest of the epilogue).
template <int BITS, int GROUP, int R, int C>
BRISK_TILED void tile_kernel(const Tiled& w, int t0, const IntegerX& x, int m0, const float* bias, float* out) {
  constexpr int kBytes = tile_block_bytes(BITS), kPerGroup = GROUP / kBlock;
  const int blocks = w.blocks();
  const int64_t tile_bytes = int64_t(blocks) * kBytes;
  const int64_t scale_stride = w.table_stride();
  constexpr int per_super = kSuper / GROUP;  // a constant: the table's offsets take shifts, not divisions
  const uint8_t* weights = w.tile(t0);
  const char* scales = static_cast<const char*>(w.scales) + t0 * scale_stride;
  const char* biases = static_cast<const char*>(w.biases) + t0 * scale_stride;
  const int64_t row = x.K;
  const int8_t* xh = &x.hi[int64_t(m0) * row];
  const int8_t* xl = &x.lo[int64_t(m0) * row];
  const float* xd = &x.d[int64_t(m0) * x.blocks];
  const float* xs = &x.sum[int64_t(m0) * x.groups];
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int j = 0; j < blocks; ++j, weights += kBytes) {
    // Each lane's (hi << 7) + lo over the block. One row (decode) keeps hi and lo in chains of
    // their own (eight chains over four tiles hide vpdpbusd's latency, and each weight is
    // unpacked once); more rows sum hi, shift it, then add lo into the same register (the same
    // integer), unpacking twice: two accumulators per (row, tile) spilled out of 32 registers.
    __m512i total[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) total[r][c] = _mm512_setzero_si512();
    const int k0 = j * kBlock;
    // The hardware prefetcher alone left one-row products at 25-30 GB/s of ~35 between the
    // weight stream, the scale and bias streams and the other thread's: asking ahead (at first
    // 4 KB into L1; now kPrefetchAhead, into L2) reads them 1.2-1.4x faster (4-row verify products 1.1-1.3x; prefill's tiles, in L1
    // while their rows pass, unchanged).
    for (int c = 0; c < C; ++c)
      for (int line = 0; line < kBytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(weights) + c * tile_bytes + kPrefetchAhead + line, _MM_HINT_T1);
    if constexpr (R == 1) {
      __m512i hi2[C], lo[C], lo2[C];  // even and odd quads apart: four chains a tile
      for (int c = 0; c < C; ++c) hi2[c] = lo[c] = lo2[c] = _mm512_setzero_si512();
      for (int u = 0; u < 8; u += 2) {
        const int ka = k0 + 4 * u, kb = ka + 4;  // quad u holds k0 + 4u .. k0 + 4u + 3
        const __m512i ha = _mm512_set1_epi32(quad(xh + ka)), hb = _mm512_set1_epi32(quad(xh + kb));
        const __m512i la = _mm512_set1_epi32(quad(xl + ka)), lb = _mm512_set1_epi32(quad(xl + kb));
        for (int c = 0; c < C; ++c) {
          __m512i wa, wb;
          unpack<BITS>(weights + c * tile_bytes, u, wa, wb);
          total[0][c] = _mm512_dpbusd_epi32(total[0][c], wa, ha), hi2[c] = _mm512_dpbusd_epi32(hi2[c], wb, hb);
          lo[c] = _mm512_dpbusd_epi32(lo[c], wa, la), lo2[c] = _mm512_dpbusd_epi32(lo2[c], wb, lb);
        }
      }
      for (int c = 0; c < C; ++c) {
        const __m512i hi = _mm512_add_epi32(total[0][c], hi2[c]);
        total[0][c] = _mm512_add_epi32(_mm512_slli_epi32(hi, 7), _mm512_add_epi32(lo[c], lo2[c]));
      }
    } else {
      plane_pass<BITS, R, C>(weights, tile_bytes, xh, row, k0, total);
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) total[r][c] = _mm512_slli_epi32(total[r][c], 7);
      if (!x.coarse) plane_pass<BITS, R, C>(weights, tile_bytes, xl, row, k0, total);
    }
    const int g = j / kPerGroup;
    for (int c = 0; c < C; ++c) {
      const __m512 s = group_values(scales + c * scale_stride, w.scale_type, g, per_super);
      for (int r = 0; r < R; ++r) {
        const __m512 sd = _mm512_mul_ps(s, _mm512_set1_ps(xd[r * x.blocks + j]));
        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total[r][c]), sd, acc[r][c]);
      }
    }
    if (j % kPerGroup == kPerGroup - 1) {
      for (int c = 0; c < C; ++c) {
        const __m512 b =
            w.symmetric ? symmetric_biases(group_values(scales + c * scale_stride, w.scale_type, g, per_super), BITS)
                        : group_values(biases + c * scale_stride, w.scale_type, g, per_super);
        for (int r = 0; r < R; ++r)
          acc[r][c] = _mm512_fmadd_ps(b, _mm512_set1_ps(xs[r * x.groups + g]), acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const int n = (t0 + c) * kTile;
      __m512 y = acc[r][c];
      if (bias) y = _mm512_add_ps(y, _mm512_loadu_ps(bias + n));
      _mm512_storeu_ps(out + int64_t(m0 + r) * w.N + n, y);
    }
}

// Rows m0 .. m0 + R - 1 against tiles [t0, t1): C tiles at a time, the rest one by one.
template <int BITS, int GROUP, int R, int C>
BRISK_TILED void row_tile_span(const Tiled& w, int t0, int t1, const IntegerX& x, int m0, const float* bias,
                               float* out) {
  int t = t0;
  for (; t + C <= t1; t += C) tile_kernel<BITS, GROUP, R, C>(w, t, x, m0, bias, out);
  for (; t < t1; ++t) tile_kernel<BITS, GROUP, R, 1>(w, t, x, m0, bias, out);
}

// Tiles [t, t_end) of w with their code tables as float32 groups in `buffer`, the same values:
// many rows that share a tile's weights then share one expansion instead of one per four
// rows (prefill read tables 10% slower than float16 groups without it, and as fast with it).
BRISK_TILED Tiled expanded_tiles(const Tiled& w, int t, int t_end, std::vector<float>& buffer) {
  const int groups = w.groups(), per_super = w.per_super(), count = t_end - t;
  buffer.resize(size_t(2) * count * groups * kTile);
  float* scales = buffer.data();
  float* biases = scales + size_t(count) * groups * kTile;
  for (int u = 0; u < count; ++u) {
    const int64_t table = int64_t(t + u) * w.table_stride();
    for (int g = 0; g < groups; ++g) {
      const int64_t at = (int64_t(u) * groups + g) * kTile;
      const __m512 s = group_values(static_cast<const char*>(w.scales) + table, kCodes, g, per_super);
      _mm512_storeu_ps(scales + at, s);
      _mm512_storeu_ps(biases + at, w.symmetric ? symmetric_biases(s, w.bits)
                                                : group_values(static_cast<const char*>(w.biases) + table, kCodes, g,
                                                               per_super));
    }
  }
  Tiled view = w;
  view.w = w.tile(t), view.scales = scales, view.biases = biases, view.scale_type = kF32, view.symmetric = false;
  return view;
}

// Up to this many rows (decode, most verify passes) the kernel reads code tables itself: an
// expansion per pair of tiles cost 4- and 8-row products 4-7% (in-process A/B).
constexpr int kReadCodesUpTo = 8;

// Every row against tiles [t0, t1), C tiles side by side: the rows four at a time, then the rest.
template <int BITS, int GROUP, int C>
BRISK_TILED void rows_in_fours(const Tiled& w, int t0, int t1, const IntegerX& x, const float* bias, float* out) {
  int m = 0;
  for (; m + 4 <= x.M; m += 4) row_tile_span<BITS, GROUP, 4, C>(w, t0, t1, x, m, bias, out);
  switch (x.M - m) {
    case 1: row_tile_span<BITS, GROUP, 1, C>(w, t0, t1, x, m, bias, out); break;
    case 2: row_tile_span<BITS, GROUP, 2, C>(w, t0, t1, x, m, bias, out); break;
    case 3: row_tile_span<BITS, GROUP, 3, C>(w, t0, t1, x, m, bias, out); break;
    default: break;
  }
}

// Tiles [t0, t1) of every row. One row (decode) takes one tile at a time: four tiles side by
// side (four weight streams and eight of scales) left DRAM short, 4-bit weights reading at 28
// GB/s against 32-36 one tile at a time (8-bit: 32 against 34.5). So do a verify pass's few
// rows: with two tiles side by side a 2-row product of SmolLM2's layers cost 1.35x a 1-row
// one, one tile at a time 1.03x (all its layers, A/B in one process: 2-6 rows 1.06-1.35x
// faster, Qwen2.5-1.5B's 1.06-1.19x; from 7 rows on two tiles were as fast or faster).
// More rows take two tiles and four rows at a time, the tiles' weights staying in L1 while
// the rows pass.
constexpr int kOneTileUpTo = 6;
constexpr int kFewRowUnitTiles = 4;  // the least a thread takes at a time of a few-row product

template <int BITS, int GROUP>
BRISK_TILED void tiles_of_rows(const Tiled& w, int t0, int t1, const IntegerX& x, const float* bias, float* out) {
  if (x.M == 1) return row_tile_span<BITS, GROUP, 1, 1>(w, t0, t1, x, 0, bias, out);
  if (x.M <= kOneTileUpTo) {  // a verify pass: each tile once
    for (int t = t0; t < t1; ++t) rows_in_fours<BITS, GROUP, 1>(w, t, t + 1, x, bias, out);
    return;
  }
  thread_local std::vector<float> buffer;
  for (int t = t0; t < t1; t += 2) {
    const int t_end = std::min(t1, t + 2);
    // a code table's pair is read as tiles 0 and 1 of its expansion: columns and bias from 16t
    const bool codes = w.scale_type == kCodes && x.M > kReadCodesUpTo;
    const Tiled pair = codes ? expanded_tiles(w, t, t_end, buffer) : w;
    const int a = codes ? 0 : t, b = codes ? t_end - t : t_end;
    const float* pair_bias = codes && bias ? bias + t * kTile : bias;
    float* pair_out = codes ? out + t * kTile : out;
    rows_in_fours<BITS, GROUP, 2>(pair, a, b, x, pair_bias, pair_out);
  }
}

struct MatmulTask {
  const Tiled* w;
  const IntegerX* x;
  const float* bias;
  float* out;
  int tiles_per_unit;
};

template <int BITS, int GROUP>
void run_units(void* p, int u) {
  const auto& t = *static_cast<MatmulTask*>(p);
  const int tiles = t.w->N / kTile;
  const int t0 = u * t.tiles_per_unit, t1 = std::min(tiles, t0 + t.tiles_per_unit);
  tiles_of_rows<BITS, GROUP>(*t.w, t0, t1, *t.x, t.bias, t.out);
}

template <int GROUP>
auto units_of(int bits) {
  return bits == 4 ? run_units<4, GROUP> : bits == 5 ? run_units<5, GROUP> : bits == 6 ? run_units<6, GROUP> : run_units<8, GROUP>;
}

bool supported(int bits, int group, int K, int N, int scale_type) {
  scale_type &= ~kSymmetric;
  return (bits == 4 || bits == 5 || bits == 6 || bits == 8) && (group == 32 || group == 64) && K % group == 0 && N % kTile == 0 &&
         K > 0 && N > 0 && scale_type >= kF32 && scale_type <= kCodes && (scale_type != kCodes || K % kSuper == 0);
}

// Column v of a tiled table (row v of the (V, K) matrix it holds), dequantized.
BRISK_TILED void gather_row(const Tiled& w, int v, float* out) {
  const int t = v / kTile, c = v % kTile, bytes = tile_block_bytes(w.bits);
  for (int j = 0; j < w.blocks(); ++j) {
    const uint8_t* blk = w.tile(t) + int64_t(j) * bytes;
    alignas(16) uint8_t q[kBlock];
    if (w.bits == 8) {
      for (int u = 0; u < 8; ++u) std::memcpy(q + 4 * u, blk + 64 * u + 4 * c, 4);
    } else {
      for (int p = 0; p < 4; ++p)
        for (int i = 0; i < 4; ++i) {
          const uint8_t byte = blk[64 * p + 4 * c + i];
          q[8 * p + i] = byte & 15, q[8 * p + 4 + i] = byte >> 4;
        }
      if (w.bits == 5)
        for (int u = 0; u < 8; ++u) {
          uint64_t mask;
          std::memcpy(&mask, blk + 256 + 8 * u, 8);
          for (int i = 0; i < 4; ++i) q[4 * u + i] |= uint8_t(((mask >> (4 * c + i)) & 1) << 4);
        }
      if (w.bits == 6)
        for (int u = 0; u < 8; ++u)
          for (int i = 0; i < 4; ++i)
            q[4 * u + i] |= uint8_t(((blk[256 + 64 * (u / 4) + 4 * c + i] >> (2 * (u % 4))) & 3) << 4);
    }
    const int g = j * kBlock / w.group;
    const int64_t table = int64_t(t) * w.table_stride();
    alignas(64) float sv[kTile], bv[kTile];
    _mm512_store_ps(sv, group_values(static_cast<const char*>(w.scales) + table, w.scale_type, g, w.per_super()));
    _mm512_store_ps(bv, w.symmetric ? symmetric_biases(_mm512_load_ps(sv), w.bits)
                                    : group_values(static_cast<const char*>(w.biases) + table, w.scale_type, g,
                                                   w.per_super()));
    const __m512 s = _mm512_set1_ps(sv[c]), b = _mm512_set1_ps(bv[c]);
    for (int h = 0; h < 2; ++h) {
      const __m512 v16 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(q + 16 * h))));
      _mm512_storeu_ps(out + j * kBlock + 16 * h, _mm512_fmadd_ps(v16, s, b));
    }
  }
}

}  // namespace
#endif  // BRISK_TILED_BUILD

extern "C" {

#if BRISK_TILED_BUILD
// 1 when this CPU runs the tiled products (AVX512 F, BW, VL, DQ and VNNI).
int brisk_tiled_available() { return cpu_has_vnni() ? 1 : 0; }

// MLX's (N, K) weight in the tiled layout, into a buffer of the same size (scales and
// biases are reordered by kernels/tiled_matmul.py). Returns 1 for what the layout does not
// take (N a multiple of 16, K of 32), 2 on a CPU without VNNI-512.
int brisk_tiled_repack(const uint8_t* w, uint8_t* out, int N, int K, int bits, int threads) {
  if ((bits < 4 || bits > 8 || bits == 7) || N % kTile || K % kBlock || N < 1) return 1;
  if (!cpu_has_vnni()) return 2;
  RepackTask task{w, out, int64_t(K) * bits / 8, K / kBlock, bits, 64, N / kTile};
  auto run = [](void* p, int u) {
    const auto& t = *static_cast<RepackTask*>(p);
    const int bytes = tile_block_bytes(t.bits);
    for (int tile = u * t.tiles_per_unit; tile < std::min(t.tiles, (u + 1) * t.tiles_per_unit); ++tile) {
      const uint8_t* rows[kTile];
      for (int c = 0; c < kTile; ++c) rows[c] = t.w + (int64_t(tile) * kTile + c) * t.row_bytes;
      for (int j = 0; j < t.blocks; ++j) repack_tile_block(rows, t.bits, j, t.out + (int64_t(tile) * t.blocks + j) * bytes);
    }
  };
  brisk_parallel_for((task.tiles + task.tiles_per_unit - 1) / task.tiles_per_unit, threads, run, &task);
  return 0;
}

// y (M, N) = x (M, K) @ dequantize(w).T (+ bias) for tiled weights. Returns 1 for what the
// layout does not take, 2 on a CPU without VNNI-512. `coarse`: x rounded to 8 bits a block
// (llama.cpp's Q8 precision, ~1e-2 of a layer's largest output instead of ~1e-4), one integer pass
// instead of two: for a sparse-prefill draft's scoring, where only the ranking is read.
int brisk_tiled_matmul(const float* x, const uint8_t* w, const void* scales, const void* biases, int scale_type,
                       const float* bias, float* out, int M, int K, int N, int bits, int group, int threads,
                       int coarse) {
  if (!supported(bits, group, K, N, scale_type) || M < 1) return 1;
  if (!cpu_has_vnni()) return 2;
  thread_local IntegerX kept;  // reused between calls: a decode step makes ~200 of them
  IntegerX& rows = kept;
  round_rows(x, M, K, group, coarse != 0, threads, rows);
  const Tiled tiled{w, scales, biases, scale_type, K, N, bits, group};
  const int tiles = N / kTile;
  // Contiguous stretches of tiles per thread (the hardware prefetcher follows each), at least
  // two tiles so prefill's pairs stay whole.
  const int share = (tiles + std::max(1, threads) - 1) / std::max(1, threads);
  int per_unit = std::max(2, share + share % 2);
  // A few rows (decode, verify) take a quarter of a thread's share at a time, at least four
  // tiles: a worker that wakes late, or is preempted, then costs the product a part of its
  // share rather than all of it (7B-shaped 4-bit layers, 2 threads on a loaded machine: wall
  // 0.98x, best of 10 in 6 interleaved runs; CPU time unchanged).
  if (M <= kOneTileUpTo && threads > 1) per_unit = std::max(kFewRowUnitTiles, (tiles + 4 * threads - 1) / (4 * threads));
  MatmulTask task{&tiled, &rows, bias, out, per_unit};
  const int units = (tiles + task.tiles_per_unit - 1) / task.tiles_per_unit;
  auto run = group == 64 ? units_of<64>(bits) : units_of<32>(bits);
  if (units == 1) run(&task, 0);
  else brisk_parallel_for(units, threads, run, &task);
  return 0;
}

// Rows `ids` of a tiled (V, K) table, dequantized (the embedding lookup of a tiled tied head).
// Returns 4 for an id outside the table.
int brisk_tiled_gather(const int32_t* ids, int count, const uint8_t* w, const void* scales, const void* biases,
                       int scale_type, float* out, int V, int K, int bits, int group) {
  if (!supported(bits, group, K, V, scale_type)) return 1;
  if (!cpu_has_vnni()) return 2;
  for (int n = 0; n < count; ++n) {
    if (ids[n] < 0 || ids[n] >= V) return 4;
    gather_row(Tiled{w, scales, biases, scale_type, K, V, bits, group}, ids[n], out + int64_t(n) * K);
  }
  return 0;
}

#else
int brisk_tiled_available() { return 0; }
int brisk_tiled_repack(const uint8_t*, uint8_t*, int, int, int, int) { return 2; }
int brisk_tiled_matmul(const float*, const uint8_t*, const void*, const void*, int, const float*, float*, int, int, int,
                       int, int, int, int) {
  return 2;
}
int brisk_tiled_gather(const int32_t*, int, const uint8_t*, const void*, const void*, int, float*, int, int, int, int) {
  return 2;
}
#endif  // BRISK_TILED_BUILD

int brisk_tiled_matmul_version() { return 2; }
}
