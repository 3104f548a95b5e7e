#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/cuda_backend/cuda_model.h"

// CudaModel's step planning: sequences in the KV pool, a step's tokens cut
// into batches (chunks) that fit the scratch buffers, and their upload.
namespace moesh::cuda {

int CudaModel::Bucket(int batch) const {
  for (int b : buckets_) {
    if (b >= batch) return b;
  }
  return buckets_.back();
}

absl::StatusOr<int> CudaModel::AddSequence(int reserve_tokens) {
  return store_->Add(reserve_tokens);
}

absl::Status CudaModel::ReleaseSequence(int seq) { return store_->Release(seq); }

absl::StatusOr<int> CudaModel::SequenceLength(int seq) const { return store_->Length(seq); }

absl::Status CudaModel::Plan(absl::Span<const SequenceTokens> seqs, std::vector<Batch>* chunks,
                             std::vector<int>* row_seq_index) {
  const int n_seqs = static_cast<int>(seqs.size());
  if (n_seqs == 0) return absl::InvalidArgumentError("CudaModel: empty batch");
  if (n_seqs > max_rows_) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaModel: ", n_seqs, " sequences in a step; max_num_seqs is ", max_rows_));
  }
  std::set<int> seen;
  bool decode = true;
  for (const SequenceTokens& st : seqs) {
    RETURN_IF_ERROR(store_->Length(st.seq).status());
    if (!seen.insert(st.seq).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("CudaModel: sequence ", st.seq, " appears twice in a step"));
    }
    if (st.tokens.empty())
      return absl::InvalidArgumentError(
          absl::StrCat("CudaModel: sequence ", st.seq, " has no tokens"));
    for (int32_t tok : st.tokens) {
      if (tok < 0 || tok >= config_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token id ", tok, " is outside the vocabulary [0, ", config_.vocab_size, ")"));
      }
    }
    const int end = store_->at(st.seq).length + static_cast<int>(st.tokens.size());
    if (end > max_model_len_) {
      return absl::InvalidArgumentError(absl::StrCat("CudaModel: sequence ", st.seq, " reaches ",
                                                     end, " tokens, beyond max_model_len ",
                                                     max_model_len_));
    }
    decode = decode && st.tokens.size() == 1;
  }
  for (const SequenceTokens& st : seqs) {
    Sequence& s = store_->at(st.seq);
    RETURN_IF_ERROR(store_->Cover(&s, s.length + static_cast<int>(st.tokens.size())));
  }
  const int mb = max_blocks_per_seq_;
  auto add_token = [&](Batch& b, const Sequence& s, int32_t token, int pos) {
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
  auto add_segment = [](Batch& b, bool same) {
    if (!same || b.seg_last.empty()) {
      b.seg_last.push_back(0);
      b.seg_from.push_back(b.positions.back());
    }
    b.seg_last.back() = b.num_tokens - 1;
  };
  chunks->clear();
  row_seq_index->clear();
  if (decode) {
    Batch b;
    b.decode = true;
    for (int i = 0; i < n_seqs; ++i) {
      const Sequence& s = store_->at(seqs[i].seq);
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
    b.max_seq_len = max_model_len_;  // the plan the bucket's graph was built with
    chunks->push_back(std::move(b));
    return absl::OkStatus();
  }
  const int cap = options_.max_tokens_per_step;
  chunks->emplace_back();
  for (int i = 0; i < n_seqs; ++i) {
    const Sequence& s = store_->at(seqs[i].seq);
    const int n = static_cast<int>(seqs[i].tokens.size());
    for (int j = 0; j < n; ++j) {
      if (chunks->back().num_tokens == cap) chunks->emplace_back();
      Batch& b = chunks->back();
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

absl::Status CudaModel::Upload(const Batch& b) {
  int32_t* h = h_meta_.get();
  size_t at = 0;
  auto put = [&](const std::vector<int32_t>& v, int32_t* dst) -> absl::Status {
    if (v.empty()) return absl::OkStatus();
    std::memcpy(h + at, v.data(), v.size() * sizeof(int32_t));
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dst, h + at, v.size() * sizeof(int32_t),
                                         cudaMemcpyHostToDevice, stream_.get()));
    at += v.size();
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(put(b.tokens, d_tokens_.get()));
  RETURN_IF_ERROR(put(b.positions, d_positions_.get()));
  RETURN_IF_ERROR(put(b.slots, d_slots_.get()));
  RETURN_IF_ERROR(put(b.seq_lens, d_seq_lens_.get()));
  RETURN_IF_ERROR(put(b.head_rows, d_head_rows_.get()));
  if (v4_ != nullptr) {
    RETURN_IF_ERROR(put(b.seg_from, v4_->seg_from.get()));
    RETURN_IF_ERROR(put(b.seg_last, v4_->seg_last.get()));
  }
  return put(b.block_table, d_block_table_.get());
}

}  // namespace moesh::cuda
