// RMSNorm and RoPE for float32 on the CPU, each one pass over its rows.
//
// MLX's CPU has no kernel for mx.fast.rms_norm or mx.fast.rope: both fall back to graphs of
// plain ops, about 11 nodes for a norm and 30 for a RoPE. A 30-layer model's decode step then
// holds ~2,500 such nodes at a few microseconds each, more than its 4-bit weights cost to
// read (issue 17). Here each is one node. The arithmetic follows MLX's fallbacks (RoPE angles
// in float32 from float32 positions and inverse frequencies), so results agree to a few ulp.
// Built into the MLX primitives module (mlx_primitives/primitives.cpp).

#include <cmath>
#include <cstdint>
#include <vector>

extern "C" {

// y[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w for `rows` contiguous rows of D floats.
int brisk_rms_norm(const float* x, const float* w, float* y, int64_t rows, int D, float eps) {
  if (rows < 0 || D <= 0) return 1;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * D;
    float* yr = y + r * D;
    float squares = 0.f;
    for (int d = 0; d < D; ++d) squares += xr[d] * xr[d];
    const float inverse = 1.f / std::sqrt(squares / float(D) + eps);
    for (int d = 0; d < D; ++d) yr[d] = (xr[d] * inverse) * w[d];
  }
  return 0;
}

// Rotary embedding of x (B, H, L, D), read through element strides (batch, head, position;
// rows contiguous), into a row-major y. Position of row l of batch entry b: (start + l) * scale,
// start being offsets[b] when `offsets` is given (one per batch entry, or one for all:
// MLX's array offset), else `offset`. The first
// `dims` features rotate: pairs (i, i + dims/2), or (2i, 2i+1) when `traditional`; the rest
// are copied. Inverse frequencies: 1 / freqs[i] when freqs is given, else base^(-i / (dims/2)).
int brisk_rope(const float* x, const int64_t* strides, float* y, int B, int H, int L, int D, int dims,
               int traditional, float base, float scale, int64_t offset, const int32_t* offsets, int offsets_count,
               const float* freqs) {
  if (B < 0 || H < 0 || L < 0 || dims <= 0 || dims % 2 || dims > D) return 1;
  if (offsets && offsets_count != 1 && offsets_count != B) return 1;
  const int half = dims / 2;
  std::vector<float> cosines(size_t(L) * half), sines(size_t(L) * half), inverse(half);
  const float step = std::log(base) / float(half);
  for (int i = 0; i < half; ++i) inverse[i] = freqs ? 1.f / freqs[i] : std::exp(-float(i) * step);
  auto angles = [&](int64_t start) {
    for (int l = 0; l < L; ++l) {
      const float position = float(start + l) * scale;
      for (int i = 0; i < half; ++i) {
        const float theta = position * inverse[i];
        cosines[size_t(l) * half + i] = std::cos(theta);
        sines[size_t(l) * half + i] = std::sin(theta);
      }
    }
  };
  if (!offsets) angles(offset);
  for (int b = 0; b < B; ++b) {
    if (offsets && (b == 0 || offsets_count > 1)) angles(offsets[offsets_count > 1 ? b : 0]);
    for (int h = 0; h < H; ++h)
      for (int l = 0; l < L; ++l) {
        const float* xr = x + b * strides[0] + h * strides[1] + l * strides[2];
        float* yr = y + ((int64_t(b) * H + h) * L + l) * D;
        const float* c = cosines.data() + size_t(l) * half;
        const float* s = sines.data() + size_t(l) * half;
        if (traditional) {
          for (int i = 0; i < half; ++i) {
            const float x1 = xr[2 * i], x2 = xr[2 * i + 1];
            yr[2 * i] = x1 * c[i] - x2 * s[i];
            yr[2 * i + 1] = x1 * s[i] + x2 * c[i];
          }
        } else {
          for (int i = 0; i < half; ++i) {
            const float x1 = xr[i], x2 = xr[i + half];
            yr[i] = x1 * c[i] - x2 * s[i];
            yr[i + half] = x1 * s[i] + x2 * c[i];
          }
        }
        for (int d = dims; d < D; ++d) yr[d] = xr[d];
      }
  }
  return 0;
}

}  // extern "C"
