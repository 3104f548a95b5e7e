#include "kernels/cpu/dsa_indexer.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace moesh::cpu {
namespace {

// The definition, scored in double: sum_h w[i,h] * relu(scale * q[i,h] . k[j]).
std::vector<double> NaiveScores(const DsaIndexerParams& p, int i) {
  std::vector<double> s(p.q_start_pos + i + 1, 0.0);
  for (size_t j = 0; j < s.size(); ++j) {
    for (int h = 0; h < p.num_heads; ++h) {
      double dot = 0.0;
      for (int x = 0; x < p.head_dim; ++x) {
        dot +=
            static_cast<double>(p.q[(static_cast<size_t>(i) * p.num_heads + h) * p.head_dim + x]) *
            p.k[j * p.k_row_stride + x];
      }
      s[j] += p.weights[static_cast<size_t>(i) * p.num_heads + h] *
              std::max(dot * p.softmax_scale, 0.0);
    }
  }
  return s;
}

TEST(DsaIndexerTest, KeepsTheTopKCausalRows) {
  const int heads = 3, dim = 8, num_kv = 23, num_q = 6, start = 17, stride = 11;
  std::mt19937 rng(1);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> q(num_q * heads * dim), k(num_kv * stride), w(num_q * heads);
  for (float& x : q) x = n(rng);
  for (float& x : k) x = n(rng);
  for (float& x : w) x = n(rng);
  std::vector<uint8_t> mask(num_q * num_kv, 7);
  DsaIndexerParams p;
  p.q = q.data(), p.num_q = num_q, p.num_heads = heads, p.head_dim = dim;
  p.k = k.data(), p.k_row_stride = stride, p.num_kv = num_kv, p.q_start_pos = start;
  p.weights = w.data(), p.softmax_scale = 0.3f, p.top_k = 5, p.mask = mask.data();
  RunDsaIndexer(p);
  for (int i = 0; i < num_q; ++i) {
    const std::vector<double> s = NaiveScores(p, i);
    std::vector<double> sorted = s;
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    const double kth = sorted[p.top_k - 1];
    // Rows above the k-th score are kept, rows below are not, and rows tied
    // with it fill the remaining places earliest first.
    int kept = 0, above = 0, tied_kept = 0;
    for (int j = 0; j <= start + i; ++j) above += s[j] > kth;
    for (int j = 0; j < num_kv; ++j) {
      const uint8_t m = mask[i * num_kv + j];
      ASSERT_TRUE(m == 0 || m == 1);
      if (j > start + i) {
        EXPECT_EQ(m, 0) << "query " << i << " row " << j << " lies in its future";
        continue;
      }
      kept += m;
      if (s[j] == kth) {
        EXPECT_EQ(m, tied_kept < p.top_k - above ? 1 : 0) << "query " << i << " tied row " << j;
        tied_kept += m;
      } else {
        EXPECT_EQ(m, s[j] > kth ? 1 : 0) << "query " << i << " row " << j;
      }
    }
    EXPECT_EQ(kept, p.top_k);
  }
}

TEST(DsaIndexerTest, ShortPrefixesKeepEveryRowAndTiesKeepTheEarlier) {
  // Zero keys score 0 for every row: a full tie.
  const int heads = 2, dim = 4, num_kv = 6;
  std::vector<float> q(num_kv * heads * dim, 1.0f), k(num_kv * dim, 0.0f), w(num_kv * heads, 1.0f);
  std::vector<uint8_t> mask(num_kv * num_kv);
  DsaIndexerParams p;
  p.q = q.data(), p.num_q = num_kv, p.num_heads = heads, p.head_dim = dim;
  p.k = k.data(), p.k_row_stride = dim, p.num_kv = num_kv, p.q_start_pos = 0;
  p.weights = w.data(), p.top_k = 3, p.mask = mask.data();
  RunDsaIndexer(p);
  for (int i = 0; i < num_kv; ++i) {
    for (int j = 0; j < num_kv; ++j) {
      const bool want = j <= i && j < 3;  // rows 0..2 win the tie; earlier rows are all kept
      EXPECT_EQ(mask[i * num_kv + j], want ? 1 : 0) << "query " << i << " row " << j;
    }
  }
}

}  // namespace
}  // namespace moesh::cpu
