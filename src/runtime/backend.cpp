// What every backend shares (runtime/backend.h): the refusals of the optional operations, and
// the GPU backend's stand-in in builds without CUDA.
#include "runtime/backend.h"

#include "qspec/error.h"

namespace qspec {

std::vector<int32_t> Backend::sample_rows(std::span<const RowDraw>) {
  fail("engine: this backend does not sample on the device (samples_on_device is false)");
}

bool cuda_stores_kv_cache(KvCacheFormat format) {
  // Both: the GPU's 8-bit cache is GpuLlamaOptions::kv_cache (its kernels follow ops/kv_int8.h's
  // rule). The one place a format the GPU lacks would be refused.
  return format == KvCacheFormat::f16 || format == KvCacheFormat::int8;
}

#ifndef QSPEC_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(const LlamaModel&, const RunMode&, const EngineOptions&, int64_t) {
  fail("engine: device cuda: this qspec was built without the CUDA backend (configure with -DQSPEC_CUDA=ON on a "
       "machine with the CUDA toolkit)");
}
#endif

}  // namespace qspec
