// A draft's per-position distillation terms over a reduced draft vocabulary on the CPU, forward and gradient,
// one row (one block position) at a time while it sits in cache: the cross-entropy against the true next token and
// the L1 distance between the draft's softmax and the target's probabilities. Their twin is
// dspark_core/losses.py (`draft_loss` with `target_log_probs`): F.cross_entropy, softmax, exp, the |p_d - p_t| sum
// and autograd's backward through them. Built and loaded by distill_loss_cpu.py.
//
// Why: at a training step's 896 positions x 8,192 tokens each of those torch ops (and each of their backward ops)
// is a pass over a 29 MB fp32 tensor, about a dozen in all; here it is three passes forward and one backward.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// Row r of the target's log-probabilities as fp32: the row itself, or its bf16 values widened into `scratch`
// first (one shift-and-store loop; widening inside the exponential's loop made that loop 2x slower).
template <bool kBf16>
inline const float* target_row(const void* t, int64_t r, int64_t V, std::vector<float>& scratch) {
  if constexpr (kBf16) {
    const uint16_t* src = static_cast<const uint16_t*>(t) + r * V;
    scratch.resize(V);
    float* dst = scratch.data();
    for (int64_t i = 0; i < V; ++i) {
      const uint32_t u = static_cast<uint32_t>(src[i]) << 16;
      std::memcpy(dst + i, &u, sizeof u);
    }
    return dst;
  }
  return static_cast<const float*>(t) + r * V;
}

template <typename Row>
void each_row(int64_t rows, const Row& row) {  // row(r, scratch): a scratch buffer per thread
#pragma omp parallel
  {
    std::vector<float> scratch;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) row(r, scratch);
  }
}

// z [rows, V] fp32 draft logits; t [rows, V] the target's log-probabilities at the draft's tokens (fp32, or bf16
// when t_bf16), normalised over the target's whole vocabulary; labels [rows] (draft index, or < 0: none).
// Per row: lse = logsumexp(z); ce = lse - z[label] (0 without a label); l1 = sum |p - p_t| + max(0, 1 - sum p_t)
// with p = softmax(z), p_t = exp(t); dot = sum p * sign(p - p_t), what the gradient of l1 needs.
template <bool kBf16>
void forward(const float* z, const void* t, const int64_t* labels, int64_t rows, int64_t V, float* lse, float* ce,
             float* l1, float* dot) {
  each_row(rows, [&](int64_t r, std::vector<float>& scratch) {
    const float* zr = z + r * V;
    const float* tr = target_row<kBf16>(t, r, V, scratch);
    float m = zr[0];  // not -INFINITY: -ffast-math assumes finite values
#pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < V; ++i) m = zr[i] > m ? zr[i] : m;
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < V; ++i) s += std::exp(zr[i] - m);
    const float log_s = std::log(s);
    const float l = m + log_s;
    float dist = 0.f, sdot = 0.f, mass = 0.f;
#pragma omp simd reduction(+ : dist, sdot, mass)
    for (int64_t i = 0; i < V; ++i) {
      const float p = std::exp(zr[i] - l);
      const float pt = std::exp(tr[i]);
      const float d = p - pt;
      const float sign = static_cast<float>((d > 0.f) - (d < 0.f));
      dist += std::fabs(d);
      sdot += p * sign;
      mass += pt;
    }
    lse[r] = l;
    ce[r] = labels[r] >= 0 ? l - zr[labels[r]] : 0.f;
    l1[r] = dist + (1.f - mass > 0.f ? 1.f - mass : 0.f);
    dot[r] = sdot;
  });
}

template <bool kBf16>
void backward(const float* z, const void* t, const int64_t* labels, int64_t rows, int64_t V, const float* lse,
              const float* dot, const float* g_ce, const float* g_l1, float* grad) {
  each_row(rows, [&](int64_t r, std::vector<float>& scratch) {
    const float* zr = z + r * V;
    float* gr = grad + r * V;
    const float* tr = target_row<kBf16>(t, r, V, scratch);
    const float l = lse[r], a = labels[r] >= 0 ? g_ce[r] : 0.f, b = g_l1[r], c = dot[r];  // no label: no CE
#pragma omp simd
    for (int64_t i = 0; i < V; ++i) {
      const float p = std::exp(zr[i] - l);
      const float d = p - std::exp(tr[i]);
      const float sign = static_cast<float>((d > 0.f) - (d < 0.f));
      gr[i] = a * p + b * p * (sign - c);
    }
    if (labels[r] >= 0) gr[labels[r]] -= a;
  });
}

}  // namespace

extern "C" {

void dspark_distill_forward(const float* z, const void* t, int32_t t_bf16, const int64_t* labels, int64_t rows,
                            int64_t V, float* lse, float* ce, float* l1, float* dot) {
  if (t_bf16) forward<true>(z, t, labels, rows, V, lse, ce, l1, dot);
  else forward<false>(z, t, labels, rows, V, lse, ce, l1, dot);
}

// grad [rows, V] = g_ce[r] * (p - onehot(label)) + g_l1[r] * p * (sign(p - p_t) - dot[r]): the gradient of
// sum_r g_ce[r] * ce[r] + g_l1[r] * l1[r] with respect to z, from the forward's lse and dot.
void dspark_distill_backward(const float* z, const void* t, int32_t t_bf16, const int64_t* labels, int64_t rows,
                             int64_t V, const float* lse, const float* dot, const float* g_ce, const float* g_l1,
                             float* grad) {
  if (t_bf16) backward<true>(z, t, labels, rows, V, lse, dot, g_ce, g_l1, grad);
  else backward<false>(z, t, labels, rows, V, lse, dot, g_ce, g_l1, grad);
}

}  // extern "C"
