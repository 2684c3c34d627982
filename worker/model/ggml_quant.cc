#include "worker/model/ggml_quant.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstring>
#include <vector>

namespace tally::model {

int64_t GgmlBlockBytes(GgmlQuant q) { return q == GgmlQuant::kQ8_0 ? 34 : 18; }

bool QuantizesParameter(std::string_view name, QuantLayers layers) {
  if (name.substr(0, 7) != "layers.") return false;
  const size_t dot = name.find('.', 7);
  if (dot == std::string_view::npos) return false;
  std::string_view rest = name.substr(dot + 1);
  if (rest.substr(0, 8) == "experts.") rest = rest.substr(8);
  if (rest == "w1" || rest == "w2" || rest == "w3") return true;
  return layers == QuantLayers::kAllLinear && (rest == "wqkv" || rest == "wo");
}

namespace {

// w as [..., blocks, 32] in FP32.
at::Tensor Blocked(const at::Tensor& w) {
  TORCH_CHECK(w.dim() >= 1 && w.size(-1) % kGgmlBlock == 0,
              "ggml blocks: the last dimension (", w.dim() >= 1 ? w.size(-1) : 0,
              ") must be a multiple of ", kGgmlBlock);
  std::vector<int64_t> shape(w.sizes().begin(), w.sizes().end() - 1);
  shape.push_back(w.size(-1) / kGgmlBlock);
  shape.push_back(kGgmlBlock);
  return w.detach().to(at::kFloat).reshape(shape);
}

// C's roundf: to nearest, halves away from zero (at::round is to even).
at::Tensor RoundHalfAway(const at::Tensor& v) {
  const at::Tensor t = v.trunc();
  return at::where((v - t).abs() >= 0.5, t + v.sign(), t);
}

}  // namespace

GgmlBlocks QuantizeBlocks(const at::Tensor& w, GgmlQuant q) {
  const at::Tensor x = Blocked(w);
  at::Tensor d;
  if (q == GgmlQuant::kQ8_0) {
    d = x.abs().amax(-1, /*keepdim=*/true) / 127.0f;
  } else {
    const at::Tensor first = x.abs().argmax(-1, /*keepdim=*/true);
    d = x.gather(-1, first) / -8.0f;
  }
  const at::Tensor id = at::where(d != 0, d.reciprocal(), at::zeros_like(d));
  at::Tensor codes;
  if (q == GgmlQuant::kQ8_0) {
    codes = RoundHalfAway(x * id);
  } else {
    codes = (x * id + 8.5f).trunc().clamp(0, 15);
  }
  GgmlBlocks out;
  out.scale = d.squeeze(-1).to(at::kHalf);
  out.codes = codes.to(at::kChar).reshape(w.sizes());
  return out;
}

at::Tensor DequantizeBlocks(const GgmlBlocks& blocks, GgmlQuant q) {
  const at::Tensor codes = Blocked(blocks.codes);
  const at::Tensor d = blocks.scale.to(at::kFloat).unsqueeze(-1);
  const at::Tensor values = q == GgmlQuant::kQ8_0 ? codes * d : (codes - 8.0f) * d;
  return values.reshape(blocks.codes.sizes());
}

at::Tensor QuantizeDequantize(const at::Tensor& w, GgmlQuant q) {
  at::NoGradGuard no_grad;
  return DequantizeBlocks(QuantizeBlocks(w, q), q);
}

namespace {

class FakeQuantFunction : public torch::autograd::Function<FakeQuantFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& w,
                            int64_t q) {
    ctx->saved_data["dtype"] = static_cast<int64_t>(w.scalar_type());
    return QuantizeDequantize(w, static_cast<GgmlQuant>(q)).to(w.scalar_type());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grads[0].to(dtype), at::Tensor()};
  }
};

}  // namespace

at::Tensor FakeQuantize(const at::Tensor& w, GgmlQuant q) {
  return FakeQuantFunction::apply(w, static_cast<int64_t>(q));
}

std::string PackGgmlBlocks(const at::Tensor& w, GgmlQuant q) {
  const GgmlBlocks b = QuantizeBlocks(w, q);
  const at::Tensor scale = b.scale.contiguous().to(at::kCPU).reshape({-1});
  const at::Tensor codes = b.codes.contiguous().to(at::kCPU).reshape({-1, kGgmlBlock});
  const int64_t blocks = scale.numel();
  std::string out(static_cast<size_t>(blocks * GgmlBlockBytes(q)), '\0');
  const auto* s = reinterpret_cast<const uint16_t*>(scale.data_ptr<at::Half>());
  const int8_t* c = codes.data_ptr<int8_t>();
  char* p = out.data();
  for (int64_t i = 0; i < blocks; ++i, c += kGgmlBlock) {
    std::memcpy(p, &s[i], 2);  // little-endian, as GGUF is
    p += 2;
    if (q == GgmlQuant::kQ8_0) {
      std::memcpy(p, c, kGgmlBlock);
      p += kGgmlBlock;
    } else {
      for (int64_t j = 0; j < kGgmlBlock / 2; ++j) {
        *p++ = static_cast<char>(static_cast<uint8_t>(c[j]) |
                                 (static_cast<uint8_t>(c[j + kGgmlBlock / 2]) << 4));
      }
    }
  }
  return out;
}

}  // namespace tally::model
