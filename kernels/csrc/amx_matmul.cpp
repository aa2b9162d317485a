// Prefill's quantized linear layers on AMX tiles (Intel Sapphire Rapids and later, found at
// run time: the library stays built for AVX2): y = x @ dequantize(w).T (+ bias) for MLX's
// affine 4-, 5- and 8-bit weights and many rows of x.
//
// Why: a prefill chunk's matmuls were sgemm on dequantized float32 tiles, 77% of a
// Qwen-1.5B prefill (`brisk bench prefill-profile`), at about 300 GFLOP/s here. One tdpbusd
// multiplies a 16 x 32 tile of weights by 32 x 16 bytes of x; the work left per block is a
// float epilogue (the group's scale times x's), so the matmuls run several times faster.
//
// Arithmetic: the integer-x rounding of the few-row path (quantized_matmul.cpp): x is
// rounded per block of 32 values to q = x / d, |q| <= 127 * 128, kept as bytes hi = q >> 7
// and lo = q & 127. For output n, row m and block b the tiles give the exact integer
// sum_k w[k] * q[k] = 128 * (w . hi) + (w . lo); then
//   acc = fma(float(sum), s[n][b] * d[m][b], acc)   block after block,
//   acc = fma(bias[n][g], sum of x over group g, acc) group after group, plus the layer's bias.
// Tile A holds 16 weight rows x 32 bytes of one block (a 4-bit row unpacked to its even
// elements, then its odd ones: low nibbles, then high); tiles B hold x's hi or lo bytes for
// 16 rows in the order tdpbusd reads them (B[r][4m + i] = slot 4r + i of row m); C holds 16
// outputs x 16 rows of int32 sums.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "half.h"
#include "isa.h"

extern "C" void brisk_parallel_for(int units, int threads, void (*task)(void*, int), void* context);

#if defined(__x86_64__) && defined(__AVX2__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define BRISK_AMX_BUILD 1
#endif

namespace {

#ifdef BRISK_AMX_BUILD
#define BRISK_AMX \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,amx-tile,amx-int8")))

constexpr int kTile = 16;   // outputs per tile, and rows of x per tile
constexpr int kBlock = 32;  // values of x per rounding scale d; bytes of a weight tile's row
constexpr float kLevels = 127.f * 128.f;
constexpr int kPanels = 4;  // tiles of 16 outputs that share each pass over x's tiles

// Linux hands out the tile registers' state only on request (arch_prctl), once per process.
bool request_tiles() {
  constexpr long kRequestPermission = 0x1023, kTileData = 18;
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool tile = edx & (1u << 24), int8 = edx & (1u << 25);
  if (!brisk::isa_allows(brisk::kIsaAmx) || !tile || !int8 || !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512dq") ||
      !__builtin_cpu_supports("avx512vbmi"))  // every AMX CPU has it: the 5-bit unpacking uses it
    return false;
  return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
}

bool has_amx() {
  static const bool has = request_tiles();
  return has;
}

struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tile registers by number (the intrinsics paste it into the instruction's text).
#define TILE_W 0     // weights of one block
#define TILE_HI 1    // x's hi bytes for that block
#define TILE_LO 2    // x's lo bytes
#define TILE_SUM_HI0 3  // sums of even blocks (hi, lo), then odd ones: one block's epilogue
#define TILE_SUM_LO0 4  // runs while the next block's tiles are computed
#define TILE_SUM_HI1 5
#define TILE_SUM_LO1 6

BRISK_AMX void configure_tiles() {
  TileConfig config;
  config.rows[TILE_W] = kTile, config.colsb[TILE_W] = kBlock;
  for (int t : {TILE_HI, TILE_LO}) config.rows[t] = kBlock / 4, config.colsb[t] = 4 * kTile;
  for (int t : {TILE_SUM_HI0, TILE_SUM_LO0, TILE_SUM_HI1, TILE_SUM_LO1}) config.rows[t] = kTile, config.colsb[t] = 4 * kTile;
  _tile_loadconfig(&config);
}

// x in tile order: per tile of 16 rows and block b the hi and lo B tiles (512 bytes each), d
// per row, and per group the float sums of x (the bias term).
struct TiledX {
  int M = 0, K = 0, bits = 4, group = 32, tiles = 0, blocks = 0, groups = 0;
  const float* x = nullptr;
  std::vector<int8_t> bytes;  // tiles x blocks x {hi, lo} x 512
  std::vector<float> d;       // tiles x blocks x 16
  std::vector<float> sums;    // tiles x groups x 16
  const int8_t* hi(int t, int b) const { return bytes.data() + (int64_t(t) * blocks + b) * 1024; }
  const float* d_of(int t, int b) const { return d.data() + (int64_t(t) * blocks + b) * kTile; }
  const float* sums_of(int t, int g) const { return sums.data() + (int64_t(t) * groups + g) * kTile; }
};

// Rows [16t, 16t + 16) of x into tile order (rows past M stay zero).
BRISK_AMX void tile_rows(TiledX& out, int t) {
  // A block's 32 values as tile slots: 4-bit weights are unpacked as evens, then odds.
  const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odds = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m256i quads = _mm256_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112);  // B row r at 64 bytes * r, in int32s
  const __m512 sign = _mm512_set1_ps(-0.f);
  for (int lane = 0; lane < kTile && t * kTile + lane < out.M; ++lane) {
    const float* row = out.x + int64_t(t * kTile + lane) * out.K;
    for (int b = 0; b < out.blocks; ++b) {
      __m512 first = _mm512_loadu_ps(row + b * kBlock), second = _mm512_loadu_ps(row + b * kBlock + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, first), _mm512_andnot_ps(sign, second)));
      const float total = _mm512_reduce_add_ps(_mm512_add_ps(first, second));
      const float d = amax / kLevels, inverse = d > 0.f ? 1.f / d : 0.f;
      __m512i q0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(first, _mm512_set1_ps(inverse)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      __m512i q1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(second, _mm512_set1_ps(inverse)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      if (out.bits == 4) {
        const __m512i a = _mm512_permutex2var_epi32(q0, evens, q1), c = _mm512_permutex2var_epi32(q0, odds, q1);
        q0 = a, q1 = c;
      }
      int8_t* tile = out.bytes.data() + (int64_t(t) * out.blocks + b) * 1024;
      for (int plane = 0; plane < 2; ++plane) {  // hi = q >> 7, lo = q & 127
        const __m512i low = _mm512_set1_epi32(127);
        const __m128i s0 = _mm512_cvtepi32_epi8(plane ? _mm512_and_si512(q0, low) : _mm512_srai_epi32(q0, 7));
        const __m128i s1 = _mm512_cvtepi32_epi8(plane ? _mm512_and_si512(q1, low) : _mm512_srai_epi32(q1, 7));
        // slots 0-31 as 8 int32s of 4 bytes: slot group r goes to B row r, column `lane`
        const __m256i groups = _mm256_inserti128_si256(_mm256_castsi128_si256(s0), s1, 1);
        _mm256_i32scatter_epi32(reinterpret_cast<int*>(tile + plane * 512 + 4 * lane), quads, groups, 4);
      }
      out.d[(int64_t(t) * out.blocks + b) * kTile + lane] = d;
      out.sums[(int64_t(t) * out.groups + b * kBlock / out.group) * kTile + lane] += total;
    }
  }
}

BRISK_AMX void tile_rows_unit(void* context, int t) { tile_rows(*static_cast<TiledX*>(context), t); }

struct Job {
  const TiledX* x;
  const uint8_t* w;
  const void *scales, *biases;
  int scale_type, N, K, bits, group;
  const float* bias;
  float* out;
  int per_unit;  // tiles of 16 outputs per pool unit
};

// A 5-bit row (MLX: value k at bits [5k, 5k + 5) of the row's bytes, 8 values in every 5
// bytes) as one byte per value, in order, 64 values (40 bytes) at a time: each 64-bit lane
// gets the 8 bytes from its 5-byte chunk on (vpermb), and vpmultishiftqb picks value j at
// bit 5j of the lane.
BRISK_AMX void unpack5_row(const uint8_t* src, int K, uint8_t* dst) {
  alignas(64) int8_t from[64], shift[64];
  for (int c = 0; c < 8; ++c)
    for (int j = 0; j < 8; ++j) from[8 * c + j] = int8_t(5 * c + j), shift[8 * c + j] = int8_t(5 * j);
  const __m512i gather = _mm512_load_si512(from), offsets = _mm512_load_si512(shift), mask = _mm512_set1_epi8(31);
  for (int k = 0; k < K; k += 64) {
    const int values = std::min(64, K - k);  // 64, or 32 for an odd last block
    const __m512i raw = _mm512_maskz_loadu_epi8((__mmask64(1) << (values * 5 / 8)) - 1, src + k * 5 / 8);
    const __m512i bytes = _mm512_permutexvar_epi8(gather, raw);
    const __m512i unpacked = _mm512_and_si512(_mm512_multishift_epi64_epi8(offsets, bytes), mask);
    _mm512_mask_storeu_epi8(dst + k, values == 64 ? ~__mmask64(0) : (__mmask64(1) << values) - 1, unpacked);
  }
}

// The 16 weight rows from n0, one byte per value: row r of block b at panel + r * K + 32 b
// (4-bit rows as evens, then odds); rows past N are zero.
BRISK_AMX void unpack_rows(const Job& job, int n0, uint8_t* panel) {
  const int K = job.K;
  const int64_t row_bytes = int64_t(K) * job.bits / 8;
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), second = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  for (int r = 0; r < kTile; ++r) {
    uint8_t* dst = panel + int64_t(r) * K;
    if (n0 + r >= job.N) {
      std::memset(dst, 0, K);
      continue;
    }
    const uint8_t* src = job.w + (n0 + r) * row_bytes;
    if (job.bits == 8) {
      std::memcpy(dst, src, K);
      continue;
    }
    if (job.bits == 5) {
      unpack5_row(src, K, dst);
      continue;
    }
    for (int k = 0; k < K; k += 128) {  // 4 blocks: 64 packed bytes (a masked load for the last 1-3)
      const int blocks = std::min(4, (K - k) / kBlock);
      const __mmask64 valid = blocks == 4 ? ~__mmask64(0) : (__mmask64(1) << (16 * blocks)) - 1;
      const __m512i raw = _mm512_maskz_loadu_epi8(valid, src + k / 2);
      const __m512i lo = _mm512_and_si512(raw, nibble), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
      const __m512i a = _mm512_permutex2var_epi64(lo, first, hi), b = _mm512_permutex2var_epi64(lo, second, hi);
      _mm512_mask_storeu_epi8(dst + k, blocks >= 2 ? ~__mmask64(0) : (__mmask64(1) << 32) - 1, a);
      if (blocks > 2) _mm512_mask_storeu_epi8(dst + k + 64, blocks == 4 ? ~__mmask64(0) : (__mmask64(1) << 32) - 1, b);
    }
  }
}

// The 16 rows' group scales (or biases) as float32, row r's at rows + r * groups.
BRISK_AMX void tile_scales(const Job& job, int n0, const void* source, float* rows) {
  const int groups = job.K / job.group;
  for (int r = 0; r < kTile; ++r) {
    float* dst = rows + r * groups;
    if (n0 + r >= job.N) {
      std::fill_n(dst, groups, 0.f);
      continue;
    }
    const int64_t at = int64_t(n0 + r) * groups;
    if (job.scale_type == 0) {
      std::memcpy(dst, static_cast<const float*>(source) + at, groups * sizeof(float));
      continue;
    }
    const uint16_t* half = static_cast<const uint16_t*>(source) + at;
    for (int g = 0; g < groups; g += 16) {
      const __mmask16 valid = groups - g >= 16 ? __mmask16(0xffff) : __mmask16((1u << (groups - g)) - 1);
      const __m256i raw = _mm256_maskz_loadu_epi16(valid, half + g);
      const __m512 value = job.scale_type == 1 ? _mm512_cvtph_ps(raw)
                                               : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
      _mm512_mask_storeu_ps(dst + g, valid, value);
    }
  }
}

// One block's integer sums (two tiles stored in turn) into the 16 outputs' accumulators.
BRISK_AMX inline void accumulate(const int32_t* hi, const int32_t* lo, const float* scale, int groups, int g, __m512 d,
                                 __m512 acc[kTile]) {
  for (int r = 0; r < kTile; ++r) {
    const __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(hi + r * kTile), 7), _mm512_load_si512(lo + r * kTile));
    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(_mm512_set1_ps(scale[r * groups + g]), d), acc[r]);
  }
}

#define BRISK_TILE_BLOCK(HI, LO, b, store)                           \
  do {                                                              \
    _tile_loadd(TILE_W, panel + (b) * kBlock, K);                   \
    _tile_loadd(TILE_HI, x.hi(t, (b)), 4 * kTile);                  \
    _tile_loadd(TILE_LO, x.hi(t, (b)) + 512, 4 * kTile);            \
    _tile_zero(HI);                                                 \
    _tile_zero(LO);                                                 \
    _tile_dpbusd(HI, TILE_W, TILE_HI);                              \
    _tile_dpbusd(LO, TILE_W, TILE_LO);                              \
    _tile_stored(HI, (store), 4 * kTile);                           \
    _tile_stored(LO, (store) + kTile * kTile, 4 * kTile);           \
  } while (0)

// One tile of 16 outputs: its weights unpacked (16 rows x K bytes) and its scales and
// biases as float32 (16 rows x groups each).
struct Panel {
  uint8_t* bytes;
  float *scale, *offset;
  int n0;
};

BRISK_AMX void prepare_panel(const Job& job, const Panel& p) {
  unpack_rows(job, p.n0, p.bytes);
  tile_scales(job, p.n0, job.scales, p.scale);
  tile_scales(job, p.n0, job.biases, p.offset);
}

// The panel's 16 outputs for x's rows [16t, 16t + 16).
BRISK_AMX void output_tile(const Job& job, const Panel& p, int t) {
  const TiledX& x = *job.x;
  const int K = job.K, blocks = x.blocks, groups = x.groups, per_group = job.group / kBlock, n0 = p.n0;
  const uint8_t* panel = p.bytes;
  alignas(64) int32_t stored[2][2 * kTile * kTile];  // a block's hi and lo sums, even and odd blocks
  const int columns = std::min(kTile, job.N - n0);
  __m512 acc[kTile];  // output r: lanes over the tile's 16 rows of x
  for (int r = 0; r < kTile; ++r) acc[r] = _mm512_setzero_ps();
  // A software pipeline: block b's tiles run while block b - 1's sums are accumulated (a
  // load right after a tile store would wait for it).
  BRISK_TILE_BLOCK(TILE_SUM_HI0, TILE_SUM_LO0, 0, stored[0]);
  for (int b = 1; b <= blocks; ++b) {
    if (b < blocks) {
      if (b % 2) BRISK_TILE_BLOCK(TILE_SUM_HI1, TILE_SUM_LO1, b, stored[1]);
      else BRISK_TILE_BLOCK(TILE_SUM_HI0, TILE_SUM_LO0, b, stored[0]);
    }
    const int32_t* done = stored[(b - 1) % 2];
    accumulate(done, done + kTile * kTile, p.scale, groups, (b - 1) / per_group, _mm512_loadu_ps(x.d_of(t, b - 1)), acc);
  }
  for (int g = 0; g < groups; ++g) {  // outputs inner: 16 independent chains, not one long one
    const __m512 sums = _mm512_loadu_ps(x.sums_of(t, g));
    for (int r = 0; r < kTile; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(p.offset[r * groups + g]), sums, acc[r]);
  }
  const int rows = std::min(kTile, x.M - t * kTile);
  for (int r = 0; r < columns; ++r) {
    const __m512 y = job.bias ? _mm512_add_ps(acc[r], _mm512_set1_ps(job.bias[n0 + r])) : acc[r];
    alignas(64) float column[kTile];
    _mm512_store_ps(column, y);
    for (int m = 0; m < rows; ++m) job.out[int64_t(t * kTile + m) * job.N + n0 + r] = column[m];
  }
}
#undef BRISK_TILE_BLOCK

BRISK_AMX void run_unit(void* context, int unit) {
  const Job& job = *static_cast<const Job*>(context);
  const int first = unit * job.per_unit, last = std::min((job.N + kTile - 1) / kTile, first + job.per_unit);
  if (first >= last) return;
  const int groups = job.K / job.group;
  // A few panels at a time meet each tile of x in turn: x's tiles for all of K (1 KB a block)
  // are read once per few panels from L2, not once per panel from further out.
  thread_local std::vector<uint8_t> bytes;
  thread_local std::vector<float> scales;
  bytes.resize(int64_t(kPanels) * kTile * job.K);
  scales.resize(int64_t(kPanels) * 2 * kTile * groups);
  configure_tiles();
  for (int tile = first; tile < last; tile += kPanels) {
    Panel panels[kPanels];
    const int count = std::min(kPanels, last - tile);
    for (int i = 0; i < count; ++i) {
      float* s = scales.data() + int64_t(i) * 2 * kTile * groups;
      panels[i] = {bytes.data() + int64_t(i) * kTile * job.K, s, s + kTile * groups, (tile + i) * kTile};
      prepare_panel(job, panels[i]);
    }
    for (int t = 0; t < job.x->tiles; ++t)
      for (int i = 0; i < count; ++i) output_tile(job, panels[i], t);
  }
  _tile_release();
}
#endif

}  // namespace

extern "C" {

// 1 when this CPU and OS run AMX tiles (the process asks Linux for them on the first call).
int brisk_amx_available() {
#ifdef BRISK_AMX_BUILD
  return has_amx() ? 1 : 0;
#else
  return 0;
#endif
}

// y (M x N) = x (M x K) @ dequantize(w).T + bias on AMX: 0 done, 1 declined (no AMX here,
// bits other than 4, 5 and 8, groups other than 32 and 64).
int brisk_amx_quantized_matmul(const float* x, const uint32_t* w, const void* scales, const void* biases,
                               int scale_type, const float* bias, float* out, int M, int K, int N, int bits,
                               int group, int threads) {
#ifdef BRISK_AMX_BUILD
  if (!has_amx() || (bits != 4 && bits != 5 && bits != 8) || (group != 32 && group != 64) || K % group || M < 1 ||
      N < 1)
    return 1;
  thread_local TiledX tiled;  // reused: fresh pages would fault on every call
  tiled.M = M, tiled.K = K, tiled.bits = bits, tiled.group = group, tiled.x = x;
  tiled.tiles = (M + kTile - 1) / kTile, tiled.blocks = K / kBlock, tiled.groups = K / group;
  // Full tiles are written whole by tile_rows; only a last, partial tile needs zero rows.
  tiled.bytes.resize(int64_t(tiled.tiles) * tiled.blocks * 1024);
  if (M % kTile) std::fill_n(tiled.bytes.data() + int64_t(tiled.tiles - 1) * tiled.blocks * 1024, tiled.blocks * 1024, 0);
  tiled.d.assign(int64_t(tiled.tiles) * tiled.blocks * kTile, 0.f);
  tiled.sums.assign(int64_t(tiled.tiles) * tiled.groups * kTile, 0.f);
  brisk_parallel_for(tiled.tiles, threads, tile_rows_unit, &tiled);
  const int tiles = (N + kTile - 1) / kTile, units = std::max(1, std::min(threads, tiles));
  // Contiguous stretches of the weight per thread: the hardware prefetcher follows each.
  Job job{&tiled, reinterpret_cast<const uint8_t*>(w), scales, biases, scale_type, N, K, bits, group, bias, out,
          (tiles + units - 1) / units};
  brisk_parallel_for(units, units, run_unit, &job);
  return 0;
#else
  (void)x, (void)w, (void)scales, (void)biases, (void)scale_type, (void)bias, (void)out;
  (void)M, (void)K, (void)N, (void)bits, (void)group, (void)threads;
  return 1;
#endif
}

int brisk_amx_matmul_version() { return 1; }

}  // extern "C"
