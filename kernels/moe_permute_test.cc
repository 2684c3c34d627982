// MoE permutation: the CPU reference on hand-made cases, and the CUDA
// kernels against it (skipped where there is no GPU).
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/moe_permute.h"

#ifdef TALLY_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace tally::kernels {
namespace {

TEST(MoePermuteReference, GroupsByExpertStablyWithPadding) {
  // 4 tokens x top-2; expert 2 gets nothing, one assignment dropped.
  const std::vector<int32_t> expert = {1, 0, 3, 1, 0, -1, 1, 3};
  std::vector<int32_t> dest(8), end(4);
  EXPECT_EQ(PermuteReference(expert.data(), 8, 4, 1, dest.data(), end.data()), 7);
  EXPECT_EQ(end, (std::vector<int32_t>{2, 5, 5, 7}));
  EXPECT_EQ(dest, (std::vector<int32_t>{2, 0, 5, 3, 1, -1, 4, 6}));
  // Aligned to 4: groups of 2, 3, 0, 2 rows take 4, 4, 0, 4.
  EXPECT_EQ(PermuteReference(expert.data(), 8, 4, 4, dest.data(), end.data()), 12);
  EXPECT_EQ(end, (std::vector<int32_t>{4, 8, 8, 12}));
  EXPECT_EQ(dest, (std::vector<int32_t>{4, 0, 8, 5, 1, -1, 6, 9}));
}

TEST(MoePermuteReference, UnpermuteWeighsAndSkipsDropped) {
  // 2 tokens x top-2, D = 2; rows as permuted above for a small case.
  const std::vector<float> rows = {1, 2, 10, 20, 100, 200};
  const std::vector<float> gate = {0.5f, 0.5f, 1.0f, 0.25f};
  const std::vector<int32_t> dest = {2, 0, 1, -1};
  std::vector<float> out(4);
  UnpermuteReference(rows.data(), gate.data(), dest.data(), 2, 2, 2, out.data());
  EXPECT_EQ(out, (std::vector<float>{50.5f, 101.0f, 10.0f, 20.0f}));
}

#ifdef TALLY_HAVE_CUDA
TEST(MoePermuteGpu, MatchesTheReference) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    GTEST_SKIP() << "needs a GPU (none here)";
  }
  const int32_t N = 8192, K = 2, E = 16, D = 64, A = N * K;
  std::mt19937 rng(7);
  std::vector<int32_t> expert(A);
  for (auto& e : expert) e = static_cast<int32_t>(rng() % (E + 1)) - 1;  // some dropped
  std::vector<int32_t> want_dest(A), want_end(E), got_dest(A), got_end(E);
  const int32_t R = PermuteReference(expert.data(), A, E, 16, want_dest.data(), want_end.data());
  int32_t *de = nullptr, *dd = nullptr, *dend = nullptr;
  cudaMalloc(&de, A * sizeof(int32_t));
  cudaMalloc(&dd, A * sizeof(int32_t));
  cudaMalloc(&dend, E * sizeof(int32_t));
  cudaMemcpy(de, expert.data(), A * sizeof(int32_t), cudaMemcpyHostToDevice);
  ASSERT_EQ(PermuteCuda(de, A, E, 16, dd, dend, nullptr), "");
  cudaMemcpy(got_dest.data(), dd, A * sizeof(int32_t), cudaMemcpyDeviceToHost);
  cudaMemcpy(got_end.data(), dend, E * sizeof(int32_t), cudaMemcpyDeviceToHost);
  EXPECT_EQ(got_dest, want_dest);
  EXPECT_EQ(got_end, want_end);

  std::vector<float> rows(static_cast<size_t>(R) * D), gate(A), want(N * D), got(N * D);
  std::normal_distribution<float> dist;
  for (auto& v : rows) v = dist(rng);
  for (auto& v : gate) v = dist(rng);
  UnpermuteReference(rows.data(), gate.data(), want_dest.data(), N, K, D, want.data());
  float *drows = nullptr, *dgate = nullptr, *dout = nullptr;
  cudaMalloc(&drows, rows.size() * sizeof(float));
  cudaMalloc(&dgate, A * sizeof(float));
  cudaMalloc(&dout, got.size() * sizeof(float));
  cudaMemcpy(drows, rows.data(), rows.size() * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(dgate, gate.data(), A * sizeof(float), cudaMemcpyHostToDevice);
  ASSERT_EQ(UnpermuteCuda(drows, dgate, dd, N, K, D, dout, nullptr), "");
  cudaMemcpy(got.data(), dout, got.size() * sizeof(float), cudaMemcpyDeviceToHost);
  for (auto* p : {static_cast<void*>(de), static_cast<void*>(dd), static_cast<void*>(dend),
                  static_cast<void*>(drows), static_cast<void*>(dgate), static_cast<void*>(dout)}) {
    cudaFree(p);
  }
  EXPECT_EQ(got, want);  // the same products summed in the same order
}
#endif

}  // namespace
}  // namespace tally::kernels
