// The attention of a bf16 decode or verify step on the CPU: a few queries per row (one in a decode step, γ + 1 in a
// verify step), keys and values read in place from the KV slots, products exact (bf16 x bf16 in fp32) and
// accumulated in fp32, as the torch twin dspark_core/decode_attention.py (`decode_attention_torch`) computes them.
// Built and loaded by decode_attention_cpu.py (plain C ABI: no torch headers, so it compiles in about a second).
//
// Why a kernel: the twin widens every key and value to fp32 before two batched products of three query rows
// each; at 16 rows that copy and the small products cost 12-15 ms of a 45-55 ms SmolLM2 step, and torch's SDPA
// at a verify step's 8 queries costs 135 us a layer at one row. Here each (row, KV head) task reads its keys and
// values for all the query heads it serves (AVX512-BF16 dot products where the CPU has them), into fp32
// accumulators kept in registers.
//
// Each query attends to the first `visible` keys of its row and nothing else is read: no mask is added, so a
// query's result depends on its own keys only, never on how many queries, rows or masked slots share the call.
// A verify step's query at position p therefore gives the bits a decode step at p gives (greedy speculative
// decoding stays token for token plain decoding in bf16 too).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "bf16.h"
#include <cmath>
#include <vector>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

using dspark_bf16::narrow;
using dspark_bf16::widen;

// Queries i = 0 .. Q-1 (q + i * D), query i over keys t < n[i]; scores [Q, T] (row i's first n[i] written).
void scores_generic(const uint16_t* q, const uint16_t* k, int64_t ks2, int64_t T, int64_t Q, int64_t D,
                    float scale, const int64_t* n, float* scores, float* row) {
  std::vector<float> qf(Q * D);
  for (int64_t i = 0; i < Q * D; ++i) qf[i] = widen(q[i]);
  for (int64_t t = 0; t < T; ++t) {
    const uint16_t* kr = k + t * ks2;
    for (int64_t d = 0; d < D; ++d) row[d] = widen(kr[d]);
    for (int64_t i = 0; i < Q; ++i) {
      if (t >= n[i]) continue;
      const float* qq = qf.data() + i * D;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t d = 0; d < D; ++d) s += qq[d] * row[d];
      scores[i * T + t] = s * scale;
    }
  }
}

void values_generic(const uint16_t* v, int64_t vs2, int64_t T, int64_t Q, int64_t D, const int64_t* n,
                    const float* probs, float* acc, float* row) {
  std::fill(acc, acc + Q * D, 0.f);
  for (int64_t t = 0; t < T; ++t) {
    const uint16_t* vr = v + t * vs2;
    for (int64_t d = 0; d < D; ++d) row[d] = widen(vr[d]);
    for (int64_t i = 0; i < Q; ++i) {
      if (t >= n[i]) continue;
      const float p = probs[i * T + t];
      float* a = acc + i * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) a[d] += p * row[d];
    }
  }
}

#if defined(__AVX512BF16__)
void scores_bf16(const uint16_t* q, const uint16_t* k, int64_t ks2, int64_t T, int64_t Q, int64_t D, float scale,
                 const int64_t* n, float* scores) {
  for (int64_t t = 0; t < T; ++t) {
    const uint16_t* kr = k + t * ks2;
    for (int64_t i = 0; i < Q; ++i) {
      if (t >= n[i]) continue;
      __m512 s = _mm512_setzero_ps();
      for (int64_t d = 0; d < D; d += 32) {
        const __m512bh kv = (__m512bh)_mm512_loadu_si512(kr + d);
        const __m512bh qv = (__m512bh)_mm512_loadu_si512(q + i * D + d);
        s = _mm512_dpbf16_ps(s, qv, kv);
      }
      scores[i * T + t] = _mm512_reduce_add_ps(s) * scale;
    }
  }
}

void values_bf16_64(const uint16_t* v, int64_t vs2, int64_t T, int64_t Q, const int64_t* n, const float* probs,
                    float* acc) {
  for (int64_t i = 0; i < Q; ++i) {
    const float* p = probs + i * T;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t t = 0; t < n[i]; ++t) {
      const uint16_t* vr = v + t * vs2;
      const __m512 pt = _mm512_set1_ps(p[t]);
      a0 = _mm512_fmadd_ps(pt, _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256((const __m256i*)(vr))), a0);
      a1 = _mm512_fmadd_ps(pt, _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256((const __m256i*)(vr + 16))), a1);
      a2 = _mm512_fmadd_ps(pt, _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256((const __m256i*)(vr + 32))), a2);
      a3 = _mm512_fmadd_ps(pt, _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256((const __m256i*)(vr + 48))), a3);
    }
    float* a = acc + i * 64;
    _mm512_storeu_ps(a, a0);
    _mm512_storeu_ps(a + 16, a1);
    _mm512_storeu_ps(a + 32, a2);
    _mm512_storeu_ps(a + 48, a3);
  }
}
#endif

// Each query's softmax over its own n[i] scores: the order of every sum depends on n[i] alone.
void softmax_rows(float* scores, int64_t Q, int64_t T, const int64_t* n) {
  for (int64_t i = 0; i < Q; ++i) {
    float* s = scores + i * T;
    const int64_t len = n[i];
    float mx = s[0];
    for (int64_t t = 1; t < len; ++t) mx = s[t] > mx ? s[t] : mx;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < len; ++t) {
      s[t] = std::exp(s[t] - mx);
      sum += s[t];
    }
    const float inv = 1.f / sum;
    for (int64_t t = 0; t < len; ++t) s[t] *= inv;
  }
}

}  // namespace

extern "C" {

// 1 where this build has the AVX512-BF16 paths, 0 where it runs the portable loops.
int dspark_decode_attention_native(void) {
#if defined(__AVX512BF16__)
  return 1;
#else
  return 0;
#endif
}

// q [R, KV * G, W, D] bf16 contiguous (W queries per row and head); k, v: bf16 with element strides (s0, s1, s2)
// over [R, KV, T] and unit stride over D; visible [R, W] int64: query w of row r attends to keys 0 .. visible - 1
// (1 <= visible <= T); out [R, KV * G, W, D] bf16. Query head kv * G + g attends with KV head kv (the grouping of
// SDPA's enable_gqa). `threads`: the OpenMP threads (torch's own runtime).
void dspark_decode_attention(const uint16_t* q, const uint16_t* k, const uint16_t* v, const int64_t* visible,
                             uint16_t* out, int64_t R, int64_t KV, int64_t G, int64_t W, int64_t T, int64_t D,
                             int64_t ks0, int64_t ks1, int64_t ks2, int64_t vs0, int64_t vs1, int64_t vs2,
                             float scale, int threads) {
  const int64_t H = KV * G, Q = G * W;  // a task's queries: its G heads' W positions, contiguous in q
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> scores(Q * T), acc(Q * D), row(D);
    std::vector<int64_t> n(Q);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < R * KV; ++task) {
      const int64_t r = task / KV, h = task % KV;
      const uint16_t* qg = q + (r * H + h * G) * W * D;
      const uint16_t* kb = k + r * ks0 + h * ks1;
      const uint16_t* vb = v + r * vs0 + h * vs1;
      for (int64_t i = 0; i < Q; ++i) n[i] = visible[r * W + i % W];
#if defined(__AVX512BF16__)
      if (D % 32 == 0) scores_bf16(qg, kb, ks2, T, Q, D, scale, n.data(), scores.data());
      else
#endif
        scores_generic(qg, kb, ks2, T, Q, D, scale, n.data(), scores.data(), row.data());
      softmax_rows(scores.data(), Q, T, n.data());
#if defined(__AVX512BF16__)
      if (D == 64) values_bf16_64(vb, vs2, T, Q, n.data(), scores.data(), acc.data());
      else
#endif
        values_generic(vb, vs2, T, Q, D, n.data(), scores.data(), acc.data(), row.data());
      uint16_t* o = out + (r * H + h * G) * W * D;
      for (int64_t i = 0; i < Q * D; ++i) o[i] = narrow(acc[i]);
    }
  }
}

}  // extern "C"
