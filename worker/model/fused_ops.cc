#include "worker/model/fused_ops.h"

#include <torch/csrc/autograd/custom_function.h>

#if defined(TALLY_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

#include <string>

#include "kernels/elementwise.h"

namespace tally::model {
namespace {

using kernels::Dtype;

// The kernels' dtypes: FP32 and BF16 as they are, anything else as FP32.
at::ScalarType Supported(at::ScalarType t) {
  return t == at::kBFloat16 ? at::kBFloat16 : at::kFloat;
}

Dtype KernelDtype(at::ScalarType t) {
  return t == at::kBFloat16 ? Dtype::kBFloat16 : Dtype::kFloat32;
}

void Check(const std::string& err, const char* what) {
  TORCH_CHECK(err.empty(), what, ": ", err);
}

#if defined(TALLY_WITH_CUDA)
void* Stream() { return c10::cuda::getCurrentCUDAStream().stream(); }
#endif

class SwiGluFunction : public torch::autograd::Function<SwiGluFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& y13) {
    const at::Tensor x = y13.to(Supported(y13.scalar_type())).contiguous();
    const int64_t f = x.size(-1) / 2, n = x.numel() / (2 * f);
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = f;
    at::Tensor y = at::empty(shape, x.options());
    if (x.is_cuda()) {
#if defined(TALLY_WITH_CUDA)
      Check(kernels::SwiGluForwardCuda(x.data_ptr(), KernelDtype(x.scalar_type()), n, f,
                                       y.data_ptr(), Stream()),
            "fused SwiGLU");
#else
      TORCH_CHECK(false, "fused SwiGLU: this build has no CUDA");
#endif
    } else {
      kernels::SwiGluForwardReference(x.data_ptr(), KernelDtype(x.scalar_type()), n, f,
                                      y.data_ptr());
    }
    ctx->save_for_backward({x});
    ctx->saved_data["dtype"] = static_cast<int64_t>(y13.scalar_type());
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor dy = grads[0].to(x.scalar_type()).contiguous();
    const int64_t f = x.size(-1) / 2, n = x.numel() / (2 * f);
    at::Tensor dx = at::empty_like(x);
    if (x.is_cuda()) {
#if defined(TALLY_WITH_CUDA)
      Check(kernels::SwiGluBackwardCuda(x.data_ptr(), dy.data_ptr(), KernelDtype(x.scalar_type()),
                                        n, f, dx.data_ptr(), Stream()),
            "fused SwiGLU backward");
#endif
    } else {
      kernels::SwiGluBackwardReference(x.data_ptr(), dy.data_ptr(), KernelDtype(x.scalar_type()),
                                       n, f, dx.data_ptr());
    }
    return {dx.to(static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt()))};
  }
};

kernels::RopeArgs Args(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                       at::ScalarType out) {
  kernels::RopeArgs a;
  a.n = qkv.size(0) * qkv.size(1);
  a.h = qkv.size(3);
  a.k = qkv.size(4);
  a.cos = cos.data_ptr<float>();
  a.sin = sin.data_ptr<float>();
  a.in = KernelDtype(qkv.scalar_type());
  a.out = KernelDtype(out);
  return a;
}

class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& qkv_in, const at::Tensor& cos_in,
                                                const at::Tensor& sin_in, int64_t dtype) {
    const at::ScalarType out = Supported(static_cast<at::ScalarType>(dtype));
    const at::Tensor qkv = qkv_in.to(Supported(qkv_in.scalar_type())).contiguous();
    const at::Tensor cos = cos_in.to(at::kFloat).contiguous(), sin = sin_in.to(at::kFloat).contiguous();
    TORCH_CHECK(qkv.dim() == 5 && qkv.size(2) == 3 && qkv.size(4) % 2 == 0 &&
                    cos.numel() == qkv.size(0) * qkv.size(1) * qkv.size(4) / 2,
                "fused RoPE: qkv must be [B, T, 3, H, K] with K even and cos/sin [B, T, K/2]");
    const std::vector<int64_t> shape = {qkv.size(0), qkv.size(1), qkv.size(3), qkv.size(4)};
    const auto options = qkv.options().dtype(out);
    at::Tensor q = at::empty(shape, options), k = at::empty(shape, options),
               v = at::empty(shape, options);
    const kernels::RopeArgs a = Args(qkv, cos, sin, out);
    if (qkv.is_cuda()) {
#if defined(TALLY_WITH_CUDA)
      Check(kernels::RopeForwardCuda(a, qkv.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                     Stream()),
            "fused RoPE");
#else
      TORCH_CHECK(false, "fused RoPE: this build has no CUDA");
#endif
    } else {
      kernels::RopeForwardReference(a, qkv.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr());
    }
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["in_dtype"] = static_cast<int64_t>(qkv_in.scalar_type());
    ctx->saved_data["qkv_shape"] = qkv.sizes().vec();
    ctx->saved_data["out"] = static_cast<int64_t>(out);
    return {q, k, v};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& cos = saved[0];
    const at::Tensor& sin = saved[1];
    const auto out = static_cast<at::ScalarType>(ctx->saved_data["out"].toInt());
    const auto in = Supported(static_cast<at::ScalarType>(ctx->saved_data["in_dtype"].toInt()));
    const std::vector<int64_t> shape = ctx->saved_data["qkv_shape"].toIntVector();
    const std::vector<int64_t> part = {shape[0], shape[1], shape[3], shape[4]};
    auto grad = [&](size_t i) {
      return grads[i].defined() ? grads[i].to(out).contiguous()
                                : at::zeros(part, cos.options().dtype(out));
    };
    const at::Tensor dq = grad(0), dk = grad(1), dv = grad(2);
    at::Tensor dqkv = at::empty(shape, dq.options().dtype(in));
    kernels::RopeArgs a;
    a.n = shape[0] * shape[1];
    a.h = shape[3];
    a.k = shape[4];
    a.cos = cos.data_ptr<float>();
    a.sin = sin.data_ptr<float>();
    a.in = KernelDtype(in);
    a.out = KernelDtype(out);
    if (dq.is_cuda()) {
#if defined(TALLY_WITH_CUDA)
      Check(kernels::RopeBackwardCuda(a, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                                      dqkv.data_ptr(), Stream()),
            "fused RoPE backward");
#endif
    } else {
      kernels::RopeBackwardReference(a, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                                     dqkv.data_ptr());
    }
    return {dqkv.to(static_cast<at::ScalarType>(ctx->saved_data["in_dtype"].toInt())),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor FusedSwiGlu(const at::Tensor& y13) { return SwiGluFunction::apply(y13); }

std::array<at::Tensor, 3> FusedRopeQkv(const at::Tensor& qkv, const at::Tensor& cos,
                                       const at::Tensor& sin, at::ScalarType dtype) {
  const torch::autograd::variable_list out =
      RopeFunction::apply(qkv, cos, sin, static_cast<int64_t>(dtype));
  return {out[0], out[1], out[2]};
}

}  // namespace tally::model
