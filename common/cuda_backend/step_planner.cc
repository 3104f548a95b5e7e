#include "common/cuda_backend/step_planner.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "kernels/cuda/config.h"

namespace moesh::cuda {

absl::StatusOr<std::unique_ptr<StepPlanner>> StepPlanner::Create(const StepLimits& limits) {
  std::unique_ptr<StepPlanner> p(new StepPlanner(limits));
  const size_t t = limits.max_tokens, rows = limits.max_rows;
  const int mb = (limits.max_model_len + kKvBlockSize - 1) / kKvBlockSize;
  for (int b = 1; b < limits.max_rows; b *= 2) p->buckets_.push_back(b);
  p->buckets_.push_back(limits.max_rows);
  RETURN_IF_ERROR(p->tokens_.Reallocate(t));
  RETURN_IF_ERROR(p->positions_.Reallocate(t));
  RETURN_IF_ERROR(p->slots_.Reallocate(t));
  RETURN_IF_ERROR(p->seq_lens_.Reallocate(t));
  RETURN_IF_ERROR(p->head_rows_.Reallocate(rows));
  RETURN_IF_ERROR(p->block_table_.Reallocate(t * mb));
  RETURN_IF_ERROR(p->seg_last_.Reallocate(rows));
  RETURN_IF_ERROR(p->seg_from_.Reallocate(rows));
  ASSIGN_OR_RETURN(p->staging_, PinnedBuffer<int32_t>::Create(6 * t + rows + t * mb));
  StepInputs& in = p->inputs_;
  in.tokens = p->tokens_.get(), in.positions = p->positions_.get(), in.slots = p->slots_.get();
  in.seq_lens = p->seq_lens_.get(), in.head_rows = p->head_rows_.get();
  in.block_table = p->block_table_.get(), in.seg_last = p->seg_last_.get();
  in.seg_from = p->seg_from_.get(), in.max_blocks_per_seq = mb;
  return p;
}

int StepPlanner::Bucket(int batch) const {
  for (int b : buckets_) {
    if (b >= batch) return b;
  }
  return buckets_.back();
}

absl::Status StepPlanner::Plan(absl::Span<const SequenceTokens> seqs, KvStore* store,
                               std::vector<StepBatch>* chunks,
                               std::vector<int>* row_seq_index) const {
  const int n_seqs = static_cast<int>(seqs.size());
  if (n_seqs == 0) return absl::InvalidArgumentError("CudaModel: empty batch");
  if (n_seqs > limits_.max_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaModel: ", n_seqs, " sequences in a step; max_num_seqs is ", limits_.max_rows));
  }
  std::set<int> seen;
  bool decode = true;
  for (const SequenceTokens& st : seqs) {
    RETURN_IF_ERROR(store->Length(st.seq).status());
    if (!seen.insert(st.seq).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("CudaModel: sequence ", st.seq, " appears twice in a step"));
    }
    if (st.tokens.empty())
      return absl::InvalidArgumentError(
          absl::StrCat("CudaModel: sequence ", st.seq, " has no tokens"));
    for (int32_t tok : st.tokens) {
      if (tok < 0 || tok >= limits_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token id ", tok, " is outside the vocabulary [0, ", limits_.vocab_size, ")"));
      }
    }
    const int end = store->at(st.seq).length + static_cast<int>(st.tokens.size());
    if (end > limits_.max_model_len) {
      return absl::InvalidArgumentError(absl::StrCat("CudaModel: sequence ", st.seq, " reaches ",
                                                     end, " tokens, beyond max_model_len ",
                                                     limits_.max_model_len));
    }
    decode = decode && st.tokens.size() == 1;
  }
  for (const SequenceTokens& st : seqs) {
    KvStore::Sequence& s = store->at(st.seq);
    RETURN_IF_ERROR(store->Cover(&s, s.length + static_cast<int>(st.tokens.size())));
  }
  const int mb = inputs_.max_blocks_per_seq;
  auto add_token = [&](StepBatch& b, const KvStore::Sequence& s, int32_t token, int pos) {
    b.tokens.push_back(token);
    b.positions.push_back(pos);
    b.slots.push_back(s.blocks[pos / kKvBlockSize] * kKvBlockSize + pos % kKvBlockSize);
    b.seq_lens.push_back(pos + 1);
    b.max_seq_len = std::max(b.max_seq_len, pos + 1);
    const size_t at = b.block_table.size();
    b.block_table.resize(at + mb, 0);
    std::copy(s.blocks.begin(), s.blocks.end(), b.block_table.begin() + at);
    b.num_tokens++;
  };
  // Token `row` of `b` continues segment seg_last.size() - 1 iff `same` (the
  // same sequence as the row before), else starts one.
  auto add_segment = [](StepBatch& b, bool same) {
    if (!same || b.seg_last.empty()) {
      b.seg_last.push_back(0);
      b.seg_from.push_back(b.positions.back());
    }
    b.seg_last.back() = b.num_tokens - 1;
  };
  chunks->clear();
  row_seq_index->clear();
  if (decode) {
    StepBatch b;
    b.decode = true;
    for (int i = 0; i < n_seqs; ++i) {
      const KvStore::Sequence& s = store->at(seqs[i].seq);
      add_token(b, s, seqs[i].tokens[0], s.length);
      add_segment(b, false);
      b.head_rows.push_back(i);
      row_seq_index->push_back(i);
    }
    const int bucket = Bucket(n_seqs);
    b.real_tokens = n_seqs;
    for (int i = n_seqs; i < bucket; ++i) {  // padding rows: no cache write, empty context
      b.tokens.push_back(0);
      b.positions.push_back(0);
      b.slots.push_back(-1);
      b.seq_lens.push_back(0);
      b.block_table.resize(b.block_table.size() + mb, 0);
      b.head_rows.push_back(i);
      b.num_tokens++;
      add_segment(b, false);
    }
    b.num_rows = bucket;
    b.max_seq_len = limits_.max_model_len;  // the plan the bucket's graph was built with
    chunks->push_back(std::move(b));
    return absl::OkStatus();
  }
  const int cap = limits_.max_tokens_per_step;
  chunks->emplace_back();
  for (int i = 0; i < n_seqs; ++i) {
    const KvStore::Sequence& s = store->at(seqs[i].seq);
    const int n = static_cast<int>(seqs[i].tokens.size());
    for (int j = 0; j < n; ++j) {
      if (chunks->back().num_tokens == cap) chunks->emplace_back();
      StepBatch& b = chunks->back();
      add_token(b, s, seqs[i].tokens[j], s.length + j);
      add_segment(b, j > 0 && b.num_tokens > 1);
      if (j == n - 1) {
        b.head_rows.push_back(b.num_tokens - 1);
        b.num_rows++;
        row_seq_index->push_back(i);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status StepPlanner::Upload(const StepBatch& b, cudaStream_t stream, bool segments) {
  int32_t* h = staging_.get();
  size_t at = 0;
  auto put = [&](const std::vector<int32_t>& v, int32_t* dst) -> absl::Status {
    if (v.empty()) return absl::OkStatus();
    std::memcpy(h + at, v.data(), v.size() * sizeof(int32_t));
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(dst, h + at, v.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    at += v.size();
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(put(b.tokens, inputs_.tokens));
  RETURN_IF_ERROR(put(b.positions, inputs_.positions));
  RETURN_IF_ERROR(put(b.slots, inputs_.slots));
  RETURN_IF_ERROR(put(b.seq_lens, inputs_.seq_lens));
  RETURN_IF_ERROR(put(b.head_rows, inputs_.head_rows));
  if (segments) {
    RETURN_IF_ERROR(put(b.seg_from, inputs_.seg_from));
    RETURN_IF_ERROR(put(b.seg_last, inputs_.seg_last));
  }
  return put(b.block_table, inputs_.block_table);
}

}  // namespace moesh::cuda
