// SpecPrefill's importance of prompt tokens for one block of query rows at one layer
// (engine/accel/specprefill/scoring.py): per head, softmax over the keys each row saw,
// average-pooled along the keys of a slice, then the maximum over heads.
//
// MLX's CPU softmax costs ~13 ns an element (its scalar exp), and the scoring pushes 136 rows x
// all prompt keys x every query head x every layer through it: ~6 of the ~8 s a Qwen-0.5B draft
// spent scoring an 8K prompt. Here each (head, row) is three passes over a row that stays in
// cache: its maximum, the shared vectorized exp with the sum, and the pooled window into the
// running maximum over heads. The product q.kT that makes the logits stays MLX's (the BLAS).
// Built into the MLX primitives module (mlx_primitives/primitives.cpp).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "vector_exp.h"

extern "C" void brisk_parallel_for(int units, int threads, void (*task)(void*, int), void* context);

namespace {

constexpr float kLog2e = 1.4426950408889634f;

struct Job {
  const float* logits;  // (heads, rows, seen)
  float* out;           // (rows, end - start)
  int heads, rows, kernel;
  int64_t seen, visible_first, start, end;
};

// The largest of x[0 .. n), or NaN when any of them is NaN (the vector max and std::max would
// each drop it, at lanes that depend on where it sits).
float row_max(const float* x, int64_t n) {
  int64_t i = 0;
  float best = -INFINITY;
  bool nan = false;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 m = _mm256_set1_ps(-INFINITY), unordered = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    m = _mm256_max_ps(m, v);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  nan = _mm256_movemask_ps(unordered) != 0;
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  for (float lane : lanes) best = std::max(best, lane);
#endif
  for (; i < n; ++i) {
    nan = nan || std::isnan(x[i]);
    best = std::max(best, x[i]);
  }
  return nan ? NAN : best;
}

// out[j] = max(out[j], scale * sum of padded[j .. j + kernel)) for j < n.
void pool_into_max(const float* padded, int64_t n, int kernel, float scale, float* out) {
  int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 s = _mm256_set1_ps(scale);
  for (; j + 8 <= n; j += 8) {
    __m256 w = _mm256_loadu_ps(padded + j);
    for (int t = 1; t < kernel; ++t) w = _mm256_add_ps(w, _mm256_loadu_ps(padded + j + t));
    _mm256_storeu_ps(out + j, _mm256_max_ps(_mm256_loadu_ps(out + j), _mm256_mul_ps(w, s)));
  }
#endif
  for (; j < n; ++j) {
    float w = 0.f;
    for (int t = 0; t < kernel; ++t) w += padded[j + t];
    out[j] = std::max(out[j], w * scale);
  }
}

void run_row(void* context, int r) {
  const Job& job = *static_cast<const Job*>(context);
  const int pad = job.kernel / 2;
  const int64_t n = job.end - job.start;
  const int64_t visible = std::min(job.seen, job.visible_first + r);
  float* out = job.out + r * n;
  std::fill(out, out + n, 0.f);
  // exps of key i at buffer[pad + i]; the pad before and after the slice reads as zeros
  thread_local std::vector<float> buffer;
  buffer.resize(size_t(job.seen + 2 * pad));
  float* e = buffer.data() + pad;
  for (int h = 0; h < job.heads; ++h) {
    const float* x = job.logits + (int64_t(h) * job.rows + r) * job.seen;
    const float max = row_max(x, visible);
    if (!std::isfinite(max)) {
      // a NaN, +inf or only -inf among the keys it saw: this head's softmax is NaN (MLX's ops
      // say so too), and so is the maximum over heads; the caller declines such scores
      std::fill(out, out + n, NAN);
      return;
    }
    const double total = brisk::exp2_weights(x, visible, max, kLog2e, e);
    // the pool counts zeros outside [start, end) and past the keys this row saw
    std::fill(e + job.start - pad, e + job.start, 0.f);
    std::fill(e + std::min(visible, job.end), e + job.end + pad, 0.f);
    pool_into_max(e + job.start - pad, n, job.kernel, float(1.0 / (total * job.kernel)), out);
  }
}

}  // namespace

extern "C" {

// out (rows, end - start)[r, j] = max over heads of the average over the `kernel` keys centred
// on key start + j (zeros outside [start, end)) of softmax(logits[h, r, :visible]), where row r
// saw visible = min(seen, visible_first + r) >= 1 keys; logits (heads, rows, seen) are already
// scaled. A row is NaN where a head's softmax is (a NaN, +inf or no finite logit among its keys).
int brisk_pooled_attention_max(const float* logits, int heads, int rows, int64_t seen, int64_t visible_first,
                               int64_t start, int64_t end, int kernel, float* out, int threads) {
  if (heads < 1 || rows < 0 || visible_first < 1 || kernel < 1 || kernel % 2 == 0 || start < 0 || end < start ||
      end > seen)
    return 1;
  Job job{logits, out, heads, rows, kernel, seen, visible_first, start, end};
  brisk_parallel_for(rows, threads, run_row, &job);
  return 0;
}
}
