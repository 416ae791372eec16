// A dense layer's weight gradient on XLA:CPU (an XLA FFI custom call): dW = xᵀ g.
//
// Why: for the small weights of CPU-sized models (d_model 64, FFN 128) XLA:CPU transposes an
// operand (x or g, [tokens, features]) into a copy and then runs a dot whose output is too small
// to split well across threads. Here the token axis is split into a few fixed chunks, each chunk's
// partial xᵀ g is accumulated in register tiles from L1-resident blocks of 16 tokens, and the
// partials are summed in chunk order (so results do not depend on the thread count). It pays for
// small weights only (the partial sums stay in L1): sptlib.kernels.linear sends larger ones to
// XLA's dot.
//
// Layouts: x [tokens, k], g [tokens, n] (float32, row-major; n a multiple of 8), out [k, n].

#include <algorithm>
#include <cstdint>
#include <memory>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace sptlib_cpu;  // NOLINT: v8, load8, store8, product_tn, parallel_for

constexpr int64_t kBlock = 16;       // tokens per L1-resident block
constexpr int64_t kMinChunk = 1024;  // tokens per task, at least
constexpr int64_t kMaxChunks = 8;    // few partial sums: less memory and a short final sum

ffi::Error WeightGrad(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> g,
                      ffi::ResultBuffer<ffi::F32> out) {
  auto xd = x.dimensions(), gd = g.dimensions();
  if (xd.size() != 2 || gd.size() != 2 || xd[0] != gd[0] || gd[1] % 8 != 0)
    return ffi::Error::InvalidArgument("weight_grad: x [m, k], g [m, n] with n % 8 == 0");
  const int64_t m = xd[0], k = xd[1], n = gd[1];
  int64_t chunk = std::max(kMinChunk, (m + kMaxChunks - 1) / kMaxChunks);
  chunk = (chunk + kBlock - 1) / kBlock * kBlock;
  const int64_t chunks = std::max<int64_t>(1, (m + chunk - 1) / chunk);
  std::unique_ptr<float[]> partial(new float[chunks * k * n]);  // each chunk's first block writes
  const float *xp = x.typed_data(), *gp = g.typed_data();
  parallel_for(pool, chunks, [&](int64_t c) {
    float* o = partial.get() + c * k * n;
    for (int64_t r0 = c * chunk; r0 < std::min(m, (c + 1) * chunk); r0 += kBlock) {
      const int64_t rows = std::min(kBlock, m - r0);
      if (r0 == c * chunk)
        product_tn<false>(xp + r0 * k, k, 1, k, gp + r0 * n, n, rows, n, o, n);
      else
        product_tn<true>(xp + r0 * k, k, 1, k, gp + r0 * n, n, rows, n, o, n);
    }
  });
  float* dst = out->typed_data();
  std::copy(partial.get(), partial.get() + k * n, dst);
  for (int64_t c = 1; c < chunks; ++c) {
    const float* src = partial.get() + c * k * n;
    for (int64_t i = 0; i < k * n; i += 8) store8(dst + i, load8(dst + i) + load8(src + i));
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SptlibWeightGrad, WeightGrad,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
