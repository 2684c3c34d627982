#include "worker/dist/expert_parallel.h"

#include <torch/csrc/autograd/custom_function.h>

#include <string>

namespace tally::dist {
namespace {

// All-to-all as an autograd function: the gradient goes back along the same
// routes, the splits swapped.
struct AllToAllFunction : public torch::autograd::Function<AllToAllFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t exchange, std::vector<int64_t> send,
                            std::vector<int64_t> recv) {
    // An undefined output gradient reaches backward as is, which builds the
    // zeros itself (shaped like the rows received, like the input otherwise).
    ctx->set_materialize_grads(false);
    ctx->saved_data["exchange"] = exchange;
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    ctx->saved_data["cols"] = x.size(1);
    ctx->saved_data["dtype"] = x.scalar_type();
    ctx->saved_data["device"] = x.device();
    return reinterpret_cast<ExpertExchange*>(exchange)->AllToAll(x.contiguous(), send, recv);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* exchange = reinterpret_cast<ExpertExchange*>(ctx->saved_data["exchange"].toInt());
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    at::Tensor g = grads[0];
    if (!g.defined()) {  // every rank must still join the exchange
      int64_t rows = 0;
      for (int64_t n : recv) rows += n;
      // On the input's device and in its dtype: autograd refuses a gradient
      // on another device, and the exchange sends what every rank expects.
      g = at::zeros({rows, ctx->saved_data["cols"].toInt()},
                    at::TensorOptions()
                        .dtype(ctx->saved_data["dtype"].toScalarType())
                        .device(ctx->saved_data["device"].toDevice()));
    }
    g = g.contiguous();
    return {exchange->AllToAll(g, recv, send), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor AllToAllWithGrad(const at::Tensor& x, ExpertExchange* exchange,
                            const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
  return AllToAllFunction::apply(x, reinterpret_cast<int64_t>(exchange), send, recv);
}

at::Tensor ExpertParallel::ExchangeCounts(const at::Tensor& counts_E) {
  const int W = exchange_->size();
  const int64_t E = counts_E.size(0), M = E / W;  // M experts per rank
  // Rank j gets, from every rank, how many rows it sends each of j's M
  // experts (a plain all-to-all of M counts per pair, on the device).
  return exchange_
      ->AllToAll(counts_E.to(at::kDouble).reshape({E, 1}), std::vector<int64_t>(W, M),
                 std::vector<int64_t>(W, M))
      .reshape({E});
}

at::Tensor ExpertParallel::Run(const at::Tensor& rows_SD, const std::vector<int64_t>& counts,
                               const std::vector<int64_t>& received, const LocalExperts& local) {
  ExpertExchange* ex = exchange_;
  const int W = ex->size(), me = ex->rank();
  const int64_t E = static_cast<int64_t>(counts.size()), M = E / W;  // M experts per rank
  TORCH_CHECK(static_cast<int64_t>(received.size()) == W * M, "ExpertParallel: ",
              received.size(), " received counts for ", W, " ranks of ", M, " experts");
  std::vector<int64_t> send(W, 0), recv(W, 0);
  std::vector<std::vector<int64_t>> from(W, std::vector<int64_t>(M));  // [source][local expert]
  for (int j = 0; j < W; ++j) {
    for (int64_t m = 0; m < M; ++m) {
      send[j] += counts[j * M + m];
      from[j][m] = received[j * M + m];
      recv[j] += from[j][m];
    }
  }
  at::Tensor in_RD = AllToAllWithGrad(rows_SD, ex, send, recv);
  // Received rows are grouped by source rank, each sorted by expert. `out`
  // starts as in x 0 so the backward always reaches the dispatch all-to-all,
  // even on a rank that received nothing (every rank must join it).
  at::Tensor out_RD = in_RD * 0;
  std::vector<int64_t> source_start(W, 0);
  for (int j = 1; j < W; ++j) source_start[j] = source_start[j - 1] + recv[j - 1];
  // The received rows in expert order: local expert m's rows from every
  // source in turn. Each (m, source) segment is a run of consecutive rows,
  // so the order is built on the device from M x W shifts.
  std::vector<int64_t> shift, length, local_counts(M, 0);
  int64_t placed = 0;
  for (int64_t m = 0; m < M; ++m) {
    for (int j = 0; j < W; ++j) {
      int64_t at_row = source_start[j];
      for (int64_t k = 0; k < m; ++k) at_row += from[j][k];
      shift.push_back(at_row - placed);
      length.push_back(from[j][m]);
      placed += from[j][m];
      local_counts[m] += from[j][m];
    }
  }
  if (placed == 0) return AllToAllWithGrad(out_RD, ex, recv, send);
  const at::Device device = in_RD.device();
  at::Tensor order = at::arange(placed, at::TensorOptions().dtype(at::kLong).device(device)) +
                     at::repeat_interleave(model::Upload(shift, device),
                                           model::Upload(length, device), 0, placed);
  // This rank's block through the model's own expert code.
  at::Tensor ye = local(in_RD.index_select(0, order), local_counts, me * M);
  out_RD = out_RD.index_add(0, order, ye.to(out_RD.scalar_type()));
  return AllToAllWithGrad(out_RD, ex, recv, send);
}

}  // namespace tally::dist
