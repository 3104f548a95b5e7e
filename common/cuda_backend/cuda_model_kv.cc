// CudaModel's sequences in the KV store, and their KV rows in and out of its paged pool for the KV
// handoff between workers: through the host (AppendKvRows, ReadKvRows) or device to device from
// another model's pool (ExportKv, ImportKv). V4's compressed entries are not handed off: they are
// recomputed from the rows on arrival.
#include "absl/strings/str_cat.h"
#include "common/cuda_backend/cuda_model.h"

namespace moesh::cuda {

absl::StatusOr<int> CudaModel::AddSequence(int reserve_tokens, absl::Span<const int32_t> prefix) {
  return store_->Add(reserve_tokens, prefix);
}

absl::Status CudaModel::PublishSequence(int seq, absl::Span<const int32_t> tokens) {
  RETURN_IF_ERROR(SequenceLength(seq).status());
  store_->Publish(seq, tokens);
  return absl::OkStatus();
}

absl::Status CudaModel::ReserveSequence(int seq, int tokens) {
  RETURN_IF_ERROR(SequenceLength(seq).status());
  if (tokens < 0 || tokens > max_model_len_) {
    return absl::InvalidArgumentError(absl::StrCat("CudaModel: cannot reserve ", tokens,
                                                   " tokens; max_model_len is ", max_model_len_));
  }
  return store_->Cover(&store_->at(seq), tokens);
}

absl::Status CudaModel::ReleaseSequence(int seq) { return store_->Release(seq); }

absl::StatusOr<int> CudaModel::SequenceLength(int seq) const { return store_->Length(seq); }

absl::Status CudaModel::AppendKvRows(int seq, int layer, const float* rows, int n) {
  ASSIGN_OR_RETURN(const int len, SequenceLength(seq));
  if (layer < 0 || layer >= config_.num_hidden_layers || n < 0 || len + n > max_model_len_) {
    return absl::InvalidArgumentError(absl::StrCat("CudaModel::AppendKvRows: layer ", layer, ", ",
                                                   n, " rows after ", len, " (max_model_len ",
                                                   max_model_len_, ")"));
  }
  Sequence& s = store_->at(seq);
  RETURN_IF_ERROR(store_->Cover(&s, len + n));
  RETURN_IF_ERROR(kv_->WriteRows(layer, s.blocks, len, rows, n, stream_.get()));
  if (layer == config_.num_hidden_layers - 1) {
    s.length += n;
    RETURN_IF_ERROR(stack_->RowsArrived(seq, len, len + n));  // V4: the entries they complete
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> CudaModel::ReadKvRows(int seq, int layer, int n) {
  ASSIGN_OR_RETURN(const int len, SequenceLength(seq));
  if (layer < 0 || layer >= config_.num_hidden_layers || n < 0 ||
      n > static_cast<int>(store_->at(seq).blocks.size()) * kKvBlockSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaModel::ReadKvRows: layer ", layer, ", ", n, " rows of ", len));
  }
  std::vector<float> out(static_cast<size_t>(n) * kv_row_width());
  RETURN_IF_ERROR(kv_->ReadRows(layer, store_->at(seq).blocks, 0, n, out.data(), stream_.get()));
  return out;
}

absl::StatusOr<DeviceKvBlocks> CudaModel::ExportKv(int seq) {
  RETURN_IF_ERROR(SequenceLength(seq).status());
  DeviceKvBlocks d;
  ASSIGN_OR_RETURN(d.pool_handle, kv_->IpcHandle());
  d.device = info_.device;
  d.num_blocks = kv_->num_blocks();
  d.block_size = kKvBlockSize;
  d.blocks = store_->at(seq).blocks;
  d.sender = KvPool::ProcessToken();
  d.row_bytes = kv_->row_stride() * static_cast<int>(sizeof(bf16));
  return d;
}

absl::Status CudaModel::ImportKv(int seq, const DeviceKvBlocks& src, int length) {
  ASSIGN_OR_RETURN(const int len, SequenceLength(seq));
  // A sequence may start with blocks from the prefix cache: whole blocks,
  // the same rows as the sender's first ones; only the blocks past them come.
  if (len % kKvBlockSize != 0 || (len > 0 && len >= length) || length < 0 ||
      length > max_model_len_ || src.block_size != kKvBlockSize ||
      static_cast<int64_t>(src.blocks.size()) * kKvBlockSize < length) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaModel::ImportKv: ", length, " tokens in ", src.blocks.size(),
                     " blocks of ", src.block_size, " into a sequence of ", len, " (block size ",
                     kKvBlockSize, ", max_model_len ", max_model_len_, ")"));
  }
  const int row_bytes = kv_->row_stride() * static_cast<int>(sizeof(bf16));
  if (src.row_bytes != row_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("CudaModel::ImportKv: the sender's KV rows are ", src.row_bytes,
                     " bytes, this pool's ", row_bytes, " (", kv_->row().fp8() ? "fp8" : "bf16",
                     "): run prefill and decode workers with the same --kv_cache_dtype"));
  }
  Sequence& s = store_->at(seq);
  const int first = len / kKvBlockSize;
  const int n = (length + kKvBlockSize - 1) / kKvBlockSize - first;
  RETURN_IF_ERROR(store_->Cover(&s, length));
  const std::vector<int32_t> from(src.blocks.begin() + first, src.blocks.end());
  const std::vector<int32_t> to(s.blocks.begin() + first, s.blocks.end());
  RETURN_IF_ERROR(
      kv_->CopyBlocksFrom(src.pool_handle, src.sender, src.num_blocks, from, to, n, stream_.get()));
  s.length = length;
  return stack_->RowsArrived(seq, len, length);  // V4: its compressed entries, from the rows
}

}  // namespace moesh::cuda
