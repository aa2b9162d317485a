// The native kernels against plain scalar references, as a program of its own: run on any
// build of kernels/csrc (tests/kernels/test_kernel_builds.py cross-compiles it for aarch64 and
// runs it under qemu-aarch64, where none of the x86 paths exist). Prints one line per check
// and exits non-zero when any differs.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
int brisk_rms_norm(const float*, const float*, float*, int64_t, int, float);
int brisk_rope(const float*, const int64_t*, float*, int, int, int, int, int, int, float, float, int64_t, const int32_t*,
               int, const float*);
int brisk_swiglu(const float*, const float*, float*, int64_t, int);
int brisk_skinny_matmul(const float*, const float*, const float*, float*, int, int, int, int);
int brisk_quantized_matmul_rows(const float*, const uint32_t*, const void*, const void*, int, const float*, float*, int,
                                int, int, int, int, int, int);
int brisk_quantized_gather(const int32_t*, int, const uint32_t*, const void*, const void*, int, float*, int, int, int,
                           int);
int brisk_attention(const float*, const void*, const void*, int, float*, int, int, int, int, int, int, const int64_t*,
                    const int64_t*, float, int, const float*, int, int);
int brisk_sample_softmax(const float*, int64_t, int, float, const float*, uint32_t*);
int brisk_tiled_available();
int brisk_quantized_matmul_has_integer_x();
int brisk_quantized_matmul_has_vnni();
int brisk_amx_available();
int brisk_float_gemm_available();
}

namespace {

std::mt19937 rng(1234);
int failures = 0;

std::vector<float> randn(size_t n, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Largest |a - b| over max(1, |b|): the kernels sum in their own order.
double worst(const std::vector<float>& got, const std::vector<float>& want) {
  double w = 0;
  for (size_t i = 0; i < want.size(); ++i)
    w = std::max(w, std::fabs(double(got[i]) - want[i]) / std::max(1.0, std::fabs(double(want[i]))));
  return w;
}

// Largest |a - b| over the largest |b|: for x rounded to integers, whose error scales with the row.
double worst_of_largest(const std::vector<float>& got, const std::vector<float>& want) {
  double w = 0, largest = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    w = std::max(w, std::fabs(double(got[i]) - want[i]));
    largest = std::max(largest, std::fabs(double(want[i])));
  }
  return w / largest;
}

void report(const char* name, bool ok, double error) {
  std::printf("%s %s (worst relative error %.2e)\n", ok ? "ok  " : "FAIL", name, error);
  failures += !ok;
}

void check_close(const char* name, int rc, const std::vector<float>& got, const std::vector<float>& want,
                 double tolerance = 2e-4) {
  if (rc != 0) {
    std::printf("FAIL %s (returned %d)\n", name, rc);
    ++failures;
    return;
  }
  const double error = worst(got, want);
  report(name, error <= tolerance, error);
}

uint16_t float_to_half(float f) {  // round to nearest even; the test's values are normal halves
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t sign = (bits >> 16) & 0x8000;
  const int exponent = int((bits >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = bits & 0x7fffff;
  if (exponent <= 0) return uint16_t(sign);
  uint32_t h = sign | (uint32_t(exponent) << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return uint16_t(h);
}

float half_to_float(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  const float magnitude = exponent ? std::ldexp(1.f + mantissa / 1024.f, exponent - 15) : std::ldexp(mantissa / 1024.f, -14);
  return (h & 0x8000) ? -magnitude : magnitude;
}

void check_rms_norm() {
  const int rows = 5, D = 72;
  auto x = randn(rows * D), w = randn(D);
  std::vector<float> got(rows * D), want(rows * D);
  for (int r = 0; r < rows; ++r) {
    double squares = 0;
    for (int d = 0; d < D; ++d) squares += double(x[r * D + d]) * x[r * D + d];
    const double inverse = 1.0 / std::sqrt(squares / D + 1e-5);
    for (int d = 0; d < D; ++d) want[r * D + d] = float(x[r * D + d] * inverse * w[d]);
  }
  check_close("rms_norm", brisk_rms_norm(x.data(), w.data(), got.data(), rows, D, 1e-5f), got, want);
}

void check_rope(int traditional) {
  const int B = 2, H = 3, L = 4, D = 16, dims = 12;
  const float base = 10000.f;
  auto x = randn(size_t(B) * H * L * D);
  const int64_t strides[3] = {int64_t(H) * L * D, int64_t(L) * D, D};
  std::vector<float> got(x.size()), want(x.size());
  const int64_t offset = 7;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int l = 0; l < L; ++l) {
        const float* xr = x.data() + ((b * H + h) * L + l) * D;
        float* yr = want.data() + ((b * H + h) * L + l) * D;
        for (int i = 0; i < dims / 2; ++i) {
          const double theta = double(offset + l) * std::pow(double(base), -double(i) / (dims / 2));
          const int a = traditional ? 2 * i : i, c = traditional ? 2 * i + 1 : i + dims / 2;
          yr[a] = float(xr[a] * std::cos(theta) - xr[c] * std::sin(theta));
          yr[c] = float(xr[a] * std::sin(theta) + xr[c] * std::cos(theta));
        }
        for (int d = dims; d < D; ++d) yr[d] = xr[d];
      }
  const int rc = brisk_rope(x.data(), strides, got.data(), B, H, L, D, dims, traditional, base, 1.f, offset, nullptr, 0,
                            nullptr);
  check_close(traditional ? "rope (traditional)" : "rope", rc, got, want, 1e-4);
}

void check_swiglu() {
  const int n = 1000;
  auto gate = randn(n, 3.f), up = randn(n);
  std::vector<float> got(n), want(n);
  for (int i = 0; i < n; ++i) want[i] = float(gate[i] / (1.0 + std::exp(-double(gate[i]))) * up[i]);
  check_close("swiglu", brisk_swiglu(gate.data(), up.data(), got.data(), n, 2), got, want, 1e-5);
}

void check_skinny_matmul() {
  for (int M : {1, 3, 16}) {
    const int K = 96, N = 37;
    auto x = randn(M * K), w = randn(N * K), bias = randn(N);
    std::vector<float> got(M * N), want(M * N);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        double s = bias[n];
        for (int k = 0; k < K; ++k) s += double(x[m * K + k]) * w[n * K + k];
        want[m * N + n] = float(s);
      }
    char name[64];
    std::snprintf(name, sizeof name, "skinny_matmul M=%d", M);
    check_close(name, brisk_skinny_matmul(x.data(), w.data(), bias.data(), got.data(), M, K, N, 2), got, want);
  }
}

// MLX's affine quantization: each row's K values as one little-endian bit stream of `bits`
// per value, and per group of values a scale and a bias (w = scale * q + bias).
struct Quantized {
  std::vector<uint32_t> packed;
  std::vector<float> scales, biases, dense;  // dense: what the codes stand for, (N, K)
};

// extremes: every code 0 or 2^bits - 1, the products that would overflow an int16 pair sum
// (vpmaddubsw saturates there) if 8-bit weights met x as unsigned bytes.
Quantized quantize(int N, int K, int bits, int group, bool extremes = false) {
  Quantized q;
  const int64_t row_bytes = int64_t(K) * bits / 8;
  std::vector<uint8_t> bytes(size_t(N) * row_bytes, 0);
  std::uniform_int_distribution<int> code(0, (1 << bits) - 1);
  q.scales = randn(size_t(N) * (K / group), 0.02f);
  q.biases = randn(size_t(N) * (K / group), 0.1f);
  q.dense.resize(size_t(N) * K);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      const int c = extremes ? (code(rng) & 1) * ((1 << bits) - 1) : code(rng);
      const int64_t bit = int64_t(k) * bits;
      for (int b = 0; b < bits; ++b)
        if (c >> b & 1) bytes[n * row_bytes + (bit + b) / 8] |= uint8_t(1u << ((bit + b) % 8));
      const int g = n * (K / group) + k / group;
      q.dense[size_t(n) * K + k] = q.scales[g] * float(c) + q.biases[g];
    }
  q.packed.resize(bytes.size() / 4);
  std::memcpy(q.packed.data(), bytes.data(), bytes.size());
  return q;
}

void check_quantized(int bits, int group, int M, bool half_scales, int integer_x, bool extremes = false) {
  const int K = 256, N = 48;
  Quantized q = quantize(N, K, bits, group, extremes);
  std::vector<uint16_t> scales16, biases16;
  if (half_scales) {  // round the scales to float16 first, so the reference reads the same values
    for (auto& s : q.scales) scales16.push_back(float_to_half(s)), s = half_to_float(scales16.back());
    for (auto& b : q.biases) biases16.push_back(float_to_half(b)), b = half_to_float(biases16.back());
  }
  // Dense values from the (possibly rounded) scales and the codes read back from the stream.
  const int64_t row_bytes = int64_t(K) * bits / 8;
  const auto* bytes = reinterpret_cast<const uint8_t*>(q.packed.data());
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      int c = 0;
      for (int b = 0; b < bits; ++b) {
        const int64_t bit = int64_t(k) * bits + b;
        c |= (bytes[n * row_bytes + bit / 8] >> (bit % 8) & 1) << b;
      }
      const int g = n * (K / group) + k / group;
      q.dense[size_t(n) * K + k] = q.scales[g] * float(c) + q.biases[g];
    }
  auto x = randn(size_t(M) * K), bias = randn(N, 0.1f);
  if (extremes)  // all positive and alike: x's high bytes near 127 where the codes are largest
    for (auto& v : x) v = 1.f + 0.01f * std::fabs(v);
  std::vector<float> got(size_t(M) * N), want(size_t(M) * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double s = bias[n];
      for (int k = 0; k < K; ++k) s += double(x[m * K + k]) * q.dense[size_t(n) * K + k];
      want[m * N + n] = float(s);
    }
  const void* scales = half_scales ? static_cast<const void*>(scales16.data()) : q.scales.data();
  const void* biases = half_scales ? static_cast<const void*>(biases16.data()) : q.biases.data();
  const int rc = brisk_quantized_matmul_rows(x.data(), q.packed.data(), scales, biases, half_scales ? 1 : 0, bias.data(),
                                             got.data(), M, K, N, bits, group, 2, integer_x);
  char name[112];
  std::snprintf(name, sizeof name, "quantized_matmul_rows bits=%d group=%d M=%d scales=%s integer_x=%d%s", bits, group,
                M, half_scales ? "f16" : "f32", integer_x, extremes ? " extreme codes" : "");
  if (integer_x && rc == 0) {  // each block of x rounded to 15 bits: ~1e-4 of the largest output
    const double error = worst_of_largest(got, want);
    report(name, error <= 5e-4, error);
  } else {
    check_close(name, rc, got, want);
  }

  if (M == 1 && !integer_x) {
    const int32_t ids[3] = {0, N - 1, 5};
    std::vector<float> rows(3 * size_t(K)), expect(3 * size_t(K));
    for (int i = 0; i < 3; ++i) std::memcpy(&expect[i * K], &q.dense[size_t(ids[i]) * K], K * sizeof(float));
    std::snprintf(name, sizeof name, "quantized_gather bits=%d group=%d scales=%s", bits, group,
                  half_scales ? "f16" : "f32");
    check_close(name,
                brisk_quantized_gather(ids, 3, q.packed.data(), scales, biases, half_scales ? 1 : 0, rows.data(), N,
                                       K, bits, group),
                rows, expect, 1e-6);
  }
}

void check_attention(int L, int S, bool causal, bool half_kv) {
  const int B = 1, Hq = 4, Hkv = 2, D = 64;
  auto q = randn(size_t(B) * Hq * L * D), k = randn(size_t(B) * Hkv * S * D), v = randn(size_t(B) * Hkv * S * D);
  std::vector<uint16_t> k16, v16;
  if (half_kv) {
    for (auto& a : k) k16.push_back(float_to_half(a)), a = half_to_float(k16.back());
    for (auto& a : v) v16.push_back(float_to_half(a)), a = half_to_float(v16.back());
  }
  const int64_t strides[3] = {int64_t(Hkv) * S * D, int64_t(S) * D, D};
  const float scale = 1.f / std::sqrt(float(D));
  std::vector<float> got(q.size()), want(q.size());
  for (int h = 0; h < Hq; ++h) {
    const int kh = h / (Hq / Hkv);
    for (int i = 0; i < L; ++i) {
      const int visible = causal ? S - L + i + 1 : S;  // the chunk's rows sit at the end of the keys
      std::vector<double> logits(visible);
      double top = -INFINITY, total = 0;
      for (int j = 0; j < visible; ++j) {
        double s = 0;
        for (int d = 0; d < D; ++d) s += double(q[(h * L + i) * D + d]) * k[(kh * S + j) * D + d];
        logits[j] = s * scale;
        top = std::max(top, logits[j]);
      }
      for (auto& l : logits) total += (l = std::exp(l - top));
      for (int d = 0; d < D; ++d) {
        double s = 0;
        for (int j = 0; j < visible; ++j) s += logits[j] * v[(kh * S + j) * D + d];
        want[(h * L + i) * D + d] = float(s / total);
      }
    }
  }
  const void* kp = half_kv ? static_cast<const void*>(k16.data()) : k.data();
  const void* vp = half_kv ? static_cast<const void*>(v16.data()) : v.data();
  const int rc = brisk_attention(q.data(), kp, vp, half_kv ? 1 : 0, got.data(), B, Hq, Hkv, L, S, D, strides, strides,
                                 scale, causal ? 1 : 0, nullptr, 2, 0);
  char name[96];
  std::snprintf(name, sizeof name, "attention L=%d S=%d causal=%d kv=%s", L, S, int(causal), half_kv ? "f16" : "f32");
  check_close(name, rc, got, want, 1e-4);
}

void check_sampling() {
  const int rows = 4, V = 50;
  auto logits = randn(size_t(rows) * V, 2.f);
  std::vector<float> uniforms = {0.f, 0.25f, 0.5f, 0.999f};
  std::vector<uint32_t> got(rows);
  const float inv_temperature = 1.f / 0.7f;
  const int rc = brisk_sample_softmax(logits.data(), rows, V, inv_temperature, uniforms.data(), got.data());
  bool ok = rc == 0;
  for (int r = 0; r < rows && ok; ++r) {
    // The drawn token's cumulative interval must hold the target (up to float rounding at its edges).
    double top = -INFINITY, total = 0;
    for (int i = 0; i < V; ++i) top = std::max(top, double(logits[r * V + i]));
    std::vector<double> w(V);
    for (int i = 0; i < V; ++i) total += (w[i] = std::exp((logits[r * V + i] - top) * inv_temperature));
    double below = 0;
    for (uint32_t i = 0; i < got[r]; ++i) below += w[i];
    const double target = uniforms[r] * total, slack = 1e-5 * total;
    ok = got[r] < uint32_t(V) && below <= target + slack && target < below + w[got[r]] + slack;
  }
  report("sample_softmax", ok, 0.0);
}

}  // namespace

int main() {
  std::printf("tiled available: %d, amx available: %d, float_gemm available: %d, integer x: %d, vnni: %d\n",
              brisk_tiled_available(), brisk_amx_available(), brisk_float_gemm_available(),
              brisk_quantized_matmul_has_integer_x(), brisk_quantized_matmul_has_vnni());
  check_rms_norm();
  check_rope(0);
  check_rope(1);
  check_swiglu();
  check_skinny_matmul();
  for (int bits : {4, 5, 6, 8})
    for (int group : {32, 64})
      for (int M : {1, 3, 5})  // 5: a tile of four rows and one alone
        for (bool half_scales : {false, true})
          for (int integer_x : {0, 1, 2}) check_quantized(bits, group, M, half_scales, integer_x);  // 2: AVX2's products
  for (int bits : {4, 5, 6, 8})
    for (int integer_x : {1, 2}) check_quantized(bits, 32, 3, true, integer_x, true);
  for (bool half_kv : {false, true}) {
    check_attention(1, 40, true, half_kv);
    check_attention(5, 300, true, half_kv);
    check_attention(3, 17, false, half_kv);
  }
  check_sampling();
  std::printf("%d failed\n", failures);
  return failures ? 1 : 0;
}
