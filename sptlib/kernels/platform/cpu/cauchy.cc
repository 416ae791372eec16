// S4's generating function at the roots of unity for XLA:CPU (an XLA FFI custom call), forward
// and backward: the Cauchy sums and the Woodbury step that combines them.
//
// Why: evaluated with jnp, the sums materialise `[H, N/2, J]` complex denominators and their
// reciprocals (and, in the backward pass, as many cotangents), and the Woodbury step is a dozen
// more passes over `[K, H, J]` arrays: the S4 kernel's generation was 2/3 of the S4 block's
// forward+backward at L = 1k (H 256, N 64), bound by memory traffic. Here every denominator lives
// in registers only: each task is one channel h, vectorised over 16 nodes j at a time.
//
// Forward, per channel h (v, lam, a, b come as separate real and imaginary parts; the outputs
// and the cotangent g as complex64):
//   s[k, h, j] = 2 sum_n v[k, h, n] r1[n, j] + conj(v[k, h, n]) r2[n, j],
//   r1 = 1 / (a[h, j] - b[j] lam[h, n]),  r2 = 1 / (a[h, j] - b[j] conj(lam[h, n])),
//   kf[c, h, j] = s00[c] - s01[c] s10 q,  q = hh / (1 + hh s11),  hh = b / 2,
// with s00 = s[0:C], s01 = s[C:2C], s10 = s[2C], s11 = s[2C + 1] (K = 2C + 2). s is kept as the
// backward's residual. Backward: JAX's transpose of the forward's derivative (the pairing
// Re(x y), so that a holomorphic factor c transposes to c and conj to conj). From g = ct_kf,
// `woodbury_backward` gives the sums' cotangent gs (2x that of s); then
//   ct_v[k, n]  = sum_j gs[k, j] r1 + conj(sum_j gs[k, j] r2)
//   G1[n, j] = sum_k gs[k, j] v[k, n],  G2[n, j] = sum_k gs[k, j] conj(v[k, n])
//   ct_lam[n]   = sum_j b r1^2 G1 + conj(sum_j b r2^2 G2)
//   ct_a[h, j]  = -sum_n (r1^2 G1 + r2^2 G2)
//   ct_b[h, j]  = sum_n (lam r1^2 G1 + conj(lam) r2^2 G2) + the Woodbury step's part
//                 (per channel; summed over h outside)
// J must be a multiple of 16 (the caller pads the nodes).

#include <cstdint>
#include <type_traits>
#include <vector>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace sptlib_cpu;  // NOLINT: parallel_for

// 16 nodes per vector: one AVX-512 register (two AVX2 ones elsewhere). The sums are bound by
// arithmetic (two reciprocals and 4 K complex products per state and node), so the wider vector
// is about twice as fast where the core executes 512-bit operations at full width.
constexpr int kLanes = 16;
typedef float vw __attribute__((vector_size(4 * kLanes)));
typedef float vwu __attribute__((vector_size(4 * kLanes), aligned(4)));

inline vw loadw(const float* p) { return *reinterpret_cast<const vwu*>(p); }
inline void storew(float* p, vw x) { *reinterpret_cast<vwu*>(p) = x; }
inline vw splatw(float x) { return vw{} + x; }

struct CV {  // kLanes complex numbers
  vw re, im;
};

inline CV operator+(CV x, CV y) { return {x.re + y.re, x.im + y.im}; }
inline CV operator*(CV x, CV y) {
  return {x.re * y.re - x.im * y.im, x.re * y.im + x.im * y.re};
}
inline CV cscalar(float re, float im) { return {splatw(re), splatw(im)}; }
inline CV recip(CV d) {
  const vw s = splatw(1.0f) / (d.re * d.re + d.im * d.im);
  return {d.re * s, -d.im * s};
}
inline float hsum(vw x) {
  float t = 0.0f;
  for (int i = 0; i < kLanes; ++i) t += x[i];
  return t;
}

// kLanes complex numbers stored interleaved (re, im, re, im, ...) at p, to and from lanes.
inline CV load_cv(const float* p) {
  const vw x0 = loadw(p), x1 = loadw(p + kLanes);
  return {__builtin_shufflevector(x0, x1, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28,
                                  30),
          __builtin_shufflevector(x0, x1, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29,
                                  31)};
}
inline void store_cv(float* p, CV x) {
  storew(p, __builtin_shufflevector(x.re, x.im, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22,
                                    7, 23));
  storew(p + kLanes, __builtin_shufflevector(x.re, x.im, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28,
                                             13, 29, 14, 30, 15, 31));
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

// r1 and r2 at node block [j, j + kLanes) for state n of channel h.
inline void reciprocals(CV a, CV b, float lr, float li, CV* r1, CV* r2) {
  const CV bl = b * cscalar(lr, li), blc = b * cscalar(lr, -li);
  *r1 = recip({a.re - bl.re, a.im - bl.im});
  *r2 = recip({a.re - blc.re, a.im - blc.im});
}

// K (the number of sums) as a template argument where it is 4 or 6 (one or two C; the layers'
// cases), so the accumulators stay in registers; KT = 0: any K, read at run time.
template <int KT>
void forward_channel(const Dims& d, int64_t h, Parts v, Parts lam, Parts a, Parts b, float* s,
                     float* kf) {
  const int64_t nk = KT ? KT : d.k;
  constexpr int kMax = KT ? KT : 1;
  std::vector<CV> heap(KT ? 0 : d.k);
  CV regs[kMax];
  CV* acc = KT ? regs : heap.data();
  for (int64_t j = 0; j < d.j; j += kLanes) {
    const CV aj = {loadw(a.re + h * d.j + j), loadw(a.im + h * d.j + j)};
    const CV bj = {loadw(b.re + j), loadw(b.im + j)};
    for (int64_t k = 0; k < nk; ++k) acc[k] = cscalar(0.0f, 0.0f);
    for (int64_t n = 0; n < d.n; ++n) {
      CV r1, r2;
      reciprocals(aj, bj, lam.re[h * d.n + n], lam.im[h * d.n + n], &r1, &r2);
      // v r1 + conj(v) r2 = (x S.re - y D.im, x S.im + y D.re), S = r1 + r2, D = r1 - r2.
      const vw sr = r1.re + r2.re, si = r1.im + r2.im, dr = r1.re - r2.re, di = r1.im - r2.im;
      for (int64_t k = 0; k < nk; ++k) {
        const int64_t i = (k * d.h + h) * d.n + n;
        const vw x = splatw(v.re[i]), y = splatw(v.im[i]);
        acc[k].re += x * sr - y * di;
        acc[k].im += x * si + y * dr;
      }
    }
    for (int64_t k = 0; k < nk; ++k) {
      acc[k] = acc[k] * cscalar(2.0f, 0.0f);
      store_cv(s + 2 * ((k * d.h + h) * d.j + j), acc[k]);
    }
    // Woodbury: kf[c] = s00[c] - s01[c] s10 q, q = hh / (1 + hh s11), hh = b / 2.
    const int64_t nc = nk / 2 - 1;
    const CV hh = bj * cscalar(0.5f, 0.0f);
    const CV s10 = acc[2 * nc], s11 = acc[2 * nc + 1];
    const CV q = hh * recip(cscalar(1.0f, 0.0f) + hh * s11);
    const CV s10q = s10 * q;
    for (int64_t c = 0; c < nc; ++c) {
      const CV w = acc[nc + c] * s10q;
      store_cv(kf + 2 * ((c * d.h + h) * d.j + j), {acc[c].re - w.re, acc[c].im - w.im});
    }
  }
}

// The cotangent of the raw sums (2x that of s, the sums as stored) from the cotangent g of kf,
// into gs [K, J] (interleaved complex); the Woodbury step's part of ct_b into cb [J] (parts).
//   G = sum_c g[c] s01[c];  ct_s00[c] = g[c], ct_s01[c] = -g[c] s10 q, ct_s10 = -q G,
//   ct_s11 = q^2 s10 G, ct_hh = -s10 G / D^2 (D = 1 + hh s11; hh = b / 2).
void woodbury_backward(const Dims& d, int64_t h, Parts b, const float* s, const float* g,
                       float* gs, float* cbr, float* cbi) {
  const int64_t nc = d.k / 2 - 1;
  const auto sk = [&](int64_t k, int64_t j) { return load_cv(s + 2 * ((k * d.h + h) * d.j + j)); };
  for (int64_t j = 0; j < d.j; j += kLanes) {
    const CV bj = {loadw(b.re + j), loadw(b.im + j)};
    const CV hh = bj * cscalar(0.5f, 0.0f);
    const CV s10 = sk(2 * nc, j), s11 = sk(2 * nc + 1, j);
    const CV rd = recip(cscalar(1.0f, 0.0f) + hh * s11);
    const CV q = hh * rd;
    CV big_g = cscalar(0.0f, 0.0f);
    const CV two = cscalar(2.0f, 0.0f);
    for (int64_t c = 0; c < nc; ++c) {
      const CV gc = load_cv(g + 2 * ((c * d.h + h) * d.j + j));
      big_g = big_g + gc * sk(nc + c, j);
      store_cv(gs + 2 * (c * d.j + j), gc * two);
      const CV m = gc * s10 * q * two;
      store_cv(gs + 2 * ((nc + c) * d.j + j), {-m.re, -m.im});
    }
    const CV g10 = q * big_g * two;
    store_cv(gs + 2 * (2 * nc * d.j + j), {-g10.re, -g10.im});
    store_cv(gs + 2 * ((2 * nc + 1) * d.j + j), q * q * s10 * big_g * two);
    const CV chh = s10 * big_g * rd * rd * cscalar(-0.5f, 0.0f);  // ct_b = ct_hh / 2
    storew(cbr + j, chh.re);
    storew(cbi + j, chh.im);
  }
}

// One state n at a time over all nodes: its K x 2 sums over the nodes (ct_v) stay in registers;
// ct_a and ct_b accumulate in their output rows (L1-resident: [J] per channel).
template <int KT>
void backward_channel(const Dims& d, int64_t h, Parts v, Parts lam, Parts a, Parts b,
                      const float* s, const float* g_kf,
                      OutParts ct_v, OutParts ct_lam, OutParts ct_a, OutParts ct_b) {
  const int64_t nk = KT ? KT : d.k;
  constexpr int kMax = KT ? KT : 1;
  std::vector<CV> heap(KT ? 0 : 2 * d.k);
  CV regs[2 * kMax];
  CV* sv = KT ? regs : heap.data();  // sv[2k]: sum_j g r1, sv[2k + 1]: sum_j g r2
  float* car = ct_a.re + h * d.j;
  float* cai = ct_a.im + h * d.j;
  float* cbr = ct_b.re + h * d.j;
  float* cbi = ct_b.im + h * d.j;
  for (int64_t j = 0; j < d.j; ++j) car[j] = cai[j] = 0.0f;
  // The raw sums' cotangent for this channel, [K, J] (per-thread scratch, reused across calls).
  thread_local std::vector<float> gs_buf;
  if (static_cast<int64_t>(gs_buf.size()) < 2 * d.k * d.j) gs_buf.resize(2 * d.k * d.j);
  float* g = gs_buf.data();
  woodbury_backward(d, h, b, s, g_kf, g, cbr, cbi);
  for (int64_t n = 0; n < d.n; ++n) {
    const float lr = lam.re[h * d.n + n], li = lam.im[h * d.n + n];
    for (int64_t k = 0; k < 2 * nk; ++k) sv[k] = cscalar(0.0f, 0.0f);
    CV sl1 = cscalar(0.0f, 0.0f), sl2 = cscalar(0.0f, 0.0f);
    for (int64_t j = 0; j < d.j; j += kLanes) {
      const CV aj = {loadw(a.re + h * d.j + j), loadw(a.im + h * d.j + j)};
      const CV bj = {loadw(b.re + j), loadw(b.im + j)};
      CV r1, r2;
      reciprocals(aj, bj, lr, li, &r1, &r2);
      // G1 = sum_k g v, G2 = sum_k g conj(v): (P - Q, R + T) and (P + Q, T - R) with
      // P = gr x, Q = gi y, R = gr y, T = gi x.
      vw p = splatw(0.0f), q = p, r = p, t = p;
      for (int64_t k = 0; k < nk; ++k) {
        const int64_t i = (k * d.h + h) * d.n + n;
        const CV gk = load_cv(g + 2 * (k * d.j + j));
        const vw x = splatw(v.re[i]), y = splatw(v.im[i]);
        p += gk.re * x;
        q += gk.im * y;
        r += gk.re * y;
        t += gk.im * x;
        sv[2 * k] = sv[2 * k] + gk * r1;
        sv[2 * k + 1] = sv[2 * k + 1] + gk * r2;
      }
      const CV g1 = {p - q, r + t}, g2 = {p + q, t - r};
      const CV t1 = r1 * r1 * g1, t2 = r2 * r2 * g2;
      sl1 = sl1 + bj * t1;
      sl2 = sl2 + bj * t2;
      const CV cb = cscalar(lr, li) * t1 + cscalar(lr, -li) * t2;
      storew(car + j, loadw(car + j) - (t1.re + t2.re));
      storew(cai + j, loadw(cai + j) - (t1.im + t2.im));
      storew(cbr + j, loadw(cbr + j) + cb.re);
      storew(cbi + j, loadw(cbi + j) + cb.im);
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
      ld[1] != vd[2] || ad[0] != vd[1] || ad[1] != bd[0] || bd[0] % kLanes != 0 ||
      vd[0] < 4 || vd[0] % 2)
    return ffi::Error::InvalidArgument(
        "s4 spectrum: v [K = 2c + 2 >= 4, H, N], lam [H, N], a [H, J], b [J], J a multiple of 16");
  *d = {vd[0], vd[1], vd[2], bd[0]};
  return ffi::Error::Success();
}

ffi::Error Forward(ffi::ThreadPool pool, Buf vr, Buf vi, Buf lr, Buf li, Buf ar, Buf ai, Buf br,
                   Buf bi, CRet kf, CRet s) {
  Dims d;
  if (auto err = check(vr, lr, ar, br, &d); err.failure()) return err;
  dispatch_k(d.k, [&](auto kt) {
    parallel_for(pool, d.h, [&](int64_t h) {
      forward_channel<decltype(kt)::value>(d, h, {vr.typed_data(), vi.typed_data()}, {lr.typed_data(), li.typed_data()},
                    {ar.typed_data(), ai.typed_data()}, {br.typed_data(), bi.typed_data()},
                    reinterpret_cast<float*>(s->typed_data()),
                    reinterpret_cast<float*>(kf->typed_data()));
    });
  });
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::ThreadPool pool, Buf vr, Buf vi, Buf lr, Buf li, Buf ar, Buf ai, Buf br,
                    Buf bi, CBuf s, CBuf g, Ret vr_ct, Ret vi_ct, Ret lr_ct, Ret li_ct, Ret ar_ct,
                    Ret ai_ct, Ret br_ct, Ret bi_ct) {
  Dims d;
  if (auto err = check(vr, lr, ar, br, &d); err.failure()) return err;
  dispatch_k(d.k, [&](auto kt) {
    parallel_for(pool, d.h, [&](int64_t h) {
      backward_channel<decltype(kt)::value>(d, h, {vr.typed_data(), vi.typed_data()}, {lr.typed_data(), li.typed_data()},
                     {ar.typed_data(), ai.typed_data()}, {br.typed_data(), bi.typed_data()},
                     reinterpret_cast<const float*>(s.typed_data()),
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(SptlibS4SpectrumFwd, Forward,
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
                                  .Ret<CBuf>()  // kf [c, H, J]
                                  .Ret<CBuf>());  // s [K, H, J]

XLA_FFI_DEFINE_HANDLER_SYMBOL(SptlibS4SpectrumBwd, Backward,
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
                                  .Arg<CBuf>()  // s
                                  .Arg<CBuf>()  // g: the cotangent of kf
                                  .Ret<Buf>()  // ct_v
                                  .Ret<Buf>()
                                  .Ret<Buf>()  // ct_lam
                                  .Ret<Buf>()
                                  .Ret<Buf>()  // ct_a
                                  .Ret<Buf>()
                                  .Ret<Buf>()  // ct_b (per channel)
                                  .Ret<Buf>());
