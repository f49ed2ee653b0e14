// The small elementwise steps of a Llama-family decoder layer in bf16 on the CPU, one call each instead of
// four to eight torch ops: RMSNorm (with the residual add before it), the rotary embedding of q and k, and
// SiLU(gate) * up. Their twins are the eager ops of dspark_core/decoder_forward.py (`_rms_norm`, `_rope`, the
// MLP's `act_fn(gate) * up`), whose Hugging Face numerics these keep: every op rounds to bf16 where Hugging
// Face's does (a product or sum of bf16 values in fp32, rounded once), so the residual add and the rotary are
// bit-identical; the norm's mean of squares and SiLU's exponential are fp32 in another order or ulp, so those
// two agree to within one bf16 rounding. Built and loaded by decoder_pointwise_cpu.py.
//
// Why: at one to sixteen rows each of those torch ops costs 5-20 us of dispatch for a few microseconds of
// arithmetic, about a quarter of a SmolLM2 decode step (section timers, 30 layers).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "bf16.h"

namespace {

using dspark_bf16::narrow;
using dspark_bf16::round_bf16;
using dspark_bf16::widen;

constexpr int64_t kParallelElements = 1 << 16;  // below this, one thread: OpenMP's fork costs more than the work

}  // namespace

extern "C" {

// x [rows, n]; delta [rows, n] or null; sum_out [rows, n] (x + delta, rounded) or null when delta is; normed
// [rows, n] = w * bf16(x' * rsqrt(mean(x'^2) + eps)), x' = x + delta, as Hugging Face's LlamaRMSNorm.
void dspark_add_rms_norm(const uint16_t* x, const uint16_t* delta, const uint16_t* w, uint16_t* sum_out,
                         uint16_t* normed, int64_t rows, int64_t n, float eps) {
  auto row = [&](int64_t r) {
    const uint16_t* xr = x + r * n;
    float sq = 0.f;
    if (delta) {
      const uint16_t* dr = delta + r * n;
      uint16_t* sr = sum_out + r * n;
#pragma omp simd reduction(+ : sq)
      for (int64_t i = 0; i < n; ++i) {
        const float s = round_bf16(widen(xr[i]) + widen(dr[i]));
        sr[i] = narrow(s);
        sq += s * s;
      }
      xr = sr;
    } else {
#pragma omp simd reduction(+ : sq)
      for (int64_t i = 0; i < n; ++i) {
        const float s = widen(xr[i]);
        sq += s * s;
      }
    }
    const float inv = 1.f / std::sqrt(sq / static_cast<float>(n) + eps);
    uint16_t* out = normed + r * n;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = narrow(widen(w[i]) * round_bf16(widen(xr[i]) * inv));
  };
  if (rows * n < kParallelElements) {
    for (int64_t r = 0; r < rows; ++r) row(r);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) row(r);
  }
}

// qkv [R, N, H3, D] contiguous (a fused projection's output); the first `heads` of its H3 heads are rotated:
// out [R, heads, N, D] = x * cos + rotate_half(x) * sin, each product and the sum rounded to bf16 as Hugging
// Face's apply_rotary_pos_emb rounds them; cos, sin [R, N, D].
void dspark_rope(const uint16_t* qkv, const uint16_t* cos, const uint16_t* sin, uint16_t* out, int64_t R,
                 int64_t N, int64_t H3, int64_t heads, int64_t D) {
  const int64_t half = D / 2;
  auto one = [&](int64_t task) {  // task = (r * heads + h) * N + t: one head of one position
    const int64_t t = task % N, h = (task / N) % heads, r = task / (N * heads);
    const uint16_t* x = qkv + ((r * N + t) * H3 + h) * D;
    const uint16_t* c = cos + (r * N + t) * D;
    const uint16_t* s = sin + (r * N + t) * D;
    uint16_t* o = out + task * D;
#pragma omp simd
    for (int64_t d = 0; d < half; ++d)
      o[d] = narrow(round_bf16(widen(x[d]) * widen(c[d])) + round_bf16(-widen(x[d + half]) * widen(s[d])));
#pragma omp simd
    for (int64_t d = half; d < D; ++d)
      o[d] = narrow(round_bf16(widen(x[d]) * widen(c[d])) + round_bf16(widen(x[d - half]) * widen(s[d])));
  };
  const int64_t tasks = R * heads * N;
  if (tasks * D < kParallelElements) {
    for (int64_t task = 0; task < tasks; ++task) one(task);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) one(task);
  }
}

// gate_up [rows, 2 * n] (gate, then up, as `chunk(2, -1)` splits it); out [rows, n] = bf16(silu(gate)) * up.
void dspark_silu_mul(const uint16_t* gate_up, uint16_t* out, int64_t rows, int64_t n) {
  auto row = [&](int64_t r) {
    const uint16_t* g = gate_up + r * 2 * n;
    const uint16_t* u = g + n;
    uint16_t* o = out + r * n;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const float x = widen(g[i]);
      o[i] = narrow(round_bf16(x / (1.f + std::exp(-x))) * widen(u[i]));
    }
  };
  if (rows * n < kParallelElements) {
    for (int64_t r = 0; r < rows; ++r) row(r);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) row(r);
  }
}

}  // extern "C"
