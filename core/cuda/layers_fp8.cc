// CudaModel's FP8 linear layers (docs/cuda.md "FP8 on tensor cores"): decode-sized steps
// (m <= kFp8GemvMaxRows) take the bandwidth-bound GEMV kernel (the 16-byte-load one of
// fp8_gemv_vec.cu where the shape and alignment allow); larger ones, when FP8 tensor cores are
// turned on (CudaModelOptions::fp8_tensor_cores), the tensor-core GEMM through cuBLASLt
// (core/cuda/fp8_gemm.h) where the device, the library, the weight form and the shape allow
// it, else the CUDA-core tiled kernel (fp8_linear.cu), the first time with one line on stderr
// saying why.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/model.h"

namespace glmserve::cuda {

absl::Status CudaModel::InitFp8TensorCores() {
  fp8_max_cols_ = 0;
  const auto note = [&](const Fp8DeviceMatrix& m) {
    if (m.codes != nullptr) fp8_max_cols_ = std::max(fp8_max_cols_, m.cols);
  };
  for (const DeviceLayer& l : weights_.layers) {
    for (const Fp8DeviceMatrix* m : {&l.q8, &l.k8, &l.v8, &l.o8, &l.experts_gate8, &l.experts_up8,
                                     &l.experts_down8, &l.dense.gate8, &l.dense.up8, &l.dense.down8,
                                     &l.shared.gate8, &l.shared.up8, &l.shared.down8}) {
      note(*m);
    }
  }
  if (fp8_max_cols_ == 0) return absl::OkStatus();  // no FP8 matrices
  fp8_tensor_cores_ = options_.fp8_tensor_cores;
  const char* env = std::getenv("GLMSERVE_FP8_TENSOR_CORES");
  if (env != nullptr && (env[0] == '0' || env[0] == '1')) fp8_tensor_cores_ = env[0] == '1';
  // Created even when off, so that set_fp8_tensor_cores(true) can turn it on later.
  absl::StatusOr<std::unique_ptr<Fp8TensorCoreGemm>> gemm =
      Fp8TensorCoreGemm::Create(options_.device);
  if (!gemm.ok()) {
    fp8_tc_status_ = absl::StrCat("unavailable: ", gemm.status().message());
    if (options_.fp8_tensor_cores_required) {
      return absl::FailedPreconditionError(
          absl::StrCat("--fp8_tensor_cores=on: FP8 tensor cores ", fp8_tc_status_,
                       " (--fp8_tensor_cores=auto falls back to CUDA cores)"));
    }
    if (fp8_tensor_cores_) {
      std::fprintf(stderr, "glmserve: FP8 tensor cores %s: FP8 GEMMs on CUDA cores\n",
                   fp8_tc_status_.c_str());
      fp8_fallback_logged_ = true;
    }
    return absl::OkStatus();
  }
  fp8_tc_ = *std::move(gemm);
  fp8_tc_status_ =
      "cuBLASLt block-scaled FP8 (1x128-group activations x per-channel or 128x128 weights)";
  return absl::OkStatus();
}

absl::Status CudaModel::EnsureFp8Scratch(int64_t tokens) {
  if (fp8_tc_ == nullptr) return absl::OkStatus();
  // The host-grouped MoE path runs up to tokens x top_k rows of one expert.
  const int64_t rows = tokens * std::max<int64_t>(1, config_.num_experts_per_tok);
  if (rows <= fp8_scratch_rows_) return absl::OkStatus();
  const int64_t code_bytes = (rows * fp8_max_cols_ + 255) / 256 * 256;
  fp8_scratch_.Reset();
  ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Create(static_cast<size_t>(
                                       code_bytes + 4 * rows * Fp8ActGroups(fp8_max_cols_))));
  fp8_scratch_ = std::move(b);
  fp8_x_codes_ = fp8_scratch_.as<uint8_t>();
  fp8_x_scales_ = reinterpret_cast<float*>(fp8_x_codes_ + code_bytes);
  fp8_scratch_rows_ = rows;
  return absl::OkStatus();
}

bool CudaModel::Fp8QuantizedActs(const Fp8DeviceMatrix& w, int64_t rows) const {
  return fp8_tc_ != nullptr && fp8_tensor_cores_ && Fp8TensorCoreGemm::Serves(w) &&
         Fp8GemvVecQSupported(w) && rows <= fp8_scratch_rows_ && w.cols <= fp8_max_cols_;
}

absl::Status CudaModel::Fp8ExpertGemv(const Fp8DeviceMatrix& expert0, const int32_t* offsets,
                                      const uint16_t* in, int64_t rows, float* out,
                                      int64_t out_ld) {
  const int64_t n_experts = layout_.experts.count;  // held, from offsets[0] (EnqueueMoe)
  if (Fp8QuantizedActs(expert0, rows)) {
    // The prefill GEMM's activation arithmetic (e4m3 per 1x128 group, fp8_quant.cu) for every
    // row.
    GLM_CUDA_RETURN_IF_ERROR(LaunchQuantizeFp8Groups(in, rows, expert0.cols, fp8_x_codes_,
                                                     fp8_x_scales_, rows, stream_.get()));
    GLM_CUDA_RETURN_IF_ERROR(LaunchFp8ExpertGemvVecQ(expert0, n_experts, offsets, fp8_x_codes_,
                                                     fp8_x_scales_, rows, out, out_ld,
                                                     stream_.get()));
    return absl::OkStatus();
  }
  if (fp8_vec_gemv_ && Fp8GemvVecSupported(expert0, in)) {
    GLM_CUDA_RETURN_IF_ERROR(
        LaunchFp8ExpertGemvVec(expert0, n_experts, offsets, in, out, out_ld, stream_.get()));
    return absl::OkStatus();
  }
  GLM_CUDA_RETURN_IF_ERROR(
      LaunchFp8ExpertGemv(expert0, n_experts, offsets, in, out, out_ld, stream_.get()));
  return absl::OkStatus();
}

absl::Status CudaModel::Fp8Linear(const uint16_t* x, int64_t rows, const Fp8DeviceMatrix& w,
                                  float* y, int64_t y_ld) {
  if (rows <= kFp8GemvMaxRows && Fp8QuantizedActs(w, rows)) {
    // Tensor cores on: the decode GEMV multiplies the same e4m3 activation codes as the
    // prefill GEMM (docs/cuda.md "One activation arithmetic"), so a token's logits do not
    // depend on whether it was computed in a prefill chunk or a decode step.
    GLM_CUDA_RETURN_IF_ERROR(
        LaunchQuantizeFp8Groups(x, rows, w.cols, fp8_x_codes_, fp8_x_scales_, rows, stream_.get()));
    GLM_CUDA_RETURN_IF_ERROR(
        LaunchFp8GemvVecQ(fp8_x_codes_, fp8_x_scales_, rows, rows, w, y, y_ld, stream_.get()));
    return absl::OkStatus();
  }
  if (rows <= kFp8GemvMaxRows && fp8_vec_gemv_ && Fp8GemvVecSupported(w, x)) {
    GLM_CUDA_RETURN_IF_ERROR(LaunchFp8GemvVec(x, rows, w, y, y_ld, stream_.get()));
    return absl::OkStatus();
  }
  if (rows > kFp8GemvMaxRows && fp8_tc_ != nullptr && fp8_tensor_cores_ &&
      rows <= fp8_scratch_rows_) {
    // cuBLASLt's block-scaled matmul takes a token count that is a multiple of 4: the first
    // rows & ~3 rows go to it, the last (up to 3) through the quantizing GEMV, in the same
    // arithmetic (their codes and scales after the GEMM's in the scratch).
    const int64_t main_rows = rows & ~int64_t{3}, tail = rows - main_rows;
    bool ran = false;
    std::string why;
    RETURN_IF_ERROR(fp8_tc_->Run(x, main_rows, w, y, y_ld, fp8_x_codes_, fp8_x_scales_,
                                 stream_.get(), &ran, &why));
    if (ran && tail > 0 && !Fp8QuantizedActs(w, rows)) {
      return absl::InternalError("FP8 GEMM tail rows without the quantizing GEMV");
    }
    if (ran) {
      ++fp8_tc_gemms_;
      if (tail > 0) {
        uint8_t* codes = fp8_x_codes_ + main_rows * w.cols;
        float* scales = fp8_x_scales_ + main_rows * Fp8ActGroups(w.cols);
        GLM_CUDA_RETURN_IF_ERROR(LaunchQuantizeFp8Groups(x + main_rows * w.cols, tail, w.cols,
                                                         codes, scales, tail, stream_.get()));
        GLM_CUDA_RETURN_IF_ERROR(LaunchFp8GemvVecQ(codes, scales, tail, tail, w,
                                                   y + main_rows * y_ld, y_ld, stream_.get()));
      }
      return absl::OkStatus();
    }
    if (Fp8QuantizedActs(w, rows)) {
      // Declined at run time (an output slice of the host-grouped MoE path not 256-byte
      // aligned, no algorithm for this m): keep the quantized arithmetic, which decode uses
      // too, through the quantizing GEMV in passes of kFp8GemvMaxRows rows (each pass reads
      // the weights again: slower, but the same result up to the fp32 summation order).
      if (!fp8_fallback_logged_) {
        fp8_fallback_logged_ = true;
        std::fprintf(stderr,
                     "glmserve: FP8 GEMM as quantized GEMV passes on CUDA cores for %s (logged "
                     "once)\n",
                     why.c_str());
      }
      ++fp8_fallback_gemms_;
      GLM_CUDA_RETURN_IF_ERROR(LaunchQuantizeFp8Groups(x, rows, w.cols, fp8_x_codes_, fp8_x_scales_,
                                                       rows, stream_.get()));
      for (int64_t i0 = 0; i0 < rows; i0 += kFp8GemvMaxRows) {
        GLM_CUDA_RETURN_IF_ERROR(LaunchFp8GemvVecQ(fp8_x_codes_ + i0 * w.cols, fp8_x_scales_ + i0,
                                                   rows, std::min(kFp8GemvMaxRows, rows - i0), w,
                                                   y + i0 * y_ld, y_ld, stream_.get()));
      }
      return absl::OkStatus();
    }
    if (!fp8_fallback_logged_) {
      fp8_fallback_logged_ = true;
      std::fprintf(stderr, "glmserve: FP8 GEMM on CUDA cores for %s (logged once)\n", why.c_str());
    }
  } else if (rows > kFp8GemvMaxRows && fp8_tensor_cores_ && fp8_tc_ == nullptr &&
             !fp8_fallback_logged_) {
    fp8_fallback_logged_ = true;
    std::fprintf(stderr, "glmserve: FP8 tensor cores %s: FP8 GEMMs on CUDA cores (logged once)\n",
                 fp8_tc_status_.c_str());
  }
  if (rows > kFp8GemvMaxRows) ++fp8_fallback_gemms_;
  GLM_CUDA_RETURN_IF_ERROR(LaunchFp8LinearBf16(x, rows, w, y, y_ld, stream_.get()));
  return absl::OkStatus();
}

}  // namespace glmserve::cuda
