// Long convolution by FFT for XLA:CPU (an XLA FFI custom call), forward and backward.
//
// Why: XLA:CPU runs its FFTs on one thread, and the S4D block spends about half its time in
// them. Here each task is 16 channels on XLA's intra-op thread pool: one vector lane per channel
// (the butterflies need no shuffles), two groups of 8 channels sharing one complex transform
// (z = u_1 + i u_2, separated by conjugate symmetry), each batch element on its own.
//
// y[b, t, h] = sum_s u[b, s, h] kc[h, (t - s) mod n] for t < L: u [batch, L, H] zero-padded to n
// (a power of two >= 2L, so nothing wraps around for a causal kernel), kc [H, n] the circular
// kernel (a causal one padded with zeros; a two-sided one with its negative lags at the end).
// Backward: du = IFFT(FFT(dy) conj(K))[:L], dkc = IFFT(sum_b conj(U_b) DY_b) (real).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace sptlib_cpu;  // NOLINT: v8, splat, parallel_for

// A radix-4 butterfly's twiddles W^j, W^2j, W^3j from 6 floats (re, im), conjugated for the
// inverse.
struct Twiddles {
  v8 r1, i1, r2, i2, r3, i3;
};

template <bool INV>
inline Twiddles twiddles(const float* w) {
  constexpr float sg = INV ? -1.0f : 1.0f;
  return {splat(w[0]), splat(sg * w[1]), splat(w[2]),
          splat(sg * w[3]), splat(w[4]), splat(sg * w[5])};
}

// (xr + i xi) (wr + i wi) into (*r, *i).
inline void cmul(v8 xr, v8 xi, v8 wr, v8 wi, v8* r, v8* i) {
  *r = xr * wr - xi * wi;
  *i = xr * wi + xi * wr;
}

// In-place FFTs of n (a power of two) complex v8 values, radix 4 (one radix-2 stage where log2 n
// is odd). `dif` takes natural order to bit-reversed order, `dit` bit-reversed to natural, so a
// convolution (forward, pointwise product, inverse) never permutes: the bit-reversal passes
// (scattered accesses, a cache miss each once n vectors outgrow L2) would cost more than the
// butterflies at n = 32k. A radix-4 stage reads and writes each point once where two radix-2
// stages would twice, with 3 complex multiplications per 4 points instead of 4: the loads and
// stores, not the arithmetic, bound a radix-2 stage here. INV conjugates the twiddles (no 1/n).
struct Plan {
  int64_t n = 0, log2n = 0;
  // Radix-4 stages of block length len = 4q, short to long; stage k's twiddles at r4tw[r4off[k]],
  // 6 floats per j < q: W^j, W^2j, W^3j (re, im), W = exp(-2 pi i / len).
  std::vector<float> r4tw;
  std::vector<int64_t> r4off, r4len;
  explicit Plan(int64_t n_) : n(n_) {
    while ((int64_t{1} << log2n) < n) ++log2n;
    for (int64_t len = (log2n & 1) ? 8 : 4; len <= n; len <<= 2) {
      r4off.push_back(static_cast<int64_t>(r4tw.size()));
      r4len.push_back(len);
      for (int64_t j = 0; j < len / 4; ++j)
        for (int64_t m = 1; m <= 3; ++m) {
          const double a = -2.0 * M_PI * static_cast<double>(m * j) / static_cast<double>(len);
          r4tw.push_back(static_cast<float>(std::cos(a)));
          r4tw.push_back(static_cast<float>(std::sin(a)));
        }
    }
    set_blocking();
  }

  static void radix2(v8* re, v8* im, int64_t n) {
    for (int64_t i = 0; i < n; i += 2) {
      const v8 ar = re[i], ai = im[i], br = re[i + 1], bi = im[i + 1];
      re[i] = ar + br;
      im[i] = ai + bi;
      re[i + 1] = ar - br;
      im[i + 1] = ai - bi;
    }
  }

  // Calls f(xr, xi, j, q, w) for each butterfly j of radix-4 stage `stage` in every block of
  // points in [begin, end) (xr, xi: the block's start; w: butterfly j's twiddles): the loops
  // the DIT and DIF stages share. f is a lambda, inlined at -O3.
  template <bool INV, typename F>
  void for_each_butterfly(v8* re, v8* im, size_t stage, int64_t begin, int64_t end,
                          F f) const {
    const int64_t len = r4len[stage], q = len / 4;
    const float* tw = r4tw.data() + r4off[stage];
    for (int64_t i = begin; i < end; i += len) {
      for (int64_t j = 0; j < q; ++j) f(re + i, im + i, j, q, twiddles<INV>(tw + 6 * j));
    }
  }

  // One radix-4 stage of decimation in time over the blocks of points [begin, end): a block's
  // four quarters hold the length-q DFTs of its subsequence's samples with residues 0, 2, 1, 3
  // (mod 4), and X[j + k q] = sum_r W^(r (j + k q)) F_r[j].
  template <bool INV>
  void dit_stage(v8* re, v8* im, size_t stage, int64_t begin, int64_t end) const {
    for_each_butterfly<INV>(re, im, stage, begin, end, [](v8* xr, v8* xi, int64_t j, int64_t q,
                                                           const Twiddles& w) {
      const v8 f0r = xr[j], f0i = xi[j];
      v8 f1r, f1i, f2r, f2i, f3r, f3i;
      cmul(xr[j + q], xi[j + q], w.r2, w.i2, &f2r, &f2i);
      cmul(xr[j + 2 * q], xi[j + 2 * q], w.r1, w.i1, &f1r, &f1i);
      cmul(xr[j + 3 * q], xi[j + 3 * q], w.r3, w.i3, &f3r, &f3i);
      const v8 pr = f0r + f2r, pi = f0i + f2i, mr = f0r - f2r, mi = f0i - f2i;
      const v8 sr = f1r + f3r, si = f1i + f3i, dr = f1r - f3r, di = f1i - f3i;
      xr[j] = pr + sr;
      xi[j] = pi + si;
      xr[j + 2 * q] = pr - sr;
      xi[j + 2 * q] = pi - si;
      // X[j + q] = m - i d, X[j + 3q] = m + i d (signs of i swapped for the inverse).
      if (INV) {
        xr[j + q] = mr - di;
        xi[j + q] = mi + dr;
        xr[j + 3 * q] = mr + di;
        xi[j + 3 * q] = mi - dr;
      } else {
        xr[j + q] = mr + di;
        xi[j + q] = mi - dr;
        xr[j + 3 * q] = mr - di;
        xi[j + 3 * q] = mi + dr;
      }
    });
  }

  // Decimation in frequency's stage: the transpose of `dit_stage` (the DFT matrix is
  // symmetric), a 4-point DFT followed by the twiddles.
  template <bool INV>
  void dif_stage(v8* re, v8* im, size_t stage, int64_t begin, int64_t end) const {
    for_each_butterfly<INV>(re, im, stage, begin, end, [](v8* xr, v8* xi, int64_t j, int64_t q,
                                                           const Twiddles& w) {
      const v8 x0r = xr[j], x0i = xi[j], x1r = xr[j + q], x1i = xi[j + q];
      const v8 x2r = xr[j + 2 * q], x2i = xi[j + 2 * q], x3r = xr[j + 3 * q],
               x3i = xi[j + 3 * q];
      const v8 ar = x0r + x2r, ai = x0i + x2i, br = x0r - x2r, bi = x0i - x2i;
      const v8 cr = x1r + x3r, ci = x1i + x3i, dr = x1r - x3r, di = x1i - x3i;
      // o0 = a + c, o1 = (a - c) W^2j, o2 = (b - i d) W^j, o3 = (b + i d) W^3j.
      const v8 o1r = ar - cr, o1i = ai - ci;
      v8 o2r, o2i, o3r, o3i;
      if (INV) {
        o2r = br - di, o2i = bi + dr, o3r = br + di, o3i = bi - dr;
      } else {
        o2r = br + di, o2i = bi - dr, o3r = br - di, o3i = bi + dr;
      }
      xr[j] = ar + cr;
      xi[j] = ai + ci;
      cmul(o1r, o1i, w.r2, w.i2, xr + j + q, xi + j + q);
      cmul(o2r, o2i, w.r1, w.i1, xr + j + 2 * q, xi + j + 2 * q);
      cmul(o3r, o3i, w.r3, w.i3, xr + j + 3 * q, xi + j + 3 * q);
    });
  }

  // Stages [0, short_stages) work inside blocks of `block` points: they run block by block, all
  // of them on one block while it sits in L2, instead of one sweep over all n points per stage.
  // At n = 32k the 2 MB of (re, im) do not fit one core's L2 (1 MB), and the stage-by-stage
  // order streamed it from L3 once per stage (8 times). Same arithmetic in the same order per
  // point: the results do not change, bit for bit.
  static constexpr int64_t kBlockPoints = 2048;  // (re, im) 128 KB
  size_t short_stages = 0;
  int64_t block = 0;
  void set_blocking() {
    block = (log2n & 1) ? 2 : 1;
    while (short_stages < r4len.size() && r4len[short_stages] <= kBlockPoints)
      block = r4len[short_stages++];
  }

  // Decimation in time, bit-reversed input, natural output.
  template <bool INV>
  void dit(v8* re, v8* im) const {
    for (int64_t b = 0; b < n; b += block) {
      if (log2n & 1) radix2(re + b, im + b, block);
      for (size_t stage = 0; stage < short_stages; ++stage)
        dit_stage<INV>(re, im, stage, b, b + block);
    }
    for (size_t stage = short_stages; stage < r4len.size(); ++stage)
      dit_stage<INV>(re, im, stage, 0, n);
  }

  // Decimation in frequency, natural input, bit-reversed output: `dit`'s stages in reverse.
  template <bool INV>
  void dif(v8* re, v8* im) const {
    for (size_t stage = r4len.size(); stage-- > short_stages;)
      dif_stage<INV>(re, im, stage, 0, n);
    for (int64_t b = 0; b < n; b += block) {
      for (size_t stage = short_stages; stage-- > 0;)
        dif_stage<INV>(re, im, stage, b, b + block);
      if (log2n & 1) radix2(re + b, im + b, block);
    }
  }
};

// Calls f(p, m) for every position p of a bit-reversed spectrum, m the position of its
// conjugate-symmetric partner (frequency -k for k at p): p and m mirror each other inside each
// octave [2^j, 2^(j+1)) of positions, positions 0 and 1 (frequencies 0 and n/2) are their own.
template <typename F>
inline void for_each_partner(int64_t n, F f) {
  f(0, 0);
  if (n > 1) f(1, 1);
  for (int64_t lo = 2; lo < n; lo <<= 1)
    for (int64_t p = lo; p < 2 * lo; ++p) f(p, 3 * lo - 1 - p);
}

// Per-thread scratch of `count` arrays of n vectors, reused across calls: fresh allocations of
// this size (1 MB per array at n = 32768) would be page-faulted in on every call.
v8* scratch(int64_t count, int64_t n) {
  thread_local std::vector<v8> buf;
  if (static_cast<int64_t>(buf.size()) < count * n) buf.resize(count * n);
  return buf.data();
}

struct Dims {
  int64_t batch, length, channels, n;
};

// Channel c of lane group [h0, h0 + 8) is valid if h0 + c < channels.
inline int64_t lanes_at(const Dims& d, int64_t h0) {
  return std::max<int64_t>(0, std::min<int64_t>(8, d.channels - h0));
}

// Loads rows 0..rows-1 of x (row t at x + t * row_stride; channels [h0, h0 + 8) to re, channels
// [h1, h1 + 8) to im), zero-padded to n.
void load_pair(const float* x, int64_t row_stride, int64_t rows, const Dims& d, int64_t h0,
               int64_t h1, v8* re, v8* im) {
  const int64_t l0 = lanes_at(d, h0), l1 = lanes_at(d, h1);
  for (int64_t t = 0; t < d.n; ++t) {
    v8 r = splat(0.0f), m = splat(0.0f);
    if (t < rows) {
      const float* row = x + t * row_stride;
      if (l0 == 8 && l1 == 8) {
        std::memcpy(&r, row + h0, sizeof(r));
        std::memcpy(&m, row + h1, sizeof(m));
      } else {
        for (int64_t c = 0; c < l0; ++c) r[c] = row[h0 + c];
        for (int64_t c = 0; c < l1; ++c) m[c] = row[h1 + c];
      }
    }
    re[t] = r;
    im[t] = m;
  }
}

// Stores re * scale to channels [h0, h0 + 8) and im * scale to [h1, h1 + 8) of rows 0..rows-1.
void store_pair(const v8* re, const v8* im, int64_t row_stride, int64_t rows, const Dims& d,
                int64_t h0, int64_t h1, float scale, float* y) {
  const int64_t l0 = lanes_at(d, h0), l1 = lanes_at(d, h1);
  for (int64_t t = 0; t < rows; ++t) {
    const v8 r = re[t] * splat(scale), m = im[t] * splat(scale);
    float* row = y + t * row_stride;
    if (l0 == 8 && l1 == 8) {
      std::memcpy(row + h0, &r, sizeof(r));
      std::memcpy(row + h1, &m, sizeof(m));
      continue;
    }
    for (int64_t c = 0; c < l0; ++c) row[h0 + c] = r[c];
    for (int64_t c = 0; c < l1; ++c) row[h1 + c] = m[c];
  }
}

// The transform Z of z = x1 + i x2 (x1, x2 real) holds both spectra:
// X1[k] = (Z[k] + conj Z[-k]) / 2, X2[k] = -i (Z[k] - conj Z[-k]) / 2.
struct Split {
  v8 r1, i1, r2, i2;
};

// Z[k] at position p, Z[-k] at m (see for_each_partner).
inline Split split(const v8* zr, const v8* zi, int64_t p, int64_t m) {
  const v8 h = splat(0.5f);
  return {(zr[p] + zr[m]) * h, (zi[p] - zi[m]) * h, (zi[p] + zi[m]) * h, (zr[m] - zr[p]) * h};
}

// Channel pairs: lane c of task g is channel 16g + c (real part) and 16g + 8 + c (imaginary
// part), so every batch element is transformed on its own (results do not depend on the
// batch's other elements, bit for bit) while each complex transform does two real ones.
struct Group {
  int64_t h0, h1;
  explicit Group(int64_t g) : h0(16 * g), h1(16 * g + 8) {}
};

// Spectra K1, K2 (bit-reversed) of the circular kernels of the group's two channel sets.
void kernel_spectra(const float* kc, const Dims& d, const Plan& plan, const Group& grp,
                    v8* zr, v8* zi, v8* k1r, v8* k1i, v8* k2r, v8* k2i) {
  const int64_t l0 = lanes_at(d, grp.h0), l1 = lanes_at(d, grp.h1);
  for (int64_t t = 0; t < d.n; ++t) {
    v8 r = splat(0.0f), m = splat(0.0f);
    for (int64_t c = 0; c < l0; ++c) r[c] = kc[(grp.h0 + c) * d.n + t];
    for (int64_t c = 0; c < l1; ++c) m[c] = kc[(grp.h1 + c) * d.n + t];
    zr[t] = r;
    zi[t] = m;
  }
  plan.dif<false>(zr, zi);
  for_each_partner(d.n, [&](int64_t p, int64_t m) {
    const Split sp = split(zr, zi, p, m);
    k1r[p] = sp.r1;
    k1i[p] = sp.i1;
    k2r[p] = sp.r2;
    k2i[p] = sp.i2;
  });
}

// Spectra stay bit-reversed between `dif` and `dit` (pointwise products do not care).
void forward_group(const float* u, const float* kc, const Dims& d, const Plan& plan, int64_t g,
                   float* y) {
  const Group grp(g);
  const int64_t n = d.n, rs = d.channels, bs = d.length * d.channels;
  v8* const w = scratch(8, n);
  v8 *k1r = w, *k1i = w + n, *k2r = w + 2 * n, *k2i = w + 3 * n, *zr = w + 4 * n,
     *zi = w + 5 * n, *pr = w + 6 * n, *pi = w + 7 * n;
  kernel_spectra(kc, d, plan, grp, zr, zi, k1r, k1i, k2r, k2i);
  const float inv_n = 1.0f / static_cast<float>(n);
  for (int64_t b = 0; b < d.batch; ++b) {
    load_pair(u + b * bs, rs, d.length, d, grp.h0, grp.h1, zr, zi);
    plan.dif<false>(zr, zi);
    // Y = U1 K1 + i U2 K2.
    for_each_partner(n, [&](int64_t p, int64_t m) {
      const Split sp = split(zr, zi, p, m);
      const v8 ar = sp.r1 * k1r[p] - sp.i1 * k1i[p], ai = sp.r1 * k1i[p] + sp.i1 * k1r[p];
      const v8 br = sp.r2 * k2r[p] - sp.i2 * k2i[p], bi = sp.r2 * k2i[p] + sp.i2 * k2r[p];
      pr[p] = ar - bi;
      pi[p] = ai + br;
    });
    plan.dit<true>(pr, pi);
    store_pair(pr, pi, rs, d.length, d, grp.h0, grp.h1, inv_n, y + b * bs);
  }
}

void backward_group(const float* u, const float* kc, const float* dy, const Dims& d,
                    const Plan& plan, int64_t g, float* du, float* dkc) {
  const Group grp(g);
  const int64_t n = d.n, rs = d.channels, bs = d.length * d.channels;
  v8* const w = scratch(14, n);
  v8 *k1r = w, *k1i = w + n, *k2r = w + 2 * n, *k2i = w + 3 * n, *ur = w + 4 * n,
     *ui = w + 5 * n, *yr = w + 6 * n, *yi = w + 7 * n, *pr = w + 8 * n, *pi = w + 9 * n,
     *s1r = w + 10 * n, *s1i = w + 11 * n, *s2r = w + 12 * n, *s2i = w + 13 * n;
  std::fill(s1r, s1r + 4 * n, splat(0.0f));
  kernel_spectra(kc, d, plan, grp, ur, ui, k1r, k1i, k2r, k2i);
  const float inv_n = 1.0f / static_cast<float>(n);
  for (int64_t b = 0; b < d.batch; ++b) {
    load_pair(u + b * bs, rs, d.length, d, grp.h0, grp.h1, ur, ui);
    load_pair(dy + b * bs, rs, d.length, d, grp.h0, grp.h1, yr, yi);
    plan.dif<false>(ur, ui);
    plan.dif<false>(yr, yi);
    for_each_partner(n, [&](int64_t p, int64_t m) {
      const Split su = split(ur, ui, p, m), sd = split(yr, yi, p, m);
      // S_c += conj(U_c) DY_c (the kernel gradients' spectra, summed over the batch).
      s1r[p] += su.r1 * sd.r1 + su.i1 * sd.i1;
      s1i[p] += su.r1 * sd.i1 - su.i1 * sd.r1;
      s2r[p] += su.r2 * sd.r2 + su.i2 * sd.i2;
      s2i[p] += su.r2 * sd.i2 - su.i2 * sd.r2;
      // W = DY1 conj(K1) + i DY2 conj(K2).
      const v8 ar = sd.r1 * k1r[p] + sd.i1 * k1i[p], ai = sd.i1 * k1r[p] - sd.r1 * k1i[p];
      const v8 br = sd.r2 * k2r[p] + sd.i2 * k2i[p], bi = sd.i2 * k2r[p] - sd.r2 * k2i[p];
      pr[p] = ar - bi;
      pi[p] = ai + br;
    });
    plan.dit<true>(pr, pi);
    store_pair(pr, pi, rs, d.length, d, grp.h0, grp.h1, inv_n, du + b * bs);
  }
  // S1 + i S2 (both Hermitian) -> dkc1 + i dkc2.
  for (int64_t p = 0; p < n; ++p) {
    pr[p] = s1r[p] - s2i[p];
    pi[p] = s1i[p] + s2r[p];
  }
  plan.dit<true>(pr, pi);
  const int64_t l0 = lanes_at(d, grp.h0), l1 = lanes_at(d, grp.h1);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < l0; ++c) dkc[(grp.h0 + c) * n + t] = pr[t][c] * inv_n;
    for (int64_t c = 0; c < l1; ++c) dkc[(grp.h1 + c) * n + t] = pi[t][c] * inv_n;
  }
}

ffi::Error check(const ffi::Buffer<ffi::F32>& u, const ffi::Buffer<ffi::F32>& kc, Dims* d) {
  auto ud = u.dimensions();
  auto kd = kc.dimensions();
  if (ud.size() != 3 || kd.size() != 2 || kd[0] != ud[2])
    return ffi::Error::InvalidArgument("fft conv: u [batch, L, H], kc [H, n]");
  d->batch = ud[0];
  d->length = ud[1];
  d->channels = ud[2];
  d->n = kd[1];
  if (d->n < 2 || (d->n & (d->n - 1)) || d->n < d->length)
    return ffi::Error::InvalidArgument("fft conv: n must be a power of two >= L");
  return ffi::Error::Success();
}

ffi::Error Forward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> u, ffi::Buffer<ffi::F32> kc,
                   ffi::ResultBuffer<ffi::F32> y) {
  Dims d;
  if (auto err = check(u, kc, &d); err.failure()) return err;
  const Plan plan(d.n);
  parallel_for(pool, (d.channels + 15) / 16, [&](int64_t g) {
    forward_group(u.typed_data(), kc.typed_data(), d, plan, g, y->typed_data());
  });
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> u, ffi::Buffer<ffi::F32> kc,
                    ffi::Buffer<ffi::F32> dy, ffi::ResultBuffer<ffi::F32> du,
                    ffi::ResultBuffer<ffi::F32> dkc) {
  Dims d;
  if (auto err = check(u, kc, &d); err.failure()) return err;
  const Plan plan(d.n);
  parallel_for(pool, (d.channels + 15) / 16, [&](int64_t g) {
    backward_group(u.typed_data(), kc.typed_data(), dy.typed_data(), d, plan, g,
                   du->typed_data(), dkc->typed_data());
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SptlibFftConvFwd, Forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SptlibFftConvBwd, Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
