#include "common/transport/kv_wire.h"

#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/transport/token_wire.h"

namespace moesh {

void EncodePushKv(const KvTransfer& t, v1::PushKvRequest* request) {
  request->set_request_id(t.request_id);
  request->set_num_layers(t.num_layers);
  request->set_num_tokens(t.num_tokens);
  request->set_row_width(t.row_width);
  request->set_first_token(t.first_token);
  LogprobsToProto(t.first_logprobs, request->mutable_first_logprobs());
  request->set_queue_seconds(t.queue_seconds);
  request->set_first_token_logprob(t.first_logprob);
  if (t.prompt_logprobs.has_value())
    PromptLogprobsToProto(*t.prompt_logprobs, request->mutable_prompt_logprobs());
  request->set_cached_tokens(t.cached_tokens);
  request->set_first_row(t.first_row);
  if (t.device.has_value()) {
    const DeviceKvBlocks& d = *t.device;
    v1::DeviceKv* dev = request->mutable_device();
    dev->set_pool_handle(d.pool_handle);
    dev->set_device(d.device);
    dev->set_num_blocks(d.num_blocks);
    dev->set_block_size(d.block_size);
    for (int32_t b : d.blocks) dev->add_blocks(b);
    dev->set_sender(d.sender);
    dev->set_row_bytes(d.row_bytes);
    return;
  }
  request->set_rows_bf16(t.rows_bf16);
  if (t.rows_bf16) {
    request->set_rows(reinterpret_cast<const char*>(t.bf16_rows.data()),
                      t.bf16_rows.size() * sizeof(uint16_t));
  } else {
    request->set_rows(reinterpret_cast<const char*>(t.rows.data()), t.rows.size() * sizeof(float));
  }
}

absl::StatusOr<KvTransfer> DecodePushKv(const v1::PushKvRequest& request) {
  KvTransfer t;
  t.request_id = request.request_id();
  t.num_layers = request.num_layers();
  t.num_tokens = request.num_tokens();
  t.row_width = request.row_width();
  t.first_token = request.first_token();
  t.first_logprobs = LogprobsFromProto(request.first_logprobs());
  t.queue_seconds = request.queue_seconds();
  t.first_logprob = request.first_token_logprob();
  if (request.has_prompt_logprobs())
    t.prompt_logprobs = PromptLogprobsFromProto(request.prompt_logprobs());
  t.cached_tokens = request.cached_tokens();
  t.first_row = request.first_row();
  if (request.has_device()) {
    const v1::DeviceKv& dev = request.device();
    DeviceKvBlocks d;
    d.pool_handle = dev.pool_handle();
    d.device = dev.device();
    d.num_blocks = dev.num_blocks();
    d.block_size = dev.block_size();
    d.blocks.assign(dev.blocks().begin(), dev.blocks().end());
    d.sender = dev.sender();
    d.row_bytes = dev.row_bytes();
    t.device = std::move(d);
    // Rows besides device blocks are malformed; a placeholder row has
    // CheckKvTransfer say so ("or rows sent too").
    if (!request.rows().empty()) t.rows.resize(1);
    if (absl::Status s = CheckKvTransfer(t); !s.ok()) return s;
    return t;
  }
  t.rows_bf16 = request.rows_bf16();
  const std::string& rows = request.rows();
  const size_t element = t.rows_bf16 ? sizeof(uint16_t) : sizeof(float);
  if (rows.size() % element != 0) {  // no whole number of values: the shape check's message
    return absl::InvalidArgumentError(absl::StrCat("KV for ", t.request_id, ": ", rows.size(),
                                                   " bytes do not hold ", t.num_tokens, " tokens"));
  }
  if (t.rows_bf16) {
    t.bf16_rows.resize(rows.size() / element);
    std::memcpy(t.bf16_rows.data(), rows.data(), rows.size());
  } else {
    t.rows.resize(rows.size() / element);
    std::memcpy(t.rows.data(), rows.data(), rows.size());
  }
  if (absl::Status s = CheckKvTransfer(t); !s.ok()) return s;
  return t;
}

absl::Status ServePushKv(KvHandler& handler, const v1::PushKvRequest& request) {
  absl::StatusOr<KvTransfer> transfer = DecodePushKv(request);
  if (!transfer.ok()) return transfer.status();
  return handler.PushKv(*transfer);
}

}  // namespace moesh
