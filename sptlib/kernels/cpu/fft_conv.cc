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

// In-place radix-2 FFT of n (a power of two) complex v8 values, input in bit-reversed order.
// Twiddles tw[j] = exp(-2 pi i j / n), j < n / 2; `inverse` conjugates them (no 1/n scaling).
struct Plan {
  int64_t n = 0, log2n = 0;
  std::vector<float> tw_re, tw_im, stage_re, stage_im;
  std::vector<int32_t> rev;
  explicit Plan(int64_t n_) : n(n_) {
    while ((int64_t{1} << log2n) < n) ++log2n;
    tw_re.resize(n / 2);
    tw_im.resize(n / 2);
    for (int64_t j = 0; j < n / 2; ++j) {
      const double a = -2.0 * M_PI * static_cast<double>(j) / static_cast<double>(n);
      tw_re[j] = static_cast<float>(std::cos(a));
      tw_im[j] = static_cast<float>(std::sin(a));
    }
    // Per-stage twiddles, stage of block length len at [len / 2, len): exp(-2 pi i j / len).
    stage_re.resize(n);
    stage_im.resize(n);
    for (int64_t half = 1; half < n; half <<= 1)
      for (int64_t j = 0; j < half; ++j) {
        stage_re[half + j] = tw_re[j * (n / (2 * half))];
        stage_im[half + j] = tw_im[j * (n / (2 * half))];
      }
    rev.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      int64_t r = 0;
      for (int64_t b = 0; b < log2n; ++b) r |= ((i >> b) & 1) << (log2n - 1 - b);
      rev[i] = static_cast<int32_t>(r);
    }
  }

  void transform(v8* re, v8* im, bool inverse) const {
    const float sign = inverse ? -1.0f : 1.0f;
    // Stage 1 (len 2) has only the twiddle 1.
    for (int64_t i = 0; i < n; i += 2) {
      const v8 ar = re[i], ai = im[i], br = re[i + 1], bi = im[i + 1];
      re[i] = ar + br;
      im[i] = ai + bi;
      re[i + 1] = ar - br;
      im[i + 1] = ai - bi;
    }
    // Stage 2 (len 4): twiddles 1 and -i (+i inverse).
    if (n >= 4) {
      for (int64_t i = 0; i < n; i += 4) {
        for (int64_t j = 0; j < 2; ++j) {
          const int64_t a = i + j, k = i + j + 2;
          v8 br = re[k], bi = im[k];
          if (j == 1) {  // multiply by -i (forward) or +i (inverse)
            const v8 t = br;
            br = splat(sign) * bi;
            bi = splat(-sign) * t;
          }
          const v8 ar = re[a], ai = im[a];
          re[a] = ar + br;
          im[a] = ai + bi;
          re[k] = ar - br;
          im[k] = ai - bi;
        }
      }
    }
    // Later stages: butterflies of one block are contiguous (j inner), twiddles from a
    // per-stage contiguous table.
    for (int64_t len = 8; len <= n; len <<= 1) {
      const int64_t half = len / 2;
      const float* wre = stage_re.data() + half;  // stage table: entries [half, len)
      const float* wim = stage_im.data() + half;
      for (int64_t i = 0; i < n; i += len) {
        v8* xr = re + i;
        v8* xi = im + i;
        for (int64_t j = 0; j < half; ++j) {
          const v8 wr = splat(wre[j]), wi = splat(sign * wim[j]);
          const v8 br = xr[j + half] * wr - xi[j + half] * wi;
          const v8 bi = xr[j + half] * wi + xi[j + half] * wr;
          const v8 ar = xr[j], ai = xi[j];
          xr[j] = ar + br;
          xi[j] = ai + bi;
          xr[j + half] = ar - br;
          xi[j + half] = ai - bi;
        }
      }
    }
  }
};

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
// [h1, h1 + 8) to im), bit-reversed and zero-padded to n.
void load_pair(const float* x, int64_t row_stride, int64_t rows, const Dims& d, const Plan& plan,
               int64_t h0, int64_t h1, v8* re, v8* im) {
  const int64_t l0 = lanes_at(d, h0), l1 = lanes_at(d, h1);
  // Rows in order (the input streams; the bit-reversed writes land in the cached buffer).
  for (int64_t t = 0; t < d.n; ++t) {
    const int64_t i = plan.rev[t];
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
    re[i] = r;
    im[i] = m;
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

inline Split split(const v8* zr, const v8* zi, int64_t k, int64_t n) {
  const int64_t m = (n - k) & (n - 1);
  const v8 h = splat(0.5f);
  return {(zr[k] + zr[m]) * h, (zi[k] - zi[m]) * h, (zi[k] + zi[m]) * h, (zr[m] - zr[k]) * h};
}

// Channel pairs: lane c of task g is channel 16g + c (real part) and 16g + 8 + c (imaginary
// part), so every batch element is transformed on its own (results do not depend on the
// batch's other elements, bit for bit) while each complex transform does two real ones.
struct Group {
  int64_t h0, h1;
  explicit Group(int64_t g) : h0(16 * g), h1(16 * g + 8) {}
};

// Spectra K1, K2 of the circular kernels of the group's two channel sets.
void kernel_spectra(const float* kc, const Dims& d, const Plan& plan, const Group& grp,
                    v8* zr, v8* zi, v8* k1r, v8* k1i, v8* k2r, v8* k2i) {
  const int64_t l0 = lanes_at(d, grp.h0), l1 = lanes_at(d, grp.h1);
  for (int64_t i = 0; i < d.n; ++i) {
    const int64_t t = plan.rev[i];
    v8 r = splat(0.0f), m = splat(0.0f);
    for (int64_t c = 0; c < l0; ++c) r[c] = kc[(grp.h0 + c) * d.n + t];
    for (int64_t c = 0; c < l1; ++c) m[c] = kc[(grp.h1 + c) * d.n + t];
    zr[i] = r;
    zi[i] = m;
  }
  plan.transform(zr, zi, false);
  for (int64_t k = 0; k < d.n; ++k) {
    const Split sp = split(zr, zi, k, d.n);
    k1r[k] = sp.r1;
    k1i[k] = sp.i1;
    k2r[k] = sp.r2;
    k2i[k] = sp.i2;
  }
}

void forward_group(const float* u, const float* kc, const Dims& d, const Plan& plan, int64_t g,
                   float* y) {
  const Group grp(g);
  const int64_t n = d.n, rs = d.channels, bs = d.length * d.channels;
  v8* const w = scratch(8, n);
  v8 *k1r = w, *k1i = w + n, *k2r = w + 2 * n, *k2i = w + 3 * n, *zr = w + 4 * n,
     *zi = w + 5 * n, *pr = w + 6 * n, *pi = w + 7 * n;
  kernel_spectra(kc, d, plan, grp, zr, zi, k1r, k1i, k2r,
                 k2i);
  const float inv_n = 1.0f / static_cast<float>(n);
  for (int64_t b = 0; b < d.batch; ++b) {
    load_pair(u + b * bs, rs, d.length, d, plan, grp.h0, grp.h1, zr, zi);
    plan.transform(zr, zi, false);
    // Y = U1 K1 + i U2 K2, written bit-reversed for the inverse transform.
    for (int64_t k = 0; k < n; ++k) {
      const Split sp = split(zr, zi, k, n);
      const v8 ar = sp.r1 * k1r[k] - sp.i1 * k1i[k], ai = sp.r1 * k1i[k] + sp.i1 * k1r[k];
      const v8 br = sp.r2 * k2r[k] - sp.i2 * k2i[k], bi = sp.r2 * k2i[k] + sp.i2 * k2r[k];
      const int64_t dst = plan.rev[k];
      pr[dst] = ar - bi;
      pi[dst] = ai + br;
    }
    plan.transform(pr, pi, true);
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
  kernel_spectra(kc, d, plan, grp, ur, ui, k1r, k1i, k2r,
                 k2i);
  const float inv_n = 1.0f / static_cast<float>(n);
  for (int64_t b = 0; b < d.batch; ++b) {
    load_pair(u + b * bs, rs, d.length, d, plan, grp.h0, grp.h1, ur, ui);
    load_pair(dy + b * bs, rs, d.length, d, plan, grp.h0, grp.h1, yr, yi);
    plan.transform(ur, ui, false);
    plan.transform(yr, yi, false);
    for (int64_t k = 0; k < n; ++k) {
      const Split su = split(ur, ui, k, n), sd = split(yr, yi, k, n);
      // S_c += conj(U_c) DY_c (the kernel gradients' spectra, summed over the batch).
      s1r[k] += su.r1 * sd.r1 + su.i1 * sd.i1;
      s1i[k] += su.r1 * sd.i1 - su.i1 * sd.r1;
      s2r[k] += su.r2 * sd.r2 + su.i2 * sd.i2;
      s2i[k] += su.r2 * sd.i2 - su.i2 * sd.r2;
      // W = DY1 conj(K1) + i DY2 conj(K2), bit-reversed for the inverse.
      const v8 ar = sd.r1 * k1r[k] + sd.i1 * k1i[k], ai = sd.i1 * k1r[k] - sd.r1 * k1i[k];
      const v8 br = sd.r2 * k2r[k] + sd.i2 * k2i[k], bi = sd.i2 * k2r[k] - sd.r2 * k2i[k];
      const int64_t dst = plan.rev[k];
      pr[dst] = ar - bi;
      pi[dst] = ai + br;
    }
    plan.transform(pr, pi, true);
    store_pair(pr, pi, rs, d.length, d, grp.h0, grp.h1, inv_n, du + b * bs);
  }
  // S1 + i S2 (both Hermitian) -> dkc1 + i dkc2.
  for (int64_t k = 0; k < n; ++k) {
    const int64_t dst = plan.rev[k];
    pr[dst] = s1r[k] - s2i[k];
    pi[dst] = s1i[k] + s2r[k];
  }
  plan.transform(pr, pi, true);
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
