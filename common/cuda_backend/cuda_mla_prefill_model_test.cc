// The expanded MLA prefill (CudaModelOptions::mla_prefill, kernels/cuda/
// mla_prefill.h) inside the whole model against the CPU engine,
// teacher-forced, next to the absorbed prefill in the same run, at DeepSeek's
// real attention widths (latent 512, q·k 128 + 64, v 128) on random bf16
// checkpoints:
//   * absorbed: every prompt token through the decode kernel (the baseline);
//   * auto: the 70- and 130-token prompts expanded, the 1-token one absorbed
//     (one pass holding both kinds of range);
//   * expanded and chunked: every prompt expanded, prompts cut into passes of
//     48 tokens (a later pass's queries attend a cached prefix), context rows
//     expanded 64 at a time (several key ranges merged), on each kernel
//     (mma.sync and wgmma).
// Which rows attend in which form (MlaAttnRanges) is checked without a GPU;
// the rest skips where no GPU is present.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "common/cuda_backend/cuda_model.h"
#include "common/cuda_backend/fidelity_test_util.h"
#include "common/cuda_backend/mla/mla_layer_stack.h"
#include "common/cuda_backend/model_test_util.h"
#include "common/model/random_checkpoint.h"
#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

using testing::Compare;
using testing::CpuEngine;
using testing::Fidelity;
using testing::LoadCpu;

CudaModelOptions Options(MlaPrefill prefill, int chunk_rows = 0, int tokens_per_step = 0,
                         MlaPrefillImpl impl = MlaPrefillImpl::kMmaSync) {
  CudaModelOptions o = testing::SmallModelOptions();
  o.mla_prefill = prefill;
  o.mla_prefill_impl = impl;
  o.mla_prefill_chunk_rows = chunk_rows;
  if (tokens_per_step > 0) o.max_tokens_per_step = tokens_per_step;
  return o;
}

// A pass of segments with these new-token counts (positions from 10 on each).
StepBatch Pass(const std::vector<int>& tokens, bool decode = false) {
  StepBatch b;
  b.decode = decode;
  for (int n : tokens) {
    b.num_tokens += n;
    b.seg_last.push_back(b.num_tokens - 1);
    b.seg_from.push_back(10);
  }
  return b;
}

std::string Describe(const std::vector<MlaAttnRange>& ranges) {
  std::string out;
  for (const MlaAttnRange& r : ranges) {
    absl::StrAppend(&out, r.expanded ? "E" : "A", "[", r.first, "+", r.rows,
                    r.expanded ? absl::StrCat("@", r.pos0) : "", "] ");
  }
  return out;
}

// Which rows of a pass attend in which form (no GPU needed).
TEST(MlaAttnRangesTest, ExpandsLongSegmentsAndMergesTheRest) {
  const StepBatch mixed = Pass({1, 2, 100, 3, 4, 64, 63});
  EXPECT_EQ(Describe(MlaAttnRanges(mixed, MlaPrefill::kAuto, true)),
            "A[0+3] E[3+100@10] A[103+7] E[110+64@10] A[174+63] ");
  EXPECT_EQ(Describe(MlaAttnRanges(mixed, MlaPrefill::kExpanded, true)),
            "E[0+1@10] E[1+2@10] E[3+100@10] E[103+3@10] E[106+4@10] E[110+64@10] "
            "E[174+63@10] ");
  // One range over every row: absorbed mode, the widths the expanded kernel
  // is not built for, a decode pass, or no segment long enough.
  EXPECT_EQ(Describe(MlaAttnRanges(mixed, MlaPrefill::kAbsorbed, true)), "A[0+237] ");
  EXPECT_EQ(Describe(MlaAttnRanges(mixed, MlaPrefill::kAuto, false)), "A[0+237] ");
  EXPECT_EQ(Describe(MlaAttnRanges(Pass({1, 1, 1}, true), MlaPrefill::kExpanded, true)), "A[0+3] ");
  EXPECT_EQ(Describe(MlaAttnRanges(Pass({5, 63, 1}), MlaPrefill::kAuto, true)), "A[0+69] ");
  EXPECT_EQ(Describe(MlaAttnRanges(Pass({64}), MlaPrefill::kAuto, true)), "E[0+64@10] ");
}

class CudaMlaPrefillTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaMlaPrefillTest, ExpandedPrefillMatchesTheCpuEngine) {
  MOESH_REQUIRE_GPU();
  const std::string family = GetParam();
  const ModelConfig c = testing::RealWidths(family);
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << family << " seed " << seed);
  const std::string dir = JoinPath(::testing::TempDir(), absl::StrCat("mla_prefill_", family));
  RandomCheckpointOptions ro;
  ro.seed = seed;
  ASSERT_TRUE(WriteRandomCheckpoint(c, dir, ro).ok());
  absl::StatusOr<CpuEngine> cpu = LoadCpu(dir);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const CudaModelOptions options[] = {
      Options(MlaPrefill::kAbsorbed), Options(MlaPrefill::kAuto),
      Options(MlaPrefill::kExpanded, 64, 48),
      Options(MlaPrefill::kExpanded, 64, 48, MlaPrefillImpl::kWgmma)};
  const char* names[] = {
      "absorbed prefill vs CPU:", "auto (expanded >= 64 tokens) vs CPU:",
      "expanded, 48-token passes, 64-row ranges:", "the same on the wgmma kernel:"};
  std::vector<std::unique_ptr<CudaModel>> models;
  std::vector<CudaModel*> raw;
  for (const CudaModelOptions& o : options) {
    absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Load(dir, o);
    ASSERT_TRUE(m.ok()) << m.status();
    raw.push_back(m->get());
    models.push_back(std::move(*m));
  }
  std::vector<Fidelity> fid;
  Compare(c, *cpu, raw, &fid, static_cast<uint32_t>(seed));
  std::printf("%s (real widths), teacher-forced against the CPU engine:\n", family.c_str());
  for (size_t i = 0; i < fid.size(); ++i) {
    fid[i].Print(names[i]);
    EXPECT_LE(fid[i].worst_rel, testing::kBf16RelLogitTolerance) << names[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CudaMlaPrefillTest, ::testing::Values("v2-lite", "v3"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
                           return name;
                         });

}  // namespace
}  // namespace moesh::cuda
