// QuaRot-style Hadamard rotations (Ashkboos et al. 2024) as pure functions on f32 data: the
// rotation itself (a fast Walsh-Hadamard transform per row) and the weight transformations
// that fold it into a Llama-family checkpoint. The model integration lives elsewhere; this
// file only provides the linear algebra and its contract.
//
// ---- The rotation --------------------------------------------------------------------------
// For a width n, Q = diag(s) * blockdiag(H_b / sqrt(b), ..., H_b / sqrt(b)) (n / b blocks)
// where
//   b   = the largest power of two dividing n (576 -> 64, 704 -> 64, 256 -> 256, 4096 -> 4096);
//         n must be a positive multiple of kMinHadamardBlock (8): a smaller block would spread
//         an outlier over fewer than 8 channels, which is not worth a rotation.
//   H_b = the Sylvester Hadamard matrix, H_1 = [1], H_2k = [[H_k, H_k], [H_k, -H_k]], so
//         H_b[i][j] = (-1)^popcount(i & j); it is symmetric and H_b H_b = b I.
//   s   = signs in {+1, -1}; s_i is bit 63 of splitmix64(seed + (i + 1) * 0x9E3779B97F4A7C15)
//         (1 -> -1, 0 -> +1), where splitmix64(z) = z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
//         z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31 (all uint64 arithmetic, mod 2^64).
//         This is counter based: a CUDA twin computes s_i from (seed, i) alone, and a saved
//         checkpoint needs only (n, seed) to rebuild Q. hadamard_sign(seed, i) is the reference.
// Q is orthogonal: Q Q^T = diag(s) Hn Hn^T diag(s) = I (Hn = the normalised block diagonal).
// Q^T = blockdiag(H_b / sqrt(b)) diag(s), since H_b is symmetric.
//
// Arithmetic order (what a bit-exact twin must reproduce; every step one f32 op, rounded to
// nearest even): rotate_rows computes t_i = x_i * c_i with c_i = s_i * f32(1 / sqrt(b)), then
// for h = 1, 2, 4, ..., b/2 and every pair (j, j + h) in a block with j % 2h < h:
// (t_j, t_{j+h}) <- (t_j + t_{j+h}, t_j - t_{j+h}). unrotate_rows runs the same butterflies on
// x first and multiplies by c_i last.
//
// ---- The recipe (residual width n = hidden_size, MLP width m = intermediate_size) ----------
// Goal: the residual stream x becomes x Q everywhere, every linear layer still computes the
// same function, and the activations the 4-bit layers see are rotated (outliers spread out).
// Let Q = make_hadamard_rotation(hidden_size, seed) and Q2 = make_hadamard_rotation(
// intermediate_size, seed2). For a checkpoint in f32 (bf16 weights converted first):
//   1. Fold every RMSNorm weight into the linear layers it feeds, then set the norm to ones:
//        attention_norm -> q_proj, k_proj, v_proj     (fold_norm_into_linear on each)
//        mlp_norm       -> gate_proj, up_proj
//        final norm     -> lm_head   (untie lm_head from the embedding first when
//                                     tie_word_embeddings: the two now differ)
//      Why first: RMSNorm(y) = y / sqrt(mean(y^2) + eps) * g. With y = x Q, mean(y^2) =
//      mean(x^2) because Q is orthogonal, so y / rms(y) = (x / rms(x)) Q exactly (eps
//      included): the normalisation commutes with Q. The elementwise * g does not:
//      (x Q) diag(g) != (x diag(g)) Q unless g is a constant. With g folded into the next
//      layer (W diag(g)) the norm is the pure normalisation and RMSNorm(x Q) = RMSNorm(x) Q.
//   2. Rotate the residual stream's writers and readers by Q:
//        embedding rows      E <- E Q            rotate_embedding        (x_0 becomes x_0 Q)
//        q/k/v/gate/up/lm_head inputs  W <- W Q  rotate_linear_input     ((x Q)(W Q)^T = x W^T;
//                                                                         biases unchanged)
//        o_proj, down_proj outputs   W <- Q^T W, bias b <- b Q           rotate_linear_output
//                                    (x W^T + b) Q = x (Q^T W)^T + b Q: they add into the
//                                    rotated stream, so the residual sums stay rotated.
//      Attention itself is untouched: q, k, v (and the KV cache, RoPE, softmax) are exactly
//      the unrotated ones, since their layers' inputs and weights rotated together.
//      The logits are unchanged: lm_head (W diag(g_final) Q) applied to RMSNorm(x) Q.
//   3. Online rotation of down_proj's input (the SwiGLU product h = silu(gate) * up, width m,
//      which has the worst outliers and is not part of the residual stream):
//        at run time       h <- h Q2            rotate_rows(Q2, h, tokens)  (before quantizing h)
//        offline           W_down <- W_down Q2  rotate_linear_input(Q2, ...) (its input side),
//      in addition to the output-side rotation of step 2 (W_down <- Q^T W_down Q2 overall;
//      the two commute, apply them in either order).
//   Then quantize the transformed weights (int4-channel etc.) as usual. The attention output
//   feeding o_proj stays unrotated here (QuaRot also rotates it, per head, through v_proj's
//   output and o_proj's input plus an online Hadamard over heads; not part of this recipe).
//   A saved checkpoint records (hidden_size, seed) and (intermediate_size, seed2); the
//   runtime needs Q2 (online) only; Q is entirely folded into the weights.
//
// ---- Layouts ---------------------------------------------------------------------------------
// Weight matrices are plain f32 row-major [rows x cols], a row = one output channel, used as
// y = x W^T (the layout of WeightMatrix). Activations / embedding tables are [rows x n] with
// one token (or one vocabulary entry) per row. All functions throw qspec::Error naming the
// sizes on a null pointer, a negative count or a width that does not match the rotation.
#pragma once
#include <cstdint>
#include <vector>

namespace qspec::quant {

inline constexpr int64_t kMinHadamardBlock = 8;

struct HadamardRotation {
  int64_t n = 0;       // width the rotation applies to
  int64_t block = 0;   // b: the largest power of two dividing n (>= kMinHadamardBlock)
  uint64_t seed = 0;   // the signs' seed (see hadamard_sign)
  std::vector<float> signs;  // s_i in {+1, -1}, n of them
};

// The i-th sign of a seed: +1 or -1 (the counter-based splitmix64 rule above).
float hadamard_sign(uint64_t seed, int64_t i);
// The largest power of two dividing n; throws unless n > 0 and the result is >= 8.
int64_t hadamard_block_size(int64_t n);
// Q for width n (throws like hadamard_block_size).
HadamardRotation make_hadamard_rotation(int64_t n, uint64_t seed);

// x <- x Q for each of `rows` rows of rotation.n contiguous values. O(n log b) per row;
// parallel over rows on ThreadPool::global() when there are many.
void rotate_rows(const HadamardRotation& rotation, float* x, int64_t rows);
// x <- x Q^T (the inverse), same layout.
void unrotate_rows(const HadamardRotation& rotation, float* x, int64_t rows);

// W <- W diag(g): column c of w[rows x cols] times norm_weight[c] (cols values). Afterwards
// the norm's weight must be replaced by ones. Biases are unaffected.
void fold_norm_into_linear(const float* norm_weight, float* w, int64_t rows, int64_t cols);

// A layer reading the rotated stream: W <- W Q (each row rotated; cols == rotation.n).
// Its bias, if any, is unchanged.
void rotate_linear_input(const HadamardRotation& rotation, float* w, int64_t rows, int64_t cols);

// A layer writing into the rotated stream: W <- Q^T W (rows == rotation.n, every column
// rotated) and, when bias is not null, bias[rows] <- bias Q.
void rotate_linear_output(const HadamardRotation& rotation, float* w, int64_t rows, int64_t cols,
                          float* bias);

// The embedding table [vocab x hidden]: E <- E Q (each token's row rotated; hidden == n).
void rotate_embedding(const HadamardRotation& rotation, float* embedding, int64_t vocab, int64_t hidden);

}  // namespace qspec::quant
