// Shared by the native XLA:CPU kernels (fused_attention.cc, fft_conv.cc, weight_grad.cc): 8-float
// vectors, the register-tiled transposed product and a parallel loop on XLA's intra-op thread
// pool.
#ifndef SPTLIB_KERNELS_CPU_COMMON_H_
#define SPTLIB_KERNELS_CPU_COMMON_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "xla/ffi/api/ffi.h"

namespace sptlib_cpu {

namespace ffi = xla::ffi;

// GCC/Clang vector extensions: 8 floats (one AVX2 register; two SSE/NEON registers elsewhere).
// Loads and stores go through the unaligned type.
typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));
typedef int32_t v8i __attribute__((vector_size(32)));

inline v8 load8(const float* p) { return *reinterpret_cast<const v8u*>(p); }
inline void store8(float* p, v8 x) { *reinterpret_cast<v8u*>(p) = x; }
inline v8 splat(float x) { return v8{x, x, x, x, x, x, x, x}; }

// Vector registers the register-tiled products may hold: AVX-512VL gives 32 (also for 8-float
// vectors).
#if defined(__AVX512VL__)
constexpr int kVecRegs = 32;
#else
constexpr int kVecRegs = 16;
#endif

// One register tile of out[a, 8 c + lane] (+)= sum_r x[r * xr + a * xa] w[r * w_stride + 8 c +
// lane] for a < A, c < V, r < rows: a transposed product xᵀ w (x read through two strides, so a
// row-major or a transposed x both work), vectorised along w's columns. Each loaded vector of w
// feeds A FMAs and the tile stays in registers over all r.
template <bool ACC, int A, int V>
inline void tile_tn(const float* x, int64_t xr, int64_t xa, const float* w, int64_t w_stride,
                    int64_t rows, float* out, int64_t out_stride) {
  v8 acc[A][V];
  for (int a = 0; a < A; ++a)
    for (int c = 0; c < V; ++c) acc[a][c] = ACC ? load8(out + a * out_stride + 8 * c) : splat(0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    v8 wr[V];
    for (int c = 0; c < V; ++c) wr[c] = load8(w + r * w_stride + 8 * c);
    for (int a = 0; a < A; ++a) {
      const v8 xv = splat(x[r * xr + a * xa]);
      for (int c = 0; c < V; ++c) acc[a][c] += xv * wr[c];
    }
  }
  for (int a = 0; a < A; ++a)
    for (int c = 0; c < V; ++c) store8(out + a * out_stride + 8 * c, acc[a][c]);
}

// out[n, cols] (+)= xᵀ w for x [rows, >= n] (element (r, a) at x[r * xr + a * xa]) and
// w [rows, cols] (cols a multiple of 8): attention's scores (x = Q or dO with xr = 1, w = Kᵀ or
// Vᵀ, rows = head_dim) and dVᵀ += Pᵀ dO, dKᵀ += dSᵀ Q over a block of query rows; the dense
// layers' weight gradients xᵀ g. Tiles of 8 output rows (each loaded vector of w feeds 8 FMAs):
// on Zen 4 ~105 GFLOP/s on one core from L1, against ~80 with 4 rows.
template <bool ACC>
inline void product_tn(const float* x, int64_t xr, int64_t xa, int64_t n, const float* w,
                       int64_t w_stride, int64_t rows, int64_t cols, float* out,
                       int64_t out_stride) {
  constexpr int A = 8, V = kVecRegs >= 32 ? 2 : 1;
  int64_t a = 0;
  for (; a + A <= n; a += A) {
    float* o = out + a * out_stride;
    int64_t j = 0;
    for (; j + 8 * V <= cols; j += 8 * V)
      tile_tn<ACC, A, V>(x + a * xa, xr, xa, w + j, w_stride, rows, o + j, out_stride);
    for (; j < cols; j += 8)
      tile_tn<ACC, A, 1>(x + a * xa, xr, xa, w + j, w_stride, rows, o + j, out_stride);
  }
  for (; a < n; ++a)
    for (int64_t j = 0; j < cols; j += 8)
      tile_tn<ACC, 1, 1>(x + a * xa, xr, xa, w + j, w_stride, rows, out + a * out_stride + j,
                         out_stride);
}

// Runs fn(0..n-1) on the caller and the XLA intra-op pool. Workers claim indices from a shared
// counter; the caller waits only for claimed indices, so a worker the pool starts late (or never,
// when its threads are busy elsewhere) finds nothing left and cannot deadlock the call.
inline void parallel_for(ffi::ThreadPool& pool, int64_t n, const std::function<void(int64_t)>& fn) {
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

}  // namespace sptlib_cpu

#endif  // SPTLIB_KERNELS_CPU_COMMON_H_
