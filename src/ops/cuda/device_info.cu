// The CUDA backend's first brick: device discovery. Later kernels slot in beside it.
#include <cuda_runtime.h>

#include "ops/cuda/device_info.h"

namespace qspec::cuda {

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

std::string device_name(int device) {
  cudaDeviceProp props{};
  if (cudaGetDeviceProperties(&props, device) != cudaSuccess) return "";
  return props.name;
}

}  // namespace qspec::cuda
