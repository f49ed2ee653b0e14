// A bf16 linear y = x W^T (+ b) on the CPU, over W prepacked in pairs along K (the layout AVX512-BF16's
// dot-product instruction reads), products exact and accumulated in fp32, the result rounded once to bf16.
// Built and loaded by bf16_linear_cpu.py (plain C ABI: no torch headers). Its twin is the oneDNN linear it
// replaces (`dspark_core.packed_linear`), equal to it within one bf16 rounding.
//
// Why a kernel: at the few rows of a decode or verify step a linear reads its weight once and does little else,
// so its cost is memory bandwidth plus the call. oneDNN's prepacked bf16 matmul reaches 8-18 GB/s at one row on
// AMD Zen 4 (SmolLM2's 576 x 576 projection: 54 us), this loop 22-27 GB/s (32 us); at hundreds of rows (a
// prefill) the two are within 10% of each other. Each output is one accumulator running over K in the same
// order whatever M is, so a row's result never depends on how many rows are multiplied with it (a verify step's
// logits equal a plain step's bit for bit), which is why the kernel serves every M rather than the few rows only.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "bf16.h"
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

using dspark_bf16::narrow;
using dspark_bf16::widen;

constexpr int64_t LANES = 16;  // output columns per packed block: one zmm of fp32 accumulators
constexpr int64_t NB = 4;      // blocks per task: 64 columns, a task's weights (64 x K) stay in L2 across passes
constexpr int64_t MB = 6;      // rows per pass: NB * MB = 24 accumulators of the 32 zmm registers

#if defined(__AVX512BF16__)
template <int M>
void tile(const uint16_t* x, int64_t xs, const uint16_t* wp, int64_t K2, int64_t nblocks, const float* bias,
          uint16_t* y, int64_t ys, int64_t n0, int64_t N) {
  __m512 acc[M][NB];
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_setzero_ps();
  const int64_t block = K2 * 2 * LANES;  // bf16 elements per packed block
  for (int64_t k2 = 0; k2 < K2; ++k2) {
    __m512bh w[NB];
    for (int b = 0; b < NB; ++b)
      w[b] = b < nblocks ? (__m512bh)_mm512_loadu_si512(wp + b * block + k2 * 2 * LANES)
                         : (__m512bh)_mm512_setzero_si512();
    for (int m = 0; m < M; ++m) {
      int32_t pair;  // x[m, 2 k2], x[m, 2 k2 + 1], broadcast to every lane
      std::memcpy(&pair, x + m * xs + 2 * k2, sizeof pair);
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
      for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_dpbf16_ps(acc[m][b], xv, w[b]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t col = n0 + b * LANES;
      const int64_t valid = std::min<int64_t>(LANES, N - col);
      const __mmask16 mask = (__mmask16)((1u << valid) - 1u);
      __m512 v = acc[m][b];
      if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, bias + col));
      _mm256_mask_storeu_epi16(y + m * ys + col, mask, (__m256i)_mm512_cvtneps_pbh(v));
    }
}

void task_rows(const uint16_t* x, int64_t xs, const uint16_t* wp, int64_t K2, int64_t nblocks, const float* bias,
               uint16_t* y, int64_t ys, int64_t n0, int64_t N, int64_t M) {
  for (int64_t m0 = 0; m0 < M; m0 += MB) {
    const uint16_t* xm = x + m0 * xs;
    uint16_t* ym = y + m0 * ys;
    switch (std::min<int64_t>(MB, M - m0)) {
      case 6: tile<6>(xm, xs, wp, K2, nblocks, bias, ym, ys, n0, N); break;
      case 5: tile<5>(xm, xs, wp, K2, nblocks, bias, ym, ys, n0, N); break;
      case 4: tile<4>(xm, xs, wp, K2, nblocks, bias, ym, ys, n0, N); break;
      case 3: tile<3>(xm, xs, wp, K2, nblocks, bias, ym, ys, n0, N); break;
      case 2: tile<2>(xm, xs, wp, K2, nblocks, bias, ym, ys, n0, N); break;
      default: tile<1>(xm, xs, wp, K2, nblocks, bias, ym, ys, n0, N); break;
    }
  }
}
#else
// The loops every CPU runs (the dispatch keeps oneDNN there; tested beside the native build): the same pairs in
// the same order, each pair's two products summed into the accumulator.
void task_rows(const uint16_t* x, int64_t xs, const uint16_t* wp, int64_t K2, int64_t nblocks, const float* bias,
               uint16_t* y, int64_t ys, int64_t n0, int64_t N, int64_t M) {
  const int64_t block = K2 * 2 * LANES;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < nblocks; ++b) {
      float acc[LANES] = {};
      const uint16_t* w = wp + b * block;
      for (int64_t k2 = 0; k2 < K2; ++k2) {
        const float x0 = widen(x[m * xs + 2 * k2]), x1 = widen(x[m * xs + 2 * k2 + 1]);
        for (int64_t l = 0; l < LANES; ++l)
          acc[l] += x1 * widen(w[(k2 * LANES + l) * 2 + 1]) + x0 * widen(w[(k2 * LANES + l) * 2]);
      }
      for (int64_t l = 0; l < LANES && n0 + b * LANES + l < N; ++l) {
        const int64_t col = n0 + b * LANES + l;
        y[m * ys + col] = narrow(acc[l] + (bias ? bias[col] : 0.f));
      }
    }
}
#endif

}  // namespace

extern "C" {

// 1 where this build has the AVX512-BF16 paths, 0 where it runs the portable loops.
int dspark_bf16_linear_native(void) {
#if defined(__AVX512BF16__)
  return 1;
#else
  return 0;
#endif
}

// w [N, K] bf16 row-major, K even -> wp [ceil(N / 16), K / 2, 16, 2]: block b holds columns 16 b .. 16 b + 15,
// each K pair of a column adjacent; the last block's missing columns are zero.
void dspark_bf16_linear_pack(const uint16_t* w, uint16_t* wp, int64_t N, int64_t K) {
  const int64_t blocks = (N + LANES - 1) / LANES, K2 = K / 2;
  for (int64_t blk = 0; blk < blocks; ++blk)
    for (int64_t k2 = 0; k2 < K2; ++k2)
      for (int64_t l = 0; l < LANES; ++l) {
        const int64_t n = blk * LANES + l;
        uint16_t* o = wp + ((blk * K2 + k2) * LANES + l) * 2;
        o[0] = n < N ? w[n * K + 2 * k2] : 0;
        o[1] = n < N ? w[n * K + 2 * k2 + 1] : 0;
      }
}

// x [M, K] bf16 contiguous, wp as packed above, bias fp32 [N] or null, y [M, N] bf16 contiguous. Tasks of 64
// columns split over `threads` OpenMP threads (torch's own runtime).
void dspark_bf16_linear(const uint16_t* x, const uint16_t* wp, const float* bias, uint16_t* y, int64_t M, int64_t N,
                        int64_t K, int threads) {
  const int64_t xs = K, ys = N;
  const int64_t K2 = K / 2, blocks = (N + LANES - 1) / LANES, tasks = (blocks + NB - 1) / NB;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t blk = t * NB;
    task_rows(x, xs, wp + blk * K2 * 2 * LANES, K2, std::min<int64_t>(NB, blocks - blk), bias, y, ys,
              blk * LANES, N, M);
  }
}

}  // extern "C"
