#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>

#include "ops/cuda/common.h"
#include "ops/cuda/kernels/w4_s8_wgmma.cuh"
#include "ops/cuda/kernels/w4_s8_wgmma_fused.cuh"
#include "ops/cuda/kernels/w4_s8_wgmma_rs.cuh"
#include "ops/cuda/kernels/w4a16_plan.h"
#include "ops/cuda/ops.h"
#include "ops/cuda/w4_detail.h"

namespace qspec::cuda {
namespace {

// The default tile (variant 0) and the ones benchmarks compare (w4_s8_gemm_unpacked's variant).
using Tile = kernels::W4S8WgmmaTile<5, 2, 3>;  // 3 of 8 sums by I2F: 1.00-1.10x the IADD + FADD-only tile
template <int V> struct Variant;
template <> struct Variant<1> { using T = kernels::W4S8WgmmaTile<5, 2, 0>; };
template <> struct Variant<2> { using T = kernels::W4S8WgmmaTile<5, 4>; };
template <> struct Variant<3> { using T = kernels::W4S8WgmmaTile<5, 2, 2>; };
template <> struct Variant<4> { using T = kernels::W4S8WgmmaTile<5, 2, 3>; };
// 5: the fused kernel's warp-specialized loop on the unpacked weights (a producer warpgroup issues
// the TMA, the mma warpgroups decoupled by mbarriers, no block barrier a stage): measured equal.
template <> struct Variant<5> { using T = kernels::W4S8FusedTile<5, 0, 2, 3, false, 4, kernels::kSourceUnpackedTma>; };

// The fused kernel (unpack in the producer warpgroup): the default tile and the benchmarks' variants.
// (operand slots, packed slots, groups an iteration, I2F of 8, stagger, producer batch)
using FusedTile = kernels::W4S8FusedTile<4, 8, 2, 3, false, 4>;
template <int V> struct FusedVariant;
template <> struct FusedVariant<1> { using T = kernels::W4S8FusedTile<4, 8, 2, 3, false, 2>; };
template <> struct FusedVariant<2> { using T = kernels::W4S8FusedTile<4, 8, 2, 3, true, 4>; };
template <> struct FusedVariant<3> { using T = kernels::W4S8FusedTile<5, 8, 2, 3, false, 4>; };

// The cooperative kernel (the row tile's blocks unpack its weights into the workspace together,
// during the GEMM). Ring slots and stagger measured alike (5 / 6 slots, staggered: ±1.5 %).
using CooperativeTile = kernels::W4S8FusedTile<5, 0, 2, 3, false, 4, kernels::kSourceCooperative>;

// The register-A kernel (packed weights by TMA, A fragments unpacked in the mma threads): the
// default and the benchmarks' variants. (ring stages of 24 KB, groups an iteration, I2F of 8)
using RegisterTile = kernels::W4S8RegisterTile<4, 2, 3>;
template <int V> struct RegisterVariant;
template <> struct RegisterVariant<1> { using T = kernels::W4S8RegisterTile<3, 2, 3>; };
template <> struct RegisterVariant<2> { using T = kernels::W4S8RegisterTile<5, 2, 3>; };
template <> struct RegisterVariant<3> { using T = kernels::W4S8RegisterTile<6, 2, 3>; };
template <> struct RegisterVariant<4> { using T = kernels::W4S8RegisterTile<4, 2, 4>; };
template <> struct RegisterVariant<5> { using T = kernels::W4S8RegisterTile<4, 2, 2>; };
template <> struct RegisterVariant<6> { using T = kernels::W4S8RegisterTile<4, 2, 0>; };

// cuTensorMapEncodeTiled from the driver the runtime loaded (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* pointer = nullptr;
    cudaDriverEntryPointQueryResult status{};
    QSPEC_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &pointer, 12000, cudaEnableDefault,
                                                      &status));
    QSPEC_CHECK(status == cudaDriverEntryPointSuccess && pointer != nullptr,
                "cuda: the driver has no cuTensorMapEncodeTiled (TMA needs CUDA 12 or newer)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(pointer);
  }();
  return fn;
}

// A row-major int8 matrix [rows][cols] (rows `pitch` bytes apart) as 128 x 128-byte boxes in the
// 128-byte swizzle the wgmma descriptors expect; out-of-range rows read as zeros.
CUtensorMap int8_box_map(const void* base, int64_t rows, int64_t cols, int64_t pitch, const char* who) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(pitch)};
  const cuuint32_t box[2] = {128, 128}, element_strides[2] = {1, 1};
  const CUresult result = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides,
                                         box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                         CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  QSPEC_CHECK(result == CUDA_SUCCESS, who, ": cuTensorMapEncodeTiled failed (error ", static_cast<int>(result),
              ") for a ", rows, " x ", cols, " int8 matrix, pitch ", pitch);
  return map;
}

}  // namespace

CUtensorMap detail::tiled_tensor_map(CUtensorMapDataType type, int rank, const void* base, const uint64_t* dims,
                                     const uint64_t* strides, const uint32_t* box, CUtensorMapSwizzle swizzle,
                                     const char* who) {
  CUtensorMap map{};
  cuuint64_t dims_[3] = {}, strides_[2] = {};
  cuuint32_t box_[3] = {}, element_strides[3] = {1, 1, 1};
  for (int i = 0; i < rank; ++i) {
    dims_[i] = dims[i];
    box_[i] = box[i];
    if (i + 1 < rank) strides_[i] = strides[i];
  }
  const CUresult result =
      encode_tiled()(&map, type, static_cast<cuuint32_t>(rank), const_cast<void*>(base), dims_, strides_, box_,
                     element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  QSPEC_CHECK(result == CUDA_SUCCESS, who, ": cuTensorMapEncodeTiled failed (error ", static_cast<int>(result), ") for a ",
              rank, "-d tensor of ", dims[0], " x ", dims[1], rank > 2 ? " x " + std::to_string(dims[2]) : "");
  return map;
}

CUtensorMap detail::f16_box_map(const void* base, int64_t rows, int64_t cols, int64_t pitch_bytes, int box_cols,
                                int box_rows, const char* who) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(pitch_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<void*>(base), dims,
                                         strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                         CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  QSPEC_CHECK(result == CUDA_SUCCESS, who, ": cuTensorMapEncodeTiled failed (error ", static_cast<int>(result),
              ") for a ", rows, " x ", cols, " f16 matrix, pitch ", pitch_bytes, " bytes, box ", box_cols, " x ",
              box_rows);
  return map;
}

namespace {

// The packed weights (ops/w4a16_pack.h: [row blocks][k * 8 bytes]) as 128-byte rows, k / 16 of
// them a row block, in boxes of one stage (8 rows) of 8 row blocks, 128-byte swizzle; row blocks
// past the matrix read as zeros.
CUtensorMap packed_stage_map(const void* codes, int64_t row_blocks, int64_t k, const char* who) {
  CUtensorMap map{};
  const cuuint64_t dims[3] = {128, static_cast<cuuint64_t>(k / 16), static_cast<cuuint64_t>(row_blocks)};
  const cuuint64_t strides[2] = {128, static_cast<cuuint64_t>(k * 8)};
  const cuuint32_t box[3] = {128, 8, 8}, element_strides[3] = {1, 1, 1};
  const CUresult result = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(codes), dims,
                                         strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                         CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  QSPEC_CHECK(result == CUDA_SUCCESS, who, ": cuTensorMapEncodeTiled failed (error ", static_cast<int>(result),
              ") for packed weights of ", row_blocks, " row blocks, k ", k);
  return map;
}

// One wgmma GEMM launch over (token tiles, row tiles), PDL, with the kernel's dynamic shared memory
// (the opt-in above 48 KB set once per kernel); the caller checks the launch.
template <auto KERNEL>
void launch_grid(int smem_bytes, int threads, const CUtensorMap& w_map, const CUtensorMap& x_map,
                 const kernels::W4S8WgmmaParams& params, int64_t token_tiles, int64_t row_tiles, cudaStream_t stream) {
  static const bool configured = [&] {
    QSPEC_CUDA_CHECK(cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
    return true;
  }();
  (void)configured;
  launch_pdl(KERNEL, dim3(static_cast<unsigned>(token_tiles), static_cast<unsigned>(row_tiles)), dim3(threads),
             smem_bytes, stream, w_map, x_map, params);
}

template <class T>
void launch_registers(const CUtensorMap& w_map, const CUtensorMap& x_map, const kernels::W4S8WgmmaParams& params,
                      int64_t token_tiles, int64_t row_tiles, cudaStream_t stream) {
  launch_grid<kernels::w4_s8_wgmma_rs_kernel<T>>(T::kSmemBytes, T::kThreads, w_map, x_map, params, token_tiles,
                                                 row_tiles, stream);
  QSPEC_CUDA_CHECK_LAUNCH("w4_s8_wgmma_rs_kernel");
}

template <class T, bool E4M3>
void launch_tile(const CUtensorMap& w_map, const CUtensorMap& x_map, const kernels::W4S8WgmmaParams& params,
                 int64_t token_tiles, int64_t row_tiles, cudaStream_t stream) {
  launch_grid<kernels::w4_s8_wgmma_kernel<T, E4M3>>(T::kSmemBytes, T::kThreads, w_map, x_map, params, token_tiles,
                                                    row_tiles, stream);
  QSPEC_CUDA_CHECK_LAUNCH("w4_s8_wgmma_kernel");
}

template <class T>
void launch_tile(bool e4m3, const CUtensorMap& w_map, const CUtensorMap& x_map, const kernels::W4S8WgmmaParams& params,
                 int64_t token_tiles, int64_t row_tiles, cudaStream_t stream) {
  if (e4m3) launch_tile<T, true>(w_map, x_map, params, token_tiles, row_tiles, stream);
  else launch_tile<T, false>(w_map, x_map, params, token_tiles, row_tiles, stream);
}

template <class T, bool E4M3>
void launch_fused(const CUtensorMap& w_map, const CUtensorMap& x_map, const kernels::W4S8WgmmaParams& params,
                  int64_t token_tiles, int64_t row_tiles, cudaStream_t stream) {
  launch_grid<kernels::w4_s8_wgmma_fused_kernel<T, E4M3>>(T::kSmemBytes, T::kThreads, w_map, x_map, params,
                                                          token_tiles, row_tiles, stream);
  QSPEC_CUDA_CHECK_LAUNCH("w4_s8_wgmma_fused_kernel");
}

// The packed weights as 8-bit operands: int8 u - 8, or (E4M3) its e4m3 code.
template <bool E4M3>
void unpack_a8(const W4A16Weights& w, int8_t* out, void* stream, const char* who) {
  const kernels::W4A16Layout layout = detail::w4a16_layout(w);
  QSPEC_CHECK(layout.tail == 0 && is_aligned_16(out), who, ": needs k % 64 == 0 (k ", w.k,
              ") and a 16-byte aligned output");
  const int64_t pieces = static_cast<int64_t>(layout.row_blocks) * layout.full_chunks * 32;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((pieces + threads - 1) / threads, int64_t{multiprocessor_count()} * 16);
  if (blocks == 0) return;
  launch_pdl(kernels::w4_unpack_a8_kernel<E4M3>, dim3(static_cast<unsigned>(blocks)), dim3(threads), 0,
             as_stream(stream), layout, out);
  QSPEC_CUDA_CHECK_LAUNCH("w4_unpack_a8_kernel");
}

// Whether the wgmma kernel that would run on this device is the sm_90a build (the sm_80 pass
// compiles it to a trap; an sm_90a binary runs only on compute capability 9.0).
bool wgmma_kernel_runs_here() {
  static const bool runs = detail::sm90a_build_runs(kernels::w4_s8_wgmma_kernel<Tile>);
  return runs;
}

// Where the unpacked weights live in a wgmma workspace: after the counter region (its split-K
// half the small-M and tiled kernels expect zero), for the unpack kernel and the cooperative one.
int8_t* unpacked_weights_in(void* workspace) {
  return reinterpret_cast<int8_t*>(static_cast<char*>(workspace) + detail::kW4A16CounterBytes);
}

}  // namespace

bool w4_s8_wgmma_supports(const W4A16Weights& w, quant::Format format) {
  return (format == quant::Format::int8 || format == quant::Format::fp8) && w.k % Tile::kStageK == 0 &&
         w.group == 128 && !w.has_min() && wgmma_kernel_runs_here();  // no int4-asym variant
}

size_t w4_s8_wgmma_workspace_bytes(int64_t n, int64_t k) {
  return detail::kW4A16CounterBytes + static_cast<size_t>((n + 15) / 16) * 16 * static_cast<size_t>(k);
}

void w4_unpack_s8(const W4A16Weights& w, int8_t* out, void* stream) {
  unpack_a8<false>(w, out, stream, "cuda::w4_unpack_s8");
}

void w4_unpack_e4m3(const W4A16Weights& w, uint8_t* out, void* stream) {
  unpack_a8<true>(w, reinterpret_cast<int8_t*>(out), stream, "cuda::w4_unpack_e4m3");
}

namespace {

// The checks and kernel parameters both wgmma GEMMs share.
kernels::W4S8WgmmaParams wgmma_params(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y,
                                      int64_t ldy, const char* who) {
  QSPEC_CHECK(w4_s8_wgmma_supports(w, x.format), who, ": needs an sm_90a GPU and build, int8 or fp8 activations (got ",
              kernels::format_label(x.format), "), k % 128 == 0 and weight groups of 128 (k ", w.k, ", group ", w.group,
              ")");
  const kernels::ActivationRows rows = detail::activation_rows(x, m, w, who);
  QSPEC_CHECK(ldy >= w.n, who, ": ldy ", ldy, " < n ", w.n);
  QSPEC_CHECK(x.format != quant::Format::fp8 || x.e4m3, who,
              ": fp8 activations must be e4m3 codes here (quantize_activations with e4m3_codes), not f16 values");
  QSPEC_CHECK(ceil_div(w.n, int64_t{128}) <= 65535, who, ": n ", w.n, " too large");
  kernels::W4S8WgmmaParams params{};
  params.codes = static_cast<const uint8_t*>(w.codes);
  params.scales = static_cast<const uint32_t*>(w.scales);
  params.n = static_cast<int>(w.n);
  params.k = static_cast<int>(w.k);
  params.rows = static_cast<int>((w.n + 15) / 16 * 16);
  params.groups = static_cast<int>(w.k / w.group);
  params.a = rows;
  params.y = reinterpret_cast<__half*>(y);
  params.ldy = ldy;
  params.m = static_cast<int>(m);
  params.vector_store = is_aligned_16(y) && ldy % 8 == 0;
  return params;
}

}  // namespace

void w4_s8_gemm_unpacked(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, const int8_t* w8, f16_bits* y,
                         int64_t ldy, void* stream, int variant) {
  const char* who = "cuda::w4_s8_gemm_unpacked";
  QSPEC_CHECK(variant >= 0 && variant <= kW4S8WgmmaVariants, who, ": unknown variant ", variant);
  const kernels::W4S8WgmmaParams params = wgmma_params(x, m, w, y, ldy, who);
  QSPEC_CHECK(w8 != nullptr && is_aligned_16(w8), who, ": the unpacked weights must be 16-byte aligned");
  if (m == 0) return;
  const int64_t token_tiles = ceil_div(m, Tile::kTokens), row_tiles = ceil_div(w.n, Tile::kRows);
  const CUtensorMap w_map = int8_box_map(w8, params.rows, w.k, w.k, who);
  const CUtensorMap x_map = int8_box_map(x.values, m, w.k, x.ldx, who);
  const bool e4m3 = x.format == quant::Format::fp8;
  QSPEC_CHECK(!e4m3 || variant == 0, who, ": fp8 runs the default tile only (variant ", variant, ")");
  switch (variant) {
    case 1: launch_tile<Variant<1>::T, false>(w_map, x_map, params, token_tiles, row_tiles, as_stream(stream)); break;
    case 2: launch_tile<Variant<2>::T, false>(w_map, x_map, params, token_tiles, row_tiles, as_stream(stream)); break;
    case 3: launch_tile<Variant<3>::T, false>(w_map, x_map, params, token_tiles, row_tiles, as_stream(stream)); break;
    case 4: launch_tile<Variant<4>::T, false>(w_map, x_map, params, token_tiles, row_tiles, as_stream(stream)); break;
    case 5: launch_fused<Variant<5>::T, false>(w_map, x_map, params, token_tiles, row_tiles, as_stream(stream)); break;
    default: launch_tile<Tile>(e4m3, w_map, x_map, params, token_tiles, row_tiles, as_stream(stream)); break;
  }
}

void w4_s8_gemm_fused(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y, int64_t ldy,
                      void* stream, int variant) {
  const char* who = "cuda::w4_s8_gemm_fused";
  QSPEC_CHECK(variant >= 0 && variant <= kW4S8FusedVariants, who, ": unknown variant ", variant);
  const kernels::W4S8WgmmaParams params = wgmma_params(x, m, w, y, ldy, who);
  QSPEC_CHECK(is_aligned_16(w.codes), who, ": the packed weights must be 16-byte aligned (bulk copies)");
  if (m == 0) return;
  const int64_t token_tiles = ceil_div(m, FusedTile::kTokens), row_tiles = ceil_div(w.n, FusedTile::kRows);
  const CUtensorMap x_map = int8_box_map(x.values, m, w.k, x.ldx, who);
  const cudaStream_t s = as_stream(stream);
  const bool e4m3 = x.format == quant::Format::fp8;
  switch (variant) {
    case 1:
      if (e4m3) launch_fused<FusedVariant<1>::T, true>(x_map, x_map, params, token_tiles, row_tiles, s);
      else launch_fused<FusedVariant<1>::T, false>(x_map, x_map, params, token_tiles, row_tiles, s);
      break;
    case 2:
      QSPEC_CHECK(!e4m3, who, ": fp8 runs variants 0 and 1 only");
      launch_fused<FusedVariant<2>::T, false>(x_map, x_map, params, token_tiles, row_tiles, s);
      break;
    case 3:
      QSPEC_CHECK(!e4m3, who, ": fp8 runs variants 0 and 1 only");
      launch_fused<FusedVariant<3>::T, false>(x_map, x_map, params, token_tiles, row_tiles, s);
      break;
    default:
      if (e4m3) launch_fused<FusedTile, true>(x_map, x_map, params, token_tiles, row_tiles, s);
      else launch_fused<FusedTile, false>(x_map, x_map, params, token_tiles, row_tiles, s);
      break;
  }
}

void w4_s8_gemm_registers(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y, int64_t ldy,
                          void* stream, int variant) {
  const char* who = "cuda::w4_s8_gemm_registers";
  QSPEC_CHECK(variant >= 0 && variant <= kW4S8RegisterVariants, who, ": unknown variant ", variant);
  const kernels::W4S8WgmmaParams params = wgmma_params(x, m, w, y, ldy, who);
  QSPEC_CHECK(x.format == quant::Format::int8, who, ": int8 activations only (got ", kernels::format_label(x.format),
              ")");
  QSPEC_CHECK(is_aligned_16(w.codes), who, ": the packed weights must be 16-byte aligned (TMA)");
  if (m == 0) return;
  const int64_t token_tiles = ceil_div(m, RegisterTile::kTokens), row_tiles = ceil_div(w.n, RegisterTile::kRows);
  const CUtensorMap w_map = packed_stage_map(w.codes, params.rows / 16, w.k, who);
  const CUtensorMap x_map = int8_box_map(x.values, m, w.k, x.ldx, who);
  const cudaStream_t s = as_stream(stream);
  switch (variant) {
    case 1: launch_registers<RegisterVariant<1>::T>(w_map, x_map, params, token_tiles, row_tiles, s); break;
    case 2: launch_registers<RegisterVariant<2>::T>(w_map, x_map, params, token_tiles, row_tiles, s); break;
    case 3: launch_registers<RegisterVariant<3>::T>(w_map, x_map, params, token_tiles, row_tiles, s); break;
    case 4: launch_registers<RegisterVariant<4>::T>(w_map, x_map, params, token_tiles, row_tiles, s); break;
    case 5: launch_registers<RegisterVariant<5>::T>(w_map, x_map, params, token_tiles, row_tiles, s); break;
    case 6: launch_registers<RegisterVariant<6>::T>(w_map, x_map, params, token_tiles, row_tiles, s); break;
    default: launch_registers<RegisterTile>(w_map, x_map, params, token_tiles, row_tiles, s); break;
  }
}

void w4_s8_gemm_cooperative(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y, int64_t ldy,
                            void* workspace, size_t workspace_bytes, void* stream) {
  const char* who = "cuda::w4_s8_gemm_cooperative";
  kernels::W4S8WgmmaParams params = wgmma_params(x, m, w, y, ldy, who);
  const size_t needed = w4_s8_wgmma_workspace_bytes(w.n, w.k);
  QSPEC_CHECK(workspace != nullptr && workspace_bytes >= needed, who, ": needs ", needed,
              " bytes of workspace (the int8 weights), got ", workspace_bytes);
  QSPEC_CHECK(w4_s8_cooperative_supports(w), who, ": ", ceil_div(w.n, int64_t{128}), " row tiles x ", w.k / 128,
              " stages of flags do not fit the workspace's flag region (", kernels::kW4S8CooperativeFlagCapacity, ")");
  if (m == 0) return;
  const int64_t token_tiles = ceil_div(m, CooperativeTile::kTokens), row_tiles = ceil_div(w.n, CooperativeTile::kRows);
  // The flags in the counter region's second half (epochs, kernels/w4_s8_wgmma_fused.cuh), the
  // unpacked weights where the unpack kernel puts them.
  params.stage_flags = reinterpret_cast<int*>(static_cast<char*>(workspace) + detail::kW4S8CooperativeFlagsOffset);
  params.unpacked = unpacked_weights_in(workspace);
  // A block unpacks its stages of the row tile a wave ahead as well (the row tiles a wave holds).
  params.lookahead_rows = static_cast<int>(ceil_div(int64_t{multiprocessor_count()}, token_tiles));
  const CUtensorMap w_map = int8_box_map(params.unpacked, params.rows, w.k, w.k, who);
  const CUtensorMap x_map = int8_box_map(x.values, m, w.k, x.ldx, who);
  const cudaStream_t s = as_stream(stream);
  const bool e4m3 = x.format == quant::Format::fp8;
  if (e4m3) launch_fused<CooperativeTile, true>(w_map, x_map, params, token_tiles, row_tiles, s);
  else launch_fused<CooperativeTile, false>(w_map, x_map, params, token_tiles, row_tiles, s);
}

bool w4_s8_cooperative_supports(const W4A16Weights& w) {
  const int64_t row_tiles = ceil_div(w.n, int64_t{128}), stages = w.k / 128;
  return row_tiles * stages <= kernels::kW4S8CooperativeFlagCapacity;
}

void w4_quantized_gemm_s8_wgmma(const QuantizedActivations& x, int64_t m, const W4A16Weights& w, f16_bits* y,
                                int64_t ldy, void* workspace, size_t workspace_bytes, void* stream) {
  const char* who = "cuda::w4_quantized_gemm_s8_wgmma";
  // int8: the register-A kernel (no unpack kernel, no scratch weights; docs/perf-journal/perf-notes-journal-2026.md). fp8,
  // or int8 with QSPEC_W4S8_REGISTERS=0: the unpack kernel into the workspace, then the GEMM
  // (1.07-1.15x faster than the fused kernel). QSPEC_W4S8_FUSED=1 / QSPEC_W4S8_COOPERATIVE=1
  // (benchmark knobs) dispatch the fused or the cooperative kernel instead.
  static const bool fused = env_int("QSPEC_W4S8_FUSED", 0, 0, 1) == 1;
  static const bool cooperative = env_int("QSPEC_W4S8_COOPERATIVE", 0, 0, 1) == 1;
  static const bool registers = env_int("QSPEC_W4S8_REGISTERS", 1, 0, 1) == 1;
  const size_t needed = w4_s8_wgmma_workspace_bytes(w.n, w.k);
  QSPEC_CHECK(workspace != nullptr && workspace_bytes >= needed, who, ": needs ", needed,
              " bytes of workspace (the int8 weights), got ", workspace_bytes);
  if (m == 0) return;
  if (fused) {
    w4_s8_gemm_fused(x, m, w, y, ldy, stream);
    return;
  }
  if (registers && x.format == quant::Format::int8 && !cooperative) {
    w4_s8_gemm_registers(x, m, w, y, ldy, stream);
    return;
  }
  if (cooperative && w4_s8_cooperative_supports(w)) {
    w4_s8_gemm_cooperative(x, m, w, y, ldy, workspace, workspace_bytes, stream);
    return;
  }
  int8_t* const w8 = unpacked_weights_in(workspace);
  if (x.format == quant::Format::fp8) w4_unpack_e4m3(w, reinterpret_cast<uint8_t*>(w8), stream);
  else w4_unpack_s8(w, w8, stream);
  w4_s8_gemm_unpacked(x, m, w, w8, y, ldy, stream);
}

}  // namespace qspec::cuda
