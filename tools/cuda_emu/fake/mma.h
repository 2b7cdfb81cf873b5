// Emulation stand-in for <mma.h>'s nvcuda::wmma (tools/cuda_emu/README.md): the bf16 / fp32
// 16x16x16 fragments the kernels use. Fragments are opaque in the API (which lane holds which
// element is unspecified), so a matrix-level emulation is exact to it: every lane's fragment
// holds the whole tile. What the API promises or requires is checked or reproduced:
//  * load / store / mma are warp-collective "_sync" calls: every lane of the warp waits for the
//    others on entry (a __syncwarp), so data written before them by other lanes is seen only
//    if the program synchronised (the fibers run one at a time between barriers);
//  * a store writes only the calling lane's share of the elements (element i by lane i % 32),
//    so reading the stored tile without a barrier after the store shows NaN-filled or stale
//    memory, as reading another lane's registers' store would race on hardware;
//  * pointers must be 256-bit aligned and ldm a multiple of 16 bytes (CUDA's rules); a
//    violation aborts;
//  * mma_sync forms each product exactly (bf16 x bf16 fits in fp32) and accumulates in fp32
//    in ascending k, starting from C (the hardware's order is unspecified; this is one valid
//    order, which is why device results are compared with tolerances).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "cuda_bf16.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {

template <typename Use, int M, int N, int K>
struct Shape;
template <int M, int N, int K>
struct Shape<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct Shape<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct Shape<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};

inline void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "EMU: wmma: %s\n", what);
    std::abort();
  }
}

inline int Lane() {
  const unsigned flat = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  return static_cast<int>(flat % 32);
}

inline float Widen(const __nv_bfloat16& v) {
  const uint32_t bits = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline float Widen(float v) { return v; }

template <typename T>
void CheckPointer(const T* p, unsigned ldm) {
  Check(reinterpret_cast<uintptr_t>(p) % 32 == 0, "pointer not 256-bit aligned");
  Check((ldm * sizeof(T)) % 16 == 0, "ldm not a multiple of 16 bytes");
}

}  // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
class fragment {
 public:
  static constexpr int rows = detail::Shape<Use, M, N, K>::rows;
  static constexpr int cols = detail::Shape<Use, M, N, K>::cols;
  static constexpr int num_elements = rows * cols;  // the whole tile, in every lane
  T x[num_elements];
};

template <typename Use, int M, int N, int K, typename T, typename Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const T& v) {
  for (int i = 0; i < f.num_elements; ++i) f.x[i] = v;
}

// matrix_a / matrix_b: the layout is the fragment's.
template <typename Use, int M, int N, int K, typename T, typename Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ldm) {
  detail::CheckPointer(p, ldm);
  __syncwarp();
  using F = fragment<Use, M, N, K, T, Layout>;
  for (int r = 0; r < F::rows; ++r) {
    for (int c = 0; c < F::cols; ++c) {
      f.x[r * F::cols + c] =
          std::is_same<Layout, col_major>::value ? p[c * ldm + r] : p[r * ldm + c];
    }
  }
}

// accumulator: the layout is an argument.
template <int M, int N, int K, typename T>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* p, unsigned ldm,
                      layout_t layout) {
  detail::CheckPointer(p, ldm);
  __syncwarp();
  for (int r = 0; r < M; ++r) {
    for (int c = 0; c < N; ++c) {
      f.x[r * N + c] = layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c];
    }
  }
}

template <int M, int N, int K, typename T>
void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm,
                       layout_t layout) {
  detail::CheckPointer(p, ldm);
  __syncwarp();
  for (int i = detail::Lane(); i < M * N; i += 32) {
    const int r = i / N, c = i % N;
    (layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c]) = f.x[i];
  }
}

template <int M, int N, int K, typename TA, typename LA, typename TB, typename LB, typename TC>
void mma_sync(fragment<accumulator, M, N, K, TC>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
              const fragment<matrix_b, M, N, K, TB, LB>& b,
              const fragment<accumulator, M, N, K, TC>& c) {
  __syncwarp();
  TC out[M * N];
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      float acc = c.x[i * N + j];
      for (int k = 0; k < K; ++k) {
        acc += detail::Widen(a.x[i * K + k]) * detail::Widen(b.x[k * N + j]);
      }
      out[i * N + j] = acc;
    }
  }
  std::memcpy(d.x, out, sizeof(out));
}

}  // namespace wmma
}  // namespace nvcuda
