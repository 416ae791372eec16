// Shared by the native XLA:CPU kernels (fused_attention.cc, fft_conv.cc): 8-float vectors and a
// parallel loop on XLA's intra-op thread pool.
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
