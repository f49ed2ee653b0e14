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

// Queries i = 0 .. Q-1 (q + i * D), query i over keys t < n[i] (T: the longest); scores [Q, stride] (row i's first
// n[i] written).
void scores_generic(const uint16_t* q, const uint16_t* k, int64_t ks2, int64_t T, int64_t Q, int64_t D,
                    float scale, const int64_t* n, float* scores, int64_t stride, float* row) {
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
      scores[i * stride + t] = s * scale;
    }
  }
}

void values_generic(const uint16_t* v, int64_t vs2, int64_t T, int64_t Q, int64_t D, const int64_t* n,
                    const float* probs, int64_t stride, float* acc, float* row) {
  std::fill(acc, acc + Q * D, 0.f);
  for (int64_t t = 0; t < T; ++t) {
    const uint16_t* vr = v + t * vs2;
    for (int64_t d = 0; d < D; ++d) row[d] = widen(vr[d]);
    for (int64_t i = 0; i < Q; ++i) {
      if (t >= n[i]) continue;
      const float p = probs[i * stride + t];
      float* a = acc + i * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) a[d] += p * row[d];
    }
  }
}

#if defined(__AVX512BF16__)
constexpr int64_t KEYS = 16;  // keys per transposed block: one zmm of scores

// A task's first n keys, transposed once for all its queries: block b holds pair j (elements 2j, 2j + 1) of keys
// 16 b .. 16 b + 15 at kt[(b * P + j) * 16 + l], missing keys zero. Dot products then run with 16 keys in the lanes
// of one register and no horizontal sum per score.
void transpose_keys(const uint16_t* k, int64_t ks2, int64_t n, int64_t D, uint32_t* kt) {
  const int64_t P = D / 2, blocks = (n + KEYS - 1) / KEYS;
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t l = 0; l < KEYS; ++l) {
      const int64_t t = b * KEYS + l;
      uint32_t* dst = kt + b * P * KEYS + l;
      if (t < n) {
        const uint16_t* src = k + t * ks2;
        for (int64_t j = 0; j < P; ++j) std::memcpy(dst + j * KEYS, src + 2 * j, sizeof(uint32_t));
      } else {
        for (int64_t j = 0; j < P; ++j) dst[j * KEYS] = 0;
      }
    }
}

// Query i's scores over its n[i] keys into scores[i * stride ..], 16 at a time: each score one fp32 accumulator
// over the D / 2 pairs in order, whatever block, query count or key count it is computed with.
void scores_bf16(const uint16_t* q, const uint32_t* kt, int64_t stride, int64_t Q, int64_t D, float scale,
                 const int64_t* n, float* scores) {
  const int64_t P = D / 2;
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < Q; ++i) {
    const uint16_t* qi = q + i * D;
    const int64_t blocks = (n[i] + KEYS - 1) / KEYS;
    float* out = scores + i * stride;
    int64_t b = 0;
    for (; b + 4 <= blocks; b += 4) {  // four blocks at once: four independent chains
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      const uint32_t* base = kt + b * P * KEYS;
      for (int64_t j = 0; j < P; ++j) {
        int32_t pair;
        std::memcpy(&pair, qi + 2 * j, sizeof pair);
        const __m512bh qv = (__m512bh)_mm512_set1_epi32(pair);
        a0 = _mm512_dpbf16_ps(a0, qv, (__m512bh)_mm512_loadu_si512(base + j * KEYS));
        a1 = _mm512_dpbf16_ps(a1, qv, (__m512bh)_mm512_loadu_si512(base + (P + j) * KEYS));
        a2 = _mm512_dpbf16_ps(a2, qv, (__m512bh)_mm512_loadu_si512(base + (2 * P + j) * KEYS));
        a3 = _mm512_dpbf16_ps(a3, qv, (__m512bh)_mm512_loadu_si512(base + (3 * P + j) * KEYS));
      }
      _mm512_storeu_ps(out + b * KEYS, _mm512_mul_ps(a0, sc));
      _mm512_storeu_ps(out + (b + 1) * KEYS, _mm512_mul_ps(a1, sc));
      _mm512_storeu_ps(out + (b + 2) * KEYS, _mm512_mul_ps(a2, sc));
      _mm512_storeu_ps(out + (b + 3) * KEYS, _mm512_mul_ps(a3, sc));
    }
    for (; b < blocks; ++b) {
      __m512 a = _mm512_setzero_ps();
      const uint32_t* base = kt + b * P * KEYS;
      for (int64_t j = 0; j < P; ++j) {
        int32_t pair;
        std::memcpy(&pair, qi + 2 * j, sizeof pair);
        a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_set1_epi32(pair), (__m512bh)_mm512_loadu_si512(base + j * KEYS));
      }
      _mm512_storeu_ps(out + b * KEYS, _mm512_mul_ps(a, sc));
    }
  }
}

void values_bf16_64(const uint16_t* v, int64_t vs2, int64_t stride, int64_t Q, const int64_t* n, const float* probs,
                    float* acc) {
  for (int64_t i = 0; i < Q; ++i) {
    const float* p = probs + i * stride;
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
void softmax_rows(float* scores, int64_t Q, int64_t stride, const int64_t* n) {
  for (int64_t i = 0; i < Q; ++i) {
    float* s = scores + i * stride;
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

// q [R, KV * G, W, D] bf16, contiguous but for its row stride qs0 (W queries per row and head); k, v: bf16 with element strides (s0, s1, s2)
// over [R, KV, T] and unit stride over D; visible [R, W] int64: query w of row r attends to keys 0 .. visible - 1
// (clamped to 1 .. T); out [R, KV * G, W, D] bf16. Query head kv * G + g attends with KV head kv (the grouping of
// SDPA's enable_gqa). `threads`: the OpenMP threads (torch's own runtime).
void dspark_decode_attention(const uint16_t* q, const uint16_t* k, const uint16_t* v, const int64_t* visible,
                             uint16_t* out, int64_t R, int64_t KV, int64_t G, int64_t W, int64_t T, int64_t D,
                             int64_t qs0, int64_t ks0, int64_t ks1, int64_t ks2, int64_t vs0, int64_t vs1,
                             int64_t vs2, float scale, int threads) {
  const int64_t H = KV * G, Q = G * W;  // a task's queries: its G heads' W positions, contiguous in q
#pragma omp parallel num_threads(threads)
  {
    const int64_t stride = (T + 15) / 16 * 16;  // a query's scores, padded to whole blocks of 16 keys
    std::vector<float> scores(Q * stride), acc(Q * D), row(D);
    std::vector<uint32_t> kt(stride * D / 2);
    std::vector<int64_t> n(Q);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < R * KV; ++task) {
      const int64_t r = task / KV, h = task % KV;
      const uint16_t* qg = q + r * qs0 + h * G * W * D;
      const uint16_t* kb = k + r * ks0 + h * ks1;
      const uint16_t* vb = v + r * vs0 + h * vs1;
      int64_t longest = 0;
      for (int64_t i = 0; i < Q; ++i)  // never past the window, never none
        longest = std::max(longest, n[i] = std::min(std::max<int64_t>(visible[r * W + i % W], 1), T));
#if defined(__AVX512BF16__)
      if (D % 32 == 0) {
        transpose_keys(kb, ks2, longest, D, kt.data());
        scores_bf16(qg, kt.data(), stride, Q, D, scale, n.data(), scores.data());
      } else
#endif
        scores_generic(qg, kb, ks2, longest, Q, D, scale, n.data(), scores.data(), stride, row.data());
      softmax_rows(scores.data(), Q, stride, n.data());
#if defined(__AVX512BF16__)
      if (D == 64) values_bf16_64(vb, vs2, stride, Q, n.data(), scores.data(), acc.data());
      else
#endif
        values_generic(vb, vs2, longest, Q, D, n.data(), scores.data(), stride, acc.data(), row.data());
      uint16_t* o = out + (r * H + h * G) * W * D;
      for (int64_t i = 0; i < Q * D; ++i) o[i] = narrow(acc[i]);
    }
  }
}

}  // extern "C"
