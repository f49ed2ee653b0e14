// bf16 <-> fp32 for the C++ CPU kernels of this folder (included by each; cpu_build.py hashes it with them).
#pragma once
#include <cstdint>
#include <cstring>

namespace dspark_bf16 {

inline float widen(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t narrow(float f) {  // round to nearest even, as torch's bf16 conversion (finite values)
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float round_bf16(float f) { return widen(narrow(f)); }

}  // namespace dspark_bf16
