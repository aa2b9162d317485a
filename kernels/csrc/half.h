// IEEE float16 bits to float32 without F16C (CPUs without it, arm64 builds): the kernels'
// vector paths use _mm256_cvtph_ps where they can.
#pragma once

#include <cstdint>
#include <cstring>

namespace brisk {

inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000 | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal half: normalize
    int e = -1;
    uint32_t m = mantissa;
    do { ++e; m <<= 1; } while (!(m & 0x400));
    bits = sign | ((112 - e) << 23) | ((m & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace brisk
