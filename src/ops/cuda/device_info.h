// CUDA device discovery. Plain C++ interface: no CUDA types leak out of ops/cuda.
#pragma once
#include <string>

namespace qspec::cuda {
int device_count();  // 0 when no driver or no GPU
std::string device_name(int device);
}  // namespace qspec::cuda
