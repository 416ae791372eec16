// S4's Cauchy sums for XLA:CPU (an XLA FFI custom call), forward and backward.
//
// Why: evaluated with jnp, the sums materialise `[H, N/2, J]` complex denominators and their
// reciprocals (and, in the backward pass, as many cotangents): the S4 kernel's generation was
// 2/3 of the S4 block's forward+backward at L = 1k (H 256, N 64), bound by memory traffic. Here
// every denominator lives in registers only: each task is one channel h, vectorised over 8 nodes
// j at a time.
//
// Forward, per channel h (v, lam, a, b come as separate real and imaginary parts; the sums s and
// their cotangent g as complex64):
//   s[k, h, j] = sum_n v[k, h, n] r1[n, j] + conj(v[k, h, n]) r2[n, j],
//   r1 = 1 / (a[h, j] - b[j] lam[h, n]),  r2 = 1 / (a[h, j] - b[j] conj(lam[h, n])).
// Backward: JAX's transpose of the forward's derivative (the pairing Re(x y), so that a
// holomorphic factor c transposes to c and conj to conj), for a cotangent g [K, H, J]:
//   ct_v[k, n]  = sum_j g[k, j] r1 + conj(sum_j g[k, j] r2)
//   G1[n, j] = sum_k g[k, j] v[k, n],  G2[n, j] = sum_k g[k, j] conj(v[k, n])
//   ct_lam[n]   = sum_j b r1^2 G1 + conj(sum_j b r2^2 G2)
//   ct_a[h, j]  = -sum_n (r1^2 G1 + r2^2 G2)
//   ct_b[h, j]  = sum_n (lam r1^2 G1 + conj(lam) r2^2 G2)   (per channel; summed over h outside)
// J must be a multiple of 8 (the caller pads the nodes).

#include <cstdint>
#include <type_traits>
#include <vector>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace sptlib_cpu;  // NOLINT: v8, splat, load8, store8, parallel_for

struct C8 {
  v8 re, im;
};

inline C8 operator+(C8 x, C8 y) { return {x.re + y.re, x.im + y.im}; }
inline C8 operator*(C8 x, C8 y) {
  return {x.re * y.re - x.im * y.im, x.re * y.im + x.im * y.re};
}
inline C8 conj(C8 x) { return {x.re, -x.im}; }
inline C8 cscalar(float re, float im) { return {splat(re), splat(im)}; }
inline C8 recip(C8 d) {
  const v8 s = splat(1.0f) / (d.re * d.re + d.im * d.im);
  return {d.re * s, -d.im * s};
}
inline float hsum(v8 x) {
  float t = 0.0f;
  for (int i = 0; i < 8; ++i) t += x[i];
  return t;
}

// 8 complex numbers stored interleaved (re, im, re, im, ...) at p, to and from lanes.
inline C8 load_c8(const float* p) {
  const v8 x0 = load8(p), x1 = load8(p + 8);
  return {__builtin_shufflevector(x0, x1, 0, 2, 4, 6, 8, 10, 12, 14),
          __builtin_shufflevector(x0, x1, 1, 3, 5, 7, 9, 11, 13, 15)};
}
inline void store_c8(float* p, C8 x) {
  store8(p, __builtin_shufflevector(x.re, x.im, 0, 8, 1, 9, 2, 10, 3, 11));
  store8(p + 8, __builtin_shufflevector(x.re, x.im, 4, 12, 5, 13, 6, 14, 7, 15));
}

struct Dims {
  int64_t k, h, n, j;
};

// Pointers to one operand's real and imaginary parts.
struct Parts {
  const float* re;
  const float* im;
};
struct OutParts {
  float* re;
  float* im;
};

// r1 and r2 at node block [j, j + 8) for state n of channel h.
inline void reciprocals(C8 a, C8 b, float lr, float li, C8* r1, C8* r2) {
  const C8 bl = b * cscalar(lr, li), blc = b * cscalar(lr, -li);
  *r1 = recip({a.re - bl.re, a.im - bl.im});
  *r2 = recip({a.re - blc.re, a.im - blc.im});
}

// K (the number of sums) as a template argument where it is 4 or 6 (one or two C; the layers'
// cases), so the accumulators stay in registers; KT = 0: any K, read at run time.
template <int KT>
void forward_channel(const Dims& d, int64_t h, Parts v, Parts lam, Parts a, Parts b,
                     float* s) {
  const int64_t nk = KT ? KT : d.k;
  constexpr int kMax = KT ? KT : 1;
  std::vector<C8> heap(KT ? 0 : d.k);
  C8 regs[kMax];
  C8* acc = KT ? regs : heap.data();
  for (int64_t j = 0; j < d.j; j += 8) {
    const C8 aj = {load8(a.re + h * d.j + j), load8(a.im + h * d.j + j)};
    const C8 bj = {load8(b.re + j), load8(b.im + j)};
    for (int64_t k = 0; k < nk; ++k) acc[k] = cscalar(0.0f, 0.0f);
    for (int64_t n = 0; n < d.n; ++n) {
      C8 r1, r2;
      reciprocals(aj, bj, lam.re[h * d.n + n], lam.im[h * d.n + n], &r1, &r2);
      // v r1 + conj(v) r2 = (x S.re - y D.im, x S.im + y D.re), S = r1 + r2, D = r1 - r2.
      const v8 sr = r1.re + r2.re, si = r1.im + r2.im, dr = r1.re - r2.re, di = r1.im - r2.im;
      for (int64_t k = 0; k < nk; ++k) {
        const int64_t i = (k * d.h + h) * d.n + n;
        const v8 x = splat(v.re[i]), y = splat(v.im[i]);
        acc[k].re += x * sr - y * di;
        acc[k].im += x * si + y * dr;
      }
    }
    for (int64_t k = 0; k < nk; ++k) store_c8(s + 2 * ((k * d.h + h) * d.j + j), acc[k]);
  }
}

// One state n at a time over all nodes: its K x 2 sums over the nodes (ct_v) stay in registers;
// ct_a and ct_b accumulate in their output rows (L1-resident: [J] per channel).
template <int KT>
void backward_channel(const Dims& d, int64_t h, Parts v, Parts lam, Parts a, Parts b,
                      const float* g,
                      OutParts ct_v, OutParts ct_lam, OutParts ct_a, OutParts ct_b) {
  const int64_t nk = KT ? KT : d.k;
  constexpr int kMax = KT ? KT : 1;
  std::vector<C8> heap(KT ? 0 : 2 * d.k);
  C8 regs[2 * kMax];
  C8* sv = KT ? regs : heap.data();  // sv[2k]: sum_j g r1, sv[2k + 1]: sum_j g r2
  float* car = ct_a.re + h * d.j;
  float* cai = ct_a.im + h * d.j;
  float* cbr = ct_b.re + h * d.j;
  float* cbi = ct_b.im + h * d.j;
  for (int64_t j = 0; j < d.j; ++j) car[j] = cai[j] = cbr[j] = cbi[j] = 0.0f;
  for (int64_t n = 0; n < d.n; ++n) {
    const float lr = lam.re[h * d.n + n], li = lam.im[h * d.n + n];
    for (int64_t k = 0; k < 2 * nk; ++k) sv[k] = cscalar(0.0f, 0.0f);
    C8 sl1 = cscalar(0.0f, 0.0f), sl2 = cscalar(0.0f, 0.0f);
    for (int64_t j = 0; j < d.j; j += 8) {
      const C8 aj = {load8(a.re + h * d.j + j), load8(a.im + h * d.j + j)};
      const C8 bj = {load8(b.re + j), load8(b.im + j)};
      C8 r1, r2;
      reciprocals(aj, bj, lr, li, &r1, &r2);
      // G1 = sum_k g v, G2 = sum_k g conj(v): (P - Q, R + T) and (P + Q, T - R) with
      // P = gr x, Q = gi y, R = gr y, T = gi x.
      v8 p = splat(0.0f), q = p, r = p, t = p;
      for (int64_t k = 0; k < nk; ++k) {
        const int64_t i = (k * d.h + h) * d.n + n;
        const C8 gk = load_c8(g + 2 * ((k * d.h + h) * d.j + j));
        const v8 x = splat(v.re[i]), y = splat(v.im[i]);
        p += gk.re * x;
        q += gk.im * y;
        r += gk.re * y;
        t += gk.im * x;
        sv[2 * k] = sv[2 * k] + gk * r1;
        sv[2 * k + 1] = sv[2 * k + 1] + gk * r2;
      }
      const C8 g1 = {p - q, r + t}, g2 = {p + q, t - r};
      const C8 t1 = r1 * r1 * g1, t2 = r2 * r2 * g2;
      sl1 = sl1 + bj * t1;
      sl2 = sl2 + bj * t2;
      const C8 cb = cscalar(lr, li) * t1 + cscalar(lr, -li) * t2;
      store8(car + j, load8(car + j) - (t1.re + t2.re));
      store8(cai + j, load8(cai + j) - (t1.im + t2.im));
      store8(cbr + j, load8(cbr + j) + cb.re);
      store8(cbi + j, load8(cbi + j) + cb.im);
    }
    for (int64_t k = 0; k < nk; ++k) {
      const int64_t i = (k * d.h + h) * d.n + n;
      ct_v.re[i] = hsum(sv[2 * k].re) + hsum(sv[2 * k + 1].re);
      ct_v.im[i] = hsum(sv[2 * k].im) - hsum(sv[2 * k + 1].im);
    }
    ct_lam.re[h * d.n + n] = hsum(sl1.re) + hsum(sl2.re);
    ct_lam.im[h * d.n + n] = hsum(sl1.im) - hsum(sl2.im);
  }
}

template <typename F>
void dispatch_k(int64_t k, F f) {
  if (k == 4) {
    f(std::integral_constant<int, 4>());
  } else if (k == 6) {
    f(std::integral_constant<int, 6>());
  } else {
    f(std::integral_constant<int, 0>());
  }
}

using Buf = ffi::Buffer<ffi::F32>;
using Ret = ffi::ResultBuffer<ffi::F32>;
// The [K, H, J] sums and their cotangent stay complex64 (interleaved): split into parts they
// would cost XLA two more copies of the largest arrays.
using CBuf = ffi::Buffer<ffi::C64>;
using CRet = ffi::ResultBuffer<ffi::C64>;

ffi::Error check(const Buf& vr, const Buf& lr, const Buf& ar, const Buf& br, Dims* d) {
  auto vd = vr.dimensions();
  auto ld = lr.dimensions();
  auto ad = ar.dimensions();
  auto bd = br.dimensions();
  if (vd.size() != 3 || ld.size() != 2 || ad.size() != 2 || bd.size() != 1 || ld[0] != vd[1] ||
      ld[1] != vd[2] || ad[0] != vd[1] || ad[1] != bd[0] || bd[0] % 8 != 0)
    return ffi::Error::InvalidArgument(
        "cauchy: v [K, H, N], lam [H, N], a [H, J], b [J] with J a multiple of 8");
  *d = {vd[0], vd[1], vd[2], bd[0]};
  return ffi::Error::Success();
}

ffi::Error Forward(ffi::ThreadPool pool, Buf vr, Buf vi, Buf lr, Buf li, Buf ar, Buf ai, Buf br,
                   Buf bi, CRet s) {
  Dims d;
  if (auto err = check(vr, lr, ar, br, &d); err.failure()) return err;
  dispatch_k(d.k, [&](auto kt) {
    parallel_for(pool, d.h, [&](int64_t h) {
      forward_channel<decltype(kt)::value>(d, h, {vr.typed_data(), vi.typed_data()}, {lr.typed_data(), li.typed_data()},
                    {ar.typed_data(), ai.typed_data()}, {br.typed_data(), bi.typed_data()},
                    reinterpret_cast<float*>(s->typed_data()));
    });
  });
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::ThreadPool pool, Buf vr, Buf vi, Buf lr, Buf li, Buf ar, Buf ai, Buf br,
                    Buf bi, CBuf g, Ret vr_ct, Ret vi_ct, Ret lr_ct, Ret li_ct, Ret ar_ct,
                    Ret ai_ct, Ret br_ct, Ret bi_ct) {
  Dims d;
  if (auto err = check(vr, lr, ar, br, &d); err.failure()) return err;
  dispatch_k(d.k, [&](auto kt) {
    parallel_for(pool, d.h, [&](int64_t h) {
      backward_channel<decltype(kt)::value>(d, h, {vr.typed_data(), vi.typed_data()}, {lr.typed_data(), li.typed_data()},
                     {ar.typed_data(), ai.typed_data()}, {br.typed_data(), bi.typed_data()},
                     reinterpret_cast<const float*>(g.typed_data()),
                     {vr_ct->typed_data(), vi_ct->typed_data()},
                     {lr_ct->typed_data(), li_ct->typed_data()},
                     {ar_ct->typed_data(), ai_ct->typed_data()},
                     {br_ct->typed_data(), bi_ct->typed_data()});
    });
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SptlibCauchyFwd, Forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Buf>()  // v re, im
                                  .Arg<Buf>()
                                  .Arg<Buf>()  // lam
                                  .Arg<Buf>()
                                  .Arg<Buf>()  // a
                                  .Arg<Buf>()
                                  .Arg<Buf>()  // b
                                  .Arg<Buf>()
                                  .Ret<CBuf>());  // s

XLA_FFI_DEFINE_HANDLER_SYMBOL(SptlibCauchyBwd, Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Buf>()
                                  .Arg<Buf>()
                                  .Arg<Buf>()
                                  .Arg<Buf>()
                                  .Arg<Buf>()
                                  .Arg<Buf>()
                                  .Arg<Buf>()
                                  .Arg<Buf>()
                                  .Arg<CBuf>()  // g
                                  .Ret<Buf>()  // ct_v
                                  .Ret<Buf>()
                                  .Ret<Buf>()  // ct_lam
                                  .Ret<Buf>()
                                  .Ret<Buf>()  // ct_a
                                  .Ret<Buf>()
                                  .Ret<Buf>()  // ct_b (per channel)
                                  .Ret<Buf>());
