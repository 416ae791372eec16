// Fused softmax attention for XLA:CPU (an XLA FFI custom call), forward and backward.
//
// Why: XLA:CPU writes the [batch, heads, length, length] score matrix to memory between the two
// batched matmuls and the softmax; at short lengths and small heads (d = 16) those products run
// at ~18 GFLOP/s on the 2-core test machine. Here each (batch, head) pair is one task that keeps
// one row block of scores in cache: scores, softmax and the weighted sum of values never leave it.
// The backward is FlashAttention-2's: probabilities are recomputed from the saved row max `m` and
// row sum `l`, with delta = rowsum(dO * O).
//
// Semantics are those of sptlib.kernels.attention.dot_product_attention: q is pre-scaled;
// disallowed scores (padding key, causal, band) are replaced by MASK_VALUE = -1e30 before the
// softmax, so a fully disallowed row attends uniformly to all keys; disallowed scores get no
// gradient. Layouts: q, k, v, o, dq, dk, dv [batch, length, heads, head_dim] (float32),
// key_mask [batch, length] (bool), m, l [batch, heads, length] (float32).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "common.h"
#if defined(__AVX__)
#include <immintrin.h>
#endif
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace sptlib_cpu;  // NOLINT: v8, load8, store8, splat, parallel_for

constexpr float kMaskValue = -1e30f;
constexpr int64_t kCols = 64;  // row stride of score buffers and transposes: length rounded up

// exp(x) for x <= 0, 8 at a time (Cephes expf: x = n ln2 + r, |r| <= ln2 / 2, degree-6
// polynomial, times 2^n); below -87 it is exactly 0, so a disallowed key (score MASK_VALUE, or
// -inf past the length) gets weight exactly 0.
inline v8 exp_nonpos8(v8 x) {
#if defined(__AVX512VL__)
  // vroundps and vscalefps: 2^n without integer conversion, so huge |x| needs no clamp (the
  // lanes below -87 are replaced at the end).
  const v8 xc = x;
  const v8 n = (v8)_mm256_round_ps((__m256)(xc * splat(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  const v8 xc = x < splat(-87.0f) ? splat(-87.0f) : x;
  // Round to nearest by adding and subtracting 1.5 * 2^23 (valid for |value| < 2^22).
  const v8 n = (xc * splat(1.44269504088896341f) + splat(12582912.0f)) - splat(12582912.0f);
#endif
  v8 r = xc - n * splat(0.693359375f);
  r = r + n * splat(2.12194440e-4f);
  v8 p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  const v8 y = p * r * r + r + splat(1.0f);
#if defined(__AVX512VL__)
  const v8 e = (v8)_mm256_scalef_ps((__m256)y, (__m256)n);
#else
  const v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
  v8 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const v8 e = y * scale;
#endif
  return x < splat(-87.0f) ? splat(0.0f) : e;
}

// Max over s[0..n), n a multiple of 8.
inline float row_max(const float* s, int64_t n) {
  v8 m = splat(kMaskValue);
  for (int64_t j = 0; j < n; j += 8) {
    const v8 x = load8(s + j);
    m = x > m ? x : m;
  }
  float out = kMaskValue;
  for (int c = 0; c < 8; ++c) out = std::max(out, m[c]);
  return out;
}

// s[j] = exp(s[j] - shift) for j < n (a multiple of 8); returns their sum.
inline float exp_sum(float* s, int64_t n, float shift) {
  v8 a = splat(0.0f);
  for (int64_t j = 0; j < n; j += 8) {
    const v8 e = exp_nonpos8(load8(s + j) - splat(shift));
    store8(s + j, e);
    a += e;
  }
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// Marks the keys query row s may not see: MASK_VALUE where valid[j] == 0 (padding key) or j is
// outside [lo, hi) (causal / band), and -inf past the length (up to cols, a multiple of 8), so
// the vector loops may run over whole vectors and a fully masked row stays uniform over the
// `length` real keys. `all_valid`: no padding key, the blend is skipped.
inline void apply_mask(float* s, const float* valid, bool all_valid, int64_t length,
                       int64_t cols, int64_t lo, int64_t hi) {
  if (!all_valid)
    for (int64_t j = 0; j < cols; j += 8)
      store8(s + j, load8(valid + j) != splat(0.0f) ? load8(s + j) : splat(kMaskValue));
  std::fill(s, s + std::min(lo, length), kMaskValue);
  if (hi < length) std::fill(s + hi, s + length, kMaskValue);
  std::fill(s + length, s + cols, -INFINITY);
}

struct Shape {
  int64_t batch, length, heads, dim;
  int64_t padded;  // length rounded up to kCols
  int64_t cols;    // length rounded up to 8: the columns the products compute
};

// Which keys query i may see, as [lo, hi) (causal / band) intersected with the key mask later.
inline void key_range(int64_t i, int64_t length, bool causal, int64_t window, int64_t* lo,
                      int64_t* hi) {
  *lo = 0;
  *hi = length;
  if (causal) *hi = i + 1;
  if (window > 0) {
    *lo = std::max<int64_t>(0, i - window);
    if (!causal) *hi = std::min<int64_t>(length, i + window + 1);
  }
}

// Query rows processed together in the row-major products (the value combination and dQ):
// enough independent FMA chains (R x head_dim / 8 accumulators) to hide the FMA latency, few
// enough to stay in registers with the loaded key row and one broadcast.
template <int DT>
constexpr int kGroup =
    DT > 0 && DT % 8 == 0 ? std::max(1, (kVecRegs >= 32 ? 16 : 12) / (DT / 8)) : 1;

// out[r, 0..D) = sum_j w[r * w_stride + j] * M[j, 0..D) over j < length, for r < R.
template <int DT, int R>
inline void combine_group(const float* w, int64_t w_stride, const float* m, int64_t length,
                          float* out) {
  constexpr int C = DT / 8;
  v8 acc[R][C];
  for (auto& row : acc)
    for (auto& a : row) a = splat(0.0f);
  for (int64_t j = 0; j < length; ++j) {
    v8 mj[C];
    for (int c = 0; c < C; ++c) mj[c] = load8(m + j * DT + 8 * c);
    for (int r = 0; r < R; ++r) {
      const v8 wr = splat(w[r * w_stride + j]);
      for (int c = 0; c < C; ++c) acc[r][c] += wr * mj[c];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) store8(out + r * DT + 8 * c, acc[r][c]);
}

// combine_group over `rows` rows (any count), out rows contiguous.
template <int DT>
inline void rows_combine(const float* w, int64_t w_stride, int64_t rows, const float* m,
                         int64_t dim_rt, int64_t length, float* out) {
  if constexpr (DT > 0 && DT % 8 == 0) {
    constexpr int R = kGroup<DT>;
    int64_t r = 0;
    for (; r + R <= rows; r += R)
      combine_group<DT, R>(w + r * w_stride, w_stride, m, length, out + r * DT);
    for (; r < rows; ++r) combine_group<DT, 1>(w + r * w_stride, w_stride, m, length, out + r * DT);
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      float* o = out + r * dim_rt;
      std::fill(o, o + dim_rt, 0.0f);
      for (int64_t j = 0; j < length; ++j) {
        const float wj = w[r * w_stride + j];
        for (int64_t d = 0; d < dim_rt; ++d) o[d] += wj * m[j * dim_rt + d];
      }
    }
  }
}

#if defined(__AVX__)
// Transposes the 8 x 8 block r[0..8) in registers.
inline void transpose8(v8 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps((__m256)r[2 * i], (__m256)r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps((__m256)r[2 * i], (__m256)r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = (v8)_mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = (v8)_mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}
#endif

// t[c * t_stride + r] = a[r * a_stride + c] for r < rows, c < cols: 8 x 8 blocks transposed in
// registers where AVX is available, the remainder one value at a time.
inline void transpose_copy(const float* a, int64_t a_stride, int64_t rows, int64_t cols, float* t,
                           int64_t t_stride) {
  int64_t r = 0;
#if defined(__AVX__)
  for (; r + 8 <= rows; r += 8)
    for (int64_t c = 0; c + 8 <= cols; c += 8) {
      v8 blk[8];
      for (int u = 0; u < 8; ++u) blk[u] = load8(a + (r + u) * a_stride + c);
      transpose8(blk);
      for (int u = 0; u < 8; ++u) store8(t + (c + u) * t_stride + r, blk[u]);
    }
  for (int64_t i = 0; i < r; ++i)  // the columns past the 8-blocks of those rows
    for (int64_t c = cols / 8 * 8; c < cols; ++c) t[c * t_stride + i] = a[i * a_stride + c];
#endif
  for (; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * t_stride + r] = a[r * a_stride + c];
}

// Copies head h of batch element b out of [batch, length, heads, dim]: rows [cols, dim]
// (row-major, zero past `length`) and, if `cols` is set, the transpose [dim, padded] (zero past
// `length`).
template <int DT>
void gather(const float* src, const Shape& sh, int64_t b, int64_t h, float* rows, float* cols) {
  const int64_t D = DT ? DT : sh.dim, L = sh.length, P = sh.padded;
  const int64_t stride = sh.heads * D;
  const float* base = src + (b * L * sh.heads + h) * D;
  if (rows) {
    for (int64_t i = 0; i < L; ++i)
      std::copy(base + i * stride, base + i * stride + D, rows + i * D);  // inlined at fixed D
    std::fill(rows + L * D, rows + sh.cols * D, 0.0f);
  }
  if (!cols) return;
  transpose_copy(base, stride, L, D, cols, P);
  for (int64_t d = 0; d < D; ++d) std::fill(cols + d * P + L, cols + (d + 1) * P, 0.0f);
}

// The inverse of gather() from rows [length, dim] or, with `transposed`, from [dim, padded].
template <int DT>
void scatter(const float* src, bool transposed, const Shape& sh, int64_t b, int64_t h,
             float* dst) {
  const int64_t D = DT ? DT : sh.dim, L = sh.length, P = sh.padded;
  const int64_t stride = sh.heads * D;
  float* base = dst + (b * L * sh.heads + h) * D;
  if (!transposed) {
    for (int64_t i = 0; i < L; ++i) std::copy(src + i * D, src + (i + 1) * D, base + i * stride);
    return;
  }
  transpose_copy(src, P, D, L, base, stride);
}

// The key mask of batch element b as floats (1 = real key, 0 = padding), zero past the length
// up to sh.cols; *all_valid: no padding key.
inline std::vector<float> key_valid(const bool* mask, const Shape& sh, int64_t b,
                                    bool* all_valid) {
  std::vector<float> valid(sh.cols, 0.0f);
  *all_valid = true;
  for (int64_t j = 0; j < sh.length; ++j) {
    valid[j] = mask[b * sh.length + j] ? 1.0f : 0.0f;
    *all_valid = *all_valid && mask[b * sh.length + j];
  }
  return valid;
}

// Thread-local scratch, grown on demand and never zeroed: take(n) hands out n floats, 64-byte
// aligned. Saves the per-task allocations (and their page faults) of the larger buffers.
class Scratch {
 public:
  explicit Scratch(int64_t total) {
    thread_local std::vector<float> buffer;
    if (static_cast<int64_t>(buffer.size()) < total + 16) buffer.resize(total + 16);
    next_ = buffer.data() + (16 - reinterpret_cast<uintptr_t>(buffer.data()) / 4 % 16) % 16;
  }
  static int64_t size(int64_t n) { return (n + 15) / 16 * 16; }
  float* take(int64_t n) {
    float* p = next_;
    next_ += size(n);
    return p;
  }

 private:
  float* next_;
};

// Query rows per block: the block's score rows (and in the backward its probabilities and score
// gradients) stay in L2, up to 64 rows (2 x 128 KiB).
inline int64_t block_rows(const Shape& sh) {
  return std::max<int64_t>(8, std::min<int64_t>(64, 32768 / sh.padded)) / 8 * 8;
}

// s[r, 0..cols) = scores of query rows i0 + r, r < rows, against every key, masked by
// apply_mask; qr is Q [cols, D] (zero past the length), kt Kᵀ [D, padded].
inline void block_scores(const float* qr, const float* kt, const float* valid, bool all_valid,
                         const Shape& sh, int64_t i0, int64_t rows, bool causal, int64_t window,
                         float* s) {
  // Rows past the block's end read Q's zero padding; s holds a multiple of 8 rows.
  product_tn<false>(qr + i0 * sh.dim, 1, sh.dim, (rows + 7) / 8 * 8, kt, sh.padded, sh.dim,
                    sh.cols, s, sh.padded);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t lo, hi;
    key_range(i0 + r, sh.length, causal, window, &lo, &hi);
    apply_mask(s + r * sh.padded, valid, all_valid, sh.length, sh.cols, lo, hi);
  }
}

template <int DT>
void forward_head(const float* q, const float* k, const float* v, const bool* mask,
                  const Shape& sh, bool causal, int64_t window, int64_t task, float* o, float* m,
                  float* l) {
  const int64_t b = task / sh.heads, h = task % sh.heads, L = sh.length, P = sh.padded;
  const int64_t D = DT ? DT : sh.dim;
  const int64_t block = block_rows(sh), cols = sh.cols;
  const int64_t C = sh.cols;
  Scratch scratch(Scratch::size(D * P) + 3 * Scratch::size(C * D) + Scratch::size(block * P));
  float *qr = scratch.take(C * D), *kt = scratch.take(D * P), *vr = scratch.take(C * D);
  float *orows = scratch.take(C * D), *s = scratch.take(block * P);
  gather<DT>(q, sh, b, h, qr, nullptr);
  gather<DT>(k, sh, b, h, nullptr, kt);
  gather<DT>(v, sh, b, h, vr, nullptr);
  bool all_valid;
  const std::vector<float> valid = key_valid(mask, sh, b, &all_valid);
  float* m_out = m + (b * sh.heads + h) * L;
  float* l_out = l + (b * sh.heads + h) * L;
  for (int64_t i0 = 0; i0 < L; i0 += block) {
    const int64_t rows = std::min(block, L - i0);
    block_scores(qr, kt, valid.data(), all_valid, sh, i0, rows, causal, window, s);
    for (int64_t r = 0; r < rows; ++r) {
      float* sr = s + r * P;
      m_out[i0 + r] = row_max(sr, cols);
      l_out[i0 + r] = exp_sum(sr, cols, m_out[i0 + r]);
    }
    rows_combine<DT>(s, P, rows, vr, D, L, orows + i0 * D);
    for (int64_t r = 0; r < rows; ++r) {
      const float inv = 1.0f / l_out[i0 + r];
      for (int64_t d = 0; d < D; ++d) orows[(i0 + r) * D + d] *= inv;
    }
  }
  scatter<DT>(orows, false, sh, b, h, o);
}

template <int DT>
void backward_head(const float* q, const float* k, const float* v, const bool* mask,
                   const float* o, const float* m, const float* l, const float* dout,
                   const Shape& sh, bool causal, int64_t window, int64_t task, float* dq,
                   float* dk, float* dv) {
  const int64_t b = task / sh.heads, h = task % sh.heads, L = sh.length, P = sh.padded;
  const int64_t D = DT ? DT : sh.dim;
  const int64_t block = block_rows(sh), cols = sh.cols;
  const int64_t C = cols;
  Scratch scratch(4 * Scratch::size(D * P) + 5 * Scratch::size(C * D) +
                  2 * Scratch::size(block * P));
  float *qr = scratch.take(C * D), *kr = scratch.take(C * D), *kt = scratch.take(D * P);
  float *vt = scratch.take(D * P), *orows = scratch.take(C * D), *dor = scratch.take(C * D);
  float *dqr = scratch.take(C * D), *dkt = scratch.take(D * P), *dvt = scratch.take(D * P);
  float *p = scratch.take(block * P), *ds = scratch.take(block * P);
  std::fill(dkt, dkt + D * P, 0.0f);
  std::fill(dvt, dvt + D * P, 0.0f);
  gather<DT>(q, sh, b, h, qr, nullptr);
  gather<DT>(k, sh, b, h, kr, kt);
  gather<DT>(v, sh, b, h, nullptr, vt);
  gather<DT>(o, sh, b, h, orows, nullptr);
  gather<DT>(dout, sh, b, h, dor, nullptr);
  bool all_valid;
  const std::vector<float> valid = key_valid(mask, sh, b, &all_valid);
  const float* m_in = m + (b * sh.heads + h) * L;
  const float* l_in = l + (b * sh.heads + h) * L;
  for (int64_t i0 = 0; i0 < L; i0 += block) {
    const int64_t rows = std::min(block, L - i0);
    block_scores(qr, kt, valid.data(), all_valid, sh, i0, rows, causal, window, p);
    // dP = dO Vᵀ for the block's rows.
    product_tn<false>(dor + i0 * D, 1, D, (rows + 7) / 8 * 8, vt, P, D, cols, ds, P);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      float* pr = p + r * P;
      float* dsr = ds + r * P;
      float delta = 0.0f;
      for (int64_t d = 0; d < D; ++d) delta += dor[i * D + d] * orows[i * D + d];
      const v8 mx = splat(m_in[i]), inv = splat(1.0f / l_in[i]), dl = splat(delta);
      // p = exp(s - m) / l; ds = p * (dP - delta) at allowed keys. A disallowed score (replaced
      // by MASK_VALUE in the forward) gets no gradient, even in a fully disallowed row where p
      // is uniform; past the length both are 0 (score -inf, valid 0).
      for (int64_t j = 0; j < cols; j += 8) {
        const v8 pj = exp_nonpos8(load8(pr + j) - mx) * inv;
        store8(pr + j, pj);
        const v8 g = pj * (load8(dsr + j) - dl);
        store8(dsr + j, load8(valid.data() + j) != splat(0.0f) ? g : splat(0.0f));
      }
      int64_t lo, hi;
      key_range(i, L, causal, window, &lo, &hi);
      std::fill(dsr, dsr + std::min(lo, L), 0.0f);
      if (hi < L) std::fill(dsr + hi, dsr + L, 0.0f);
    }
    rows_combine<DT>(ds, P, rows, kr, D, L, dqr + i0 * D);
    // dKᵀ and dVᵀ [D, cols], vectorised along keys, accumulated over the blocks.
    product_tn<true>(dor + i0 * D, D, 1, D, p, P, rows, cols, dvt, P);
    product_tn<true>(qr + i0 * D, D, 1, D, ds, P, rows, cols, dkt, P);
  }
  scatter<DT>(dqr, false, sh, b, h, dq);
  scatter<DT>(dkt, true, sh, b, h, dk);
  scatter<DT>(dvt, true, sh, b, h, dv);
}

template <typename F>
void dispatch_dim(int64_t dim, F&& f) {
  switch (dim) {
    case 16: f(std::integral_constant<int, 16>()); break;
    case 32: f(std::integral_constant<int, 32>()); break;
    case 64: f(std::integral_constant<int, 64>()); break;
    case 128: f(std::integral_constant<int, 128>()); break;
    default: f(std::integral_constant<int, 0>());
  }
}

ffi::Error check_shape(const ffi::Buffer<ffi::F32>& q, const ffi::Buffer<ffi::PRED>& mask,
                       Shape* sh) {
  auto dims = q.dimensions();
  if (dims.size() != 4) return ffi::Error::InvalidArgument("q must be [batch, length, heads, dim]");
  sh->batch = dims[0];
  sh->length = dims[1];
  sh->heads = dims[2];
  sh->dim = dims[3];
  sh->padded = (sh->length + kCols - 1) / kCols * kCols;
  sh->cols = (sh->length + 7) / 8 * 8;
  auto md = mask.dimensions();
  if (md.size() != 2 || md[0] != sh->batch || md[1] != sh->length)
    return ffi::Error::InvalidArgument("key_mask must be [batch, length]");
  return ffi::Error::Success();
}

ffi::Error Forward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                   ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::PRED> mask, int64_t causal,
                   int64_t window, ffi::ResultBuffer<ffi::F32> o, ffi::ResultBuffer<ffi::F32> m,
                   ffi::ResultBuffer<ffi::F32> l) {
  Shape sh;
  if (auto err = check_shape(q, mask, &sh); err.failure()) return err;
  dispatch_dim(sh.dim, [&](auto dt) {
    constexpr int DT = decltype(dt)::value;
    parallel_for(pool, sh.batch * sh.heads, [&](int64_t t) {
      forward_head<DT>(q.typed_data(), k.typed_data(), v.typed_data(), mask.typed_data(), sh,
                       causal != 0, window, t, o->typed_data(), m->typed_data(),
                       l->typed_data());
    });
  });
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                    ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::PRED> mask,
                    ffi::Buffer<ffi::F32> o, ffi::Buffer<ffi::F32> m, ffi::Buffer<ffi::F32> l,
                    ffi::Buffer<ffi::F32> dout, int64_t causal, int64_t window,
                    ffi::ResultBuffer<ffi::F32> dq, ffi::ResultBuffer<ffi::F32> dk,
                    ffi::ResultBuffer<ffi::F32> dv) {
  Shape sh;
  if (auto err = check_shape(q, mask, &sh); err.failure()) return err;
  dispatch_dim(sh.dim, [&](auto dt) {
    constexpr int DT = decltype(dt)::value;
    parallel_for(pool, sh.batch * sh.heads, [&](int64_t t) {
      backward_head<DT>(q.typed_data(), k.typed_data(), v.typed_data(), mask.typed_data(),
                        o.typed_data(), m.typed_data(), l.typed_data(), dout.typed_data(), sh,
                        causal != 0, window, t, dq->typed_data(), dk->typed_data(),
                        dv->typed_data());
    });
  });
  return ffi::Error::Success();
}

// Both handlers take q, k, v [B, H, L, D] and the key mask [B, L] first, the causal / window
// attributes after their other operands, and return three f32 buffers (o, m, l or dq, dk, dv).
auto BindQkvMask() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::PRED>>();
}

template <typename Binding>
auto WithMaskAttrsAndThreeResults(Binding b) {
  return std::move(b).template Attr<int64_t>("causal")
      .template Attr<int64_t>("window")
      .template Ret<ffi::Buffer<ffi::F32>>()
      .template Ret<ffi::Buffer<ffi::F32>>()
      .template Ret<ffi::Buffer<ffi::F32>>();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SptlibFusedAttentionFwd, Forward,
                              WithMaskAttrsAndThreeResults(BindQkvMask()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(SptlibFusedAttentionBwd, Backward,
                              WithMaskAttrsAndThreeResults(BindQkvMask()
                                                               .Arg<ffi::Buffer<ffi::F32>>()
                                                               .Arg<ffi::Buffer<ffi::F32>>()
                                                               .Arg<ffi::Buffer<ffi::F32>>()
                                                               .Arg<ffi::Buffer<ffi::F32>>()));
