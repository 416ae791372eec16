// Long convolution by FFT for XLA:CPU (an XLA FFI custom call), forward and backward.
//
// Why: XLA:CPU runs its FFTs on one thread, and the S4D block spends about half its time in
// them. Here each task is one group of 8 channels (one vector lane per channel, so the butterflies
// need no shuffles) and runs on XLA's intra-op thread pool; two batch elements share one complex
// transform (z = u_a + i u_b: the kernel's spectrum is that of a real signal, so
// IFFT(FFT(z) K) = y_a + i y_b).
//
// y[b, t, h] = sum_s u[b, s, h] kc[h, (t - s) mod n] for t < L: u [batch, L, H] zero-padded to n
// (a power of two >= 2L, so nothing wraps around for a causal kernel), kc [H, n] the circular
// kernel (a causal one padded with zeros; a two-sided one with its negative lags at the end).
// Backward: du = IFFT(FFT(dy) conj(K))[:L], dkc = Re IFFT(sum_b conj(U_b) DY_b).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float v8 __attribute__((vector_size(32)));

inline v8 splat(float x) { return v8{x, x, x, x, x, x, x, x}; }

// Runs fn(0..n-1) on the caller and the XLA intra-op pool (see fused_attention.cc: workers claim
// indices from a shared counter, the caller waits only for claimed ones).
void parallel_for(ffi::ThreadPool& pool, int64_t n, const std::function<void(int64_t)>& fn) {
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    int64_t n = 0;
    const std::function<void(int64_t)>* fn = nullptr;
    std::mutex mu;
    std::condition_variable cv;
  };
  auto st = std::make_shared<State>();
  st->n = n;
  st->fn = &fn;
  auto work = [st]() {
    int64_t claimed = 0;
    for (int64_t i; (i = st->next.fetch_add(1)) < st->n; ++claimed) (*st->fn)(i);
    if (claimed && st->done.fetch_add(claimed) + claimed == st->n) {
      std::lock_guard<std::mutex> lock(st->mu);
      st->cv.notify_all();
    }
  };
  const int64_t workers = std::min<int64_t>(pool.num_threads(), n - 1);
  for (int64_t w = 0; w < workers; ++w) pool.Schedule(decltype(work)(work));
  work();
  std::unique_lock<std::mutex> lock(st->mu);
  st->cv.wait(lock, [&] { return st->done.load() == st->n; });
}

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

struct Dims {
  int64_t batch, length, channels, n;
};

// Loads channels [8g, 8g + 8) of rows 0..L-1 of x[b] ([batch, L, H]) into lanes, bit-reversed
// and zero-padded to n: re from batch element `a`, im from `b` (b < 0: zeros).
void load_pair(const float* x, const Dims& d, const Plan& plan, int64_t a, int64_t b, int64_t g,
               v8* re, v8* im) {
  const int64_t h0 = 8 * g, lanes = std::min<int64_t>(8, d.channels - h0);
  for (int64_t i = 0; i < d.n; ++i) {
    const int64_t t = plan.rev[i];
    v8 r = splat(0.0f), m = splat(0.0f);
    if (t < d.length) {
      const float* pa = x + (a * d.length + t) * d.channels + h0;
      if (lanes == 8) {
        std::memcpy(&r, pa, sizeof(r));
        if (b >= 0) std::memcpy(&m, x + (b * d.length + t) * d.channels + h0, sizeof(m));
      } else {
        for (int64_t c = 0; c < lanes; ++c) {
          r[c] = pa[c];
          if (b >= 0) m[c] = x[(b * d.length + t) * d.channels + h0 + c];
        }
      }
    }
    re[i] = r;
    im[i] = m;
  }
}

// Stores lanes of re (to batch element a) and im (to b, if b >= 0) for t < L, scaled.
void store_pair(const v8* re, const v8* im, const Dims& d, int64_t a, int64_t b, int64_t g,
                float scale, float* y) {
  const int64_t h0 = 8 * g, lanes = std::min<int64_t>(8, d.channels - h0);
  for (int64_t t = 0; t < d.length; ++t) {
    const v8 r = re[t] * splat(scale), m = im[t] * splat(scale);
    float* pa = y + (a * d.length + t) * d.channels + h0;
    float* pb = b >= 0 ? y + (b * d.length + t) * d.channels + h0 : nullptr;
    for (int64_t c = 0; c < lanes; ++c) {
      pa[c] = r[c];
      if (pb) pb[c] = m[c];
    }
  }
}

// The spectrum of the circular kernels kc[h, 0..n) of channel group g (lanes = channels).
void kernel_spectrum(const float* kc, const Dims& d, const Plan& plan, int64_t g, v8* re,
                     v8* im) {
  const int64_t h0 = 8 * g, lanes = std::min<int64_t>(8, d.channels - h0);
  for (int64_t i = 0; i < d.n; ++i) {
    v8 r = splat(0.0f);
    const int64_t t = plan.rev[i];
    for (int64_t c = 0; c < lanes; ++c) r[c] = kc[(h0 + c) * d.n + t];
    re[i] = r;
    im[i] = splat(0.0f);
  }
  plan.transform(re, im, false);
}

void forward_group(const float* u, const float* kc, const Dims& d, const Plan& plan, int64_t g,
                   float* y) {
  std::vector<v8> kre(d.n), kim(d.n), re(d.n), im(d.n), pre(d.n), pim(d.n);
  kernel_spectrum(kc, d, plan, g, kre.data(), kim.data());
  const float inv_n = 1.0f / static_cast<float>(d.n);
  for (int64_t a = 0; a < d.batch; a += 2) {
    const int64_t b = a + 1 < d.batch ? a + 1 : -1;
    load_pair(u, d, plan, a, b, g, re.data(), im.data());
    plan.transform(re.data(), im.data(), false);
    // Multiply by K and reorder bit-reversed for the inverse transform in one pass.
    for (int64_t i = 0; i < d.n; ++i) {
      const int64_t s = plan.rev[i];
      pre[i] = re[s] * kre[s] - im[s] * kim[s];
      pim[i] = re[s] * kim[s] + im[s] * kre[s];
    }
    plan.transform(pre.data(), pim.data(), true);
    store_pair(pre.data(), pim.data(), d, a, b, g, inv_n, y);
  }
}

void backward_group(const float* u, const float* kc, const float* dy, const Dims& d,
                    const Plan& plan, int64_t g, float* du, float* dkc) {
  std::vector<v8> kre(d.n), kim(d.n), ure(d.n), uim(d.n), yre(d.n), yim(d.n), pre(d.n), pim(d.n);
  std::vector<v8> sre(d.n, splat(0.0f)), sim(d.n, splat(0.0f));
  kernel_spectrum(kc, d, plan, g, kre.data(), kim.data());
  const float inv_n = 1.0f / static_cast<float>(d.n);
  for (int64_t a = 0; a < d.batch; a += 2) {
    const int64_t b = a + 1 < d.batch ? a + 1 : -1;
    load_pair(u, d, plan, a, b, g, ure.data(), uim.data());
    load_pair(dy, d, plan, a, b, g, yre.data(), yim.data());
    plan.transform(ure.data(), uim.data(), false);
    plan.transform(yre.data(), yim.data(), false);
    for (int64_t i = 0; i < d.n; ++i) {
      // S += conj(Zu) Zd: its Hermitian part is sum over the pair of conj(U_b) DY_b.
      sre[i] += ure[i] * yre[i] + uim[i] * yim[i];
      sim[i] += ure[i] * yim[i] - uim[i] * yre[i];
    }
    for (int64_t i = 0; i < d.n; ++i) {  // Zd conj(K), bit-reversed for the inverse
      const int64_t s = plan.rev[i];
      pre[i] = yre[s] * kre[s] + yim[s] * kim[s];
      pim[i] = yim[s] * kre[s] - yre[s] * kim[s];
    }
    plan.transform(pre.data(), pim.data(), true);
    store_pair(pre.data(), pim.data(), d, a, b, g, inv_n, du);
  }
  for (int64_t i = 0; i < d.n; ++i) {
    const int64_t s = plan.rev[i];
    pre[i] = sre[s];
    pim[i] = sim[s];
  }
  plan.transform(pre.data(), pim.data(), true);
  const int64_t h0 = 8 * g, lanes = std::min<int64_t>(8, d.channels - h0);
  for (int64_t t = 0; t < d.n; ++t)
    for (int64_t c = 0; c < lanes; ++c) dkc[(h0 + c) * d.n + t] = pre[t][c] * inv_n;
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
  parallel_for(pool, (d.channels + 7) / 8, [&](int64_t g) {
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
  parallel_for(pool, (d.channels + 7) / 8, [&](int64_t g) {
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
