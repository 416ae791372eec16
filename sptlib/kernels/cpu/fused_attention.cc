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
#include <vector>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace sptlib_cpu;  // NOLINT: v8, load8, store8, splat, parallel_for

constexpr float kMaskValue = -1e30f;
constexpr int64_t kCols = 64;  // score columns per register block (8 AVX2 vectors)
constexpr int64_t kRows = 8;   // query rows per backward block

// exp(x) for x <= 0, 8 at a time (Cephes expf: x = n ln2 + r, |r| <= ln2 / 2, degree-6
// polynomial, 2^n from the exponent bits); below -87 it is exactly 0, so a disallowed key
// (score MASK_VALUE) gets weight exactly 0.
inline v8 exp_nonpos8(v8 x) {
  const v8 xc = x < splat(-87.0f) ? splat(-87.0f) : x;
  // Round to nearest by adding and subtracting 1.5 * 2^23 (valid for |value| < 2^22).
  const v8 n = (xc * splat(1.44269504088896341f) + splat(12582912.0f)) - splat(12582912.0f);
  v8 r = xc - n * splat(0.693359375f);
  r = r + n * splat(2.12194440e-4f);
  v8 p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  const v8 y = p * r * r + r + splat(1.0f);
  const v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
  v8 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x < splat(-87.0f) ? splat(0.0f) : y * scale;
}

// s[j] = exp(s[j] - shift) for j < n (n a multiple of 8 or the tail done on a padded copy).
inline void exp_shifted(float* s, int64_t n, float shift) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) store8(s + j, exp_nonpos8(load8(s + j) - splat(shift)));
  if (j < n) {
    float tail[8] = {0};
    std::memcpy(tail, s + j, (n - j) * sizeof(float));
    const v8 e = exp_nonpos8(load8(tail) - splat(shift));
    std::memcpy(s + j, &e, (n - j) * sizeof(float));
  }
}

// Max and sum over s[0..n), 8 lanes at a time.
inline float lane_max(const float* s, int64_t n) {
  v8 m = splat(kMaskValue);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const v8 x = load8(s + j);
    m = x > m ? x : m;
  }
  float out = kMaskValue;
  for (int c = 0; c < 8; ++c) out = std::max(out, m[c]);
  for (; j < n; ++j) out = std::max(out, s[j]);
  return out;
}

inline float lane_sum(const float* s, int64_t n) {
  v8 a = splat(0.0f);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) a += load8(s + j);
  float out = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  for (; j < n; ++j) out += s[j];
  return out;
}

// s[j] = MASK_VALUE where key j is not allowed: valid[j] == 0 (padding key) or j outside
// [lo, hi) (causal / band), for j < n.
inline void apply_mask(float* s, const float* valid, int64_t n, int64_t lo, int64_t hi) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    store8(s + j, load8(valid + j) != splat(0.0f) ? load8(s + j) : splat(kMaskValue));
  for (; j < n; ++j) s[j] = valid[j] != 0.0f ? s[j] : kMaskValue;
  std::fill(s, s + std::min(lo, n), kMaskValue);
  if (hi < n) std::fill(s + hi, s + n, kMaskValue);
}

struct Shape {
  int64_t batch, length, heads, dim, padded;  // padded: length rounded up to kCols
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

// s[0..padded) = x[0..D) . Mt[D, padded] (Mt column j = row j of the key-side matrix).
template <int DT>
inline void row_scores(const float* x, const float* mt, int64_t dim_rt, int64_t padded,
                       float* s) {
  const int64_t dim = DT ? DT : dim_rt;
  for (int64_t jb = 0; jb < padded; jb += kCols) {
    v8 acc[kCols / 8];
    for (auto& a : acc) a = splat(0.0f);
    for (int64_t d = 0; d < dim; ++d) {
      const v8 xd = splat(x[d]);
      const float* row = mt + d * padded + jb;
      for (int64_t c = 0; c < kCols / 8; ++c) acc[c] += xd * load8(row + 8 * c);
    }
    for (int64_t c = 0; c < kCols / 8; ++c) store8(s + jb + 8 * c, acc[c]);
  }
}

// Rows of query rows processed together in the products below: enough independent FMA chains
// (R x head_dim / 8) to hide the FMA latency, few enough to stay in 16 vector registers.
template <int DT>
constexpr int kGroup = DT > 0 && DT <= 64 ? 64 / DT : 1;

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

// Key rows j..j+J-1 of dV and dK: dv[j] += sum_r p[r, j] dO[r], dk[j] += sum_r ds[r, j] Q[r].
template <int DT, int J>
inline void key_group(const float* p, const float* ds, int64_t stride, const float* dob,
                      const float* qb, int64_t rows, float* dv, float* dk) {
  constexpr int C = DT / 8;
  v8 av[J][C], ak[J][C];
  for (int u = 0; u < J; ++u)
    for (int c = 0; c < C; ++c) {
      av[u][c] = load8(dv + u * DT + 8 * c);
      ak[u][c] = load8(dk + u * DT + 8 * c);
    }
  for (int64_t r = 0; r < rows; ++r) {
    v8 dor[C], qr[C];
    for (int c = 0; c < C; ++c) {
      dor[c] = load8(dob + r * DT + 8 * c);
      qr[c] = load8(qb + r * DT + 8 * c);
    }
    for (int u = 0; u < J; ++u) {
      const v8 pw = splat(p[r * stride + u]), sw = splat(ds[r * stride + u]);
      for (int c = 0; c < C; ++c) {
        av[u][c] += pw * dor[c];
        ak[u][c] += sw * qr[c];
      }
    }
  }
  for (int u = 0; u < J; ++u)
    for (int c = 0; c < C; ++c) {
      store8(dv + u * DT + 8 * c, av[u][c]);
      store8(dk + u * DT + 8 * c, ak[u][c]);
    }
}

// dV, dK [length, D] += pᵀ dO_block, dsᵀ Q_block for one block of `rows` query rows.
template <int DT>
inline void keys_update(const float* p, const float* ds, int64_t stride, const float* dob,
                        const float* qb, int64_t rows, int64_t dim_rt, int64_t length, float* dv,
                        float* dk) {
  if constexpr (DT > 0 && DT % 8 == 0) {
    constexpr int J = DT <= 16 ? 2 : 1;
    int64_t j = 0;
    for (; j + J <= length; j += J)
      key_group<DT, J>(p + j, ds + j, stride, dob, qb, rows, dv + j * DT, dk + j * DT);
    for (; j < length; ++j)
      key_group<DT, 1>(p + j, ds + j, stride, dob, qb, rows, dv + j * DT, dk + j * DT);
  } else {
    for (int64_t j = 0; j < length; ++j)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t d = 0; d < dim_rt; ++d) {
          dv[j * dim_rt + d] += p[r * stride + j] * dob[r * dim_rt + d];
          dk[j * dim_rt + d] += ds[r * stride + j] * qb[r * dim_rt + d];
        }
  }
}

// Copies head h of batch element b out of [batch, length, heads, dim]: rows [length, dim]
// (row-major) and, if `cols` is set, the transpose [dim, padded] zero-padded past `length`.
void gather(const float* src, const Shape& sh, int64_t b, int64_t h, float* rows, float* cols) {
  for (int64_t i = 0; i < sh.length; ++i) {
    const float* p = src + ((b * sh.length + i) * sh.heads + h) * sh.dim;
    if (rows) std::memcpy(rows + i * sh.dim, p, sh.dim * sizeof(float));
    if (cols)
      for (int64_t d = 0; d < sh.dim; ++d) cols[d * sh.padded + i] = p[d];
  }
  if (cols)
    for (int64_t d = 0; d < sh.dim; ++d)
      std::fill(cols + d * sh.padded + sh.length, cols + (d + 1) * sh.padded, 0.0f);
}

void scatter(const float* rows, const Shape& sh, int64_t b, int64_t h, float* dst) {
  for (int64_t i = 0; i < sh.length; ++i)
    std::memcpy(dst + ((b * sh.length + i) * sh.heads + h) * sh.dim, rows + i * sh.dim,
                sh.dim * sizeof(float));
}

// Scores of query row i with disallowed keys set to MASK_VALUE (j < length only); `valid` is the
// key mask as floats (1 = real key).
template <int DT>
inline void masked_scores(const float* q_row, const float* kt, const float* valid,
                          const Shape& sh, int64_t i, bool causal, int64_t window, float* s) {
  row_scores<DT>(q_row, kt, sh.dim, sh.padded, s);
  int64_t lo, hi;
  key_range(i, sh.length, causal, window, &lo, &hi);
  apply_mask(s, valid, sh.length, lo, hi);
}

// The key mask of batch element b as floats (1 = real key, 0 = padding).
inline std::vector<float> key_valid(const bool* mask, const Shape& sh, int64_t b) {
  std::vector<float> valid(sh.length);
  for (int64_t j = 0; j < sh.length; ++j) valid[j] = mask[b * sh.length + j] ? 1.0f : 0.0f;
  return valid;
}

template <int DT>
void forward_head(const float* q, const float* k, const float* v, const bool* mask,
                  const Shape& sh, bool causal, int64_t window, int64_t task, float* o, float* m,
                  float* l) {
  const int64_t b = task / sh.heads, h = task % sh.heads, L = sh.length;
  const int64_t D = DT ? DT : sh.dim;
  constexpr int64_t R = kGroup<DT>;
  std::vector<float> qr(L * D), kt(D * sh.padded), vr(L * D), orows(L * D), s(R * sh.padded);
  gather(q, sh, b, h, qr.data(), nullptr);
  gather(k, sh, b, h, nullptr, kt.data());
  gather(v, sh, b, h, vr.data(), nullptr);
  const std::vector<float> valid = key_valid(mask, sh, b);
  float* m_out = m + (b * sh.heads + h) * L;
  float* l_out = l + (b * sh.heads + h) * L;
  for (int64_t i0 = 0; i0 < L; i0 += R) {
    const int64_t rows = std::min(R, L - i0);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      float* sr = s.data() + r * sh.padded;
      masked_scores<DT>(qr.data() + i * D, kt.data(), valid.data(), sh, i, causal, window, sr);
      m_out[i] = lane_max(sr, L);
      exp_shifted(sr, L, m_out[i]);
      l_out[i] = lane_sum(sr, L);
    }
    rows_combine<DT>(s.data(), sh.padded, rows, vr.data(), D, L, orows.data() + i0 * D);
    for (int64_t r = 0; r < rows; ++r) {
      const float inv = 1.0f / l_out[i0 + r];
      for (int64_t d = 0; d < D; ++d) orows[(i0 + r) * D + d] *= inv;
    }
  }
  scatter(orows.data(), sh, b, h, o);
}

template <int DT>
void backward_head(const float* q, const float* k, const float* v, const bool* mask,
                   const float* o, const float* m, const float* l, const float* dout,
                   const Shape& sh, bool causal, int64_t window, int64_t task, float* dq,
                   float* dk, float* dv) {
  const int64_t b = task / sh.heads, h = task % sh.heads, L = sh.length;
  const int64_t D = DT ? DT : sh.dim;
  const int64_t P = sh.padded;
  std::vector<float> qr(L * D), kr(L * D), kt(D * P), vt(D * P), orows(L * D), dor(L * D);
  std::vector<float> dqr(L * D), dkr(L * D, 0.0f), dvr(L * D, 0.0f);
  std::vector<float> p(kRows * P), ds(kRows * P);
  gather(q, sh, b, h, qr.data(), nullptr);
  gather(k, sh, b, h, kr.data(), kt.data());
  gather(v, sh, b, h, nullptr, vt.data());
  gather(o, sh, b, h, orows.data(), nullptr);
  gather(dout, sh, b, h, dor.data(), nullptr);
  const std::vector<float> valid = key_valid(mask, sh, b);
  const float* m_in = m + (b * sh.heads + h) * L;
  const float* l_in = l + (b * sh.heads + h) * L;
  for (int64_t i0 = 0; i0 < L; i0 += kRows) {
    const int64_t rows = std::min(kRows, L - i0);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      float* pr = p.data() + r * P;
      float* dsr = ds.data() + r * P;
      masked_scores<DT>(qr.data() + i * D, kt.data(), valid.data(), sh, i, causal, window,
                        pr);
      const float* do_i = dor.data() + i * D;
      row_scores<DT>(do_i, vt.data(), D, P, dsr);  // dP row
      float delta = 0.0f;
      for (int64_t d = 0; d < D; ++d) delta += do_i[d] * orows[i * D + d];
      const float mx = m_in[i], inv = 1.0f / l_in[i];
      exp_shifted(pr, L, mx);
      // ds = p * (dP - delta) at allowed keys; a disallowed score (replaced by MASK_VALUE in
      // the forward) gets no gradient, even in a fully disallowed row where p is uniform.
      int64_t lo, hi;
      key_range(i, L, causal, window, &lo, &hi);
      int64_t j = 0;
      for (; j + 8 <= L; j += 8) {
        const v8 pj = load8(pr + j) * splat(inv);
        store8(pr + j, pj);
        const v8 g = pj * (load8(dsr + j) - splat(delta));
        store8(dsr + j, load8(valid.data() + j) != splat(0.0f) ? g : splat(0.0f));
      }
      for (; j < L; ++j) {
        pr[j] *= inv;
        dsr[j] = valid[j] != 0.0f ? pr[j] * (dsr[j] - delta) : 0.0f;
      }
      std::fill(dsr, dsr + std::min(lo, L), 0.0f);
      if (hi < L) std::fill(dsr + hi, dsr + L, 0.0f);
    }
    rows_combine<DT>(ds.data(), P, rows, kr.data(), D, L, dqr.data() + i0 * D);
    keys_update<DT>(p.data(), ds.data(), P, dor.data() + i0 * D, qr.data() + i0 * D, rows, D, L,
                    dvr.data(), dkr.data());
  }
  scatter(dqr.data(), sh, b, h, dq);
  scatter(dkr.data(), sh, b, h, dk);
  scatter(dvr.data(), sh, b, h, dv);
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

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SptlibFusedAttentionFwd, Forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Attr<int64_t>("causal")
                                  .Attr<int64_t>("window")
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SptlibFusedAttentionBwd, Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("causal")
                                  .Attr<int64_t>("window")
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
