#include "common/transport/kv_handoff.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/dtype.h"

namespace moesh {

absl::StatusOr<v1::PushKvRequest> SerializeKv(const std::string& request_id, const KvSequence& kv,
                                              int num_layers, KvHandoff how) {
  v1::PushKvRequest msg;
  msg.set_request_id(request_id);
  msg.set_num_layers(num_layers);
  msg.set_num_tokens(kv.length());
  msg.set_row_width(kv.row_width());
  if (how == KvHandoff::kDevice) {
    absl::StatusOr<DeviceKvBlocks> d = kv.DeviceBlocks();
    if (!d.ok()) return d.status();
    v1::DeviceKv* dev = msg.mutable_device();
    dev->set_pool_handle(d->pool_handle);
    dev->set_device(d->device);
    dev->set_num_blocks(d->num_blocks);
    dev->set_block_size(d->block_size);
    for (int32_t b : d->blocks) dev->add_blocks(b);
    dev->set_sender(d->sender);
    return msg;
  }
  const bool bf16 = kv.bf16_rows();
  msg.set_rows_bf16(bf16);
  const size_t layer_values = static_cast<size_t>(kv.length()) * kv.row_width();
  const size_t layer_bytes = layer_values * (bf16 ? sizeof(uint16_t) : sizeof(float));
  std::string* rows = msg.mutable_rows();
  rows->resize(layer_bytes * num_layers);
  std::vector<float> scratch;
  std::vector<uint16_t> halves(bf16 ? layer_values : 0);
  for (int l = 0; l < num_layers; ++l) {
    const float* src = kv.Rows(l, &scratch);
    if (bf16) {
      for (size_t i = 0; i < layer_values; ++i)
        halves[i] = F32ToBf16(src[i]);  // exact: bf16 values
      std::memcpy(rows->data() + l * layer_bytes, halves.data(), layer_bytes);
    } else {
      std::memcpy(rows->data() + l * layer_bytes, src, layer_bytes);
    }
  }
  return msg;
}

absl::Status DeserializeKv(const v1::PushKvRequest& msg, int num_layers, KvSequence* kv) {
  if (msg.num_layers() != num_layers || msg.row_width() != kv->row_width()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV for ", msg.request_id(), " has ", msg.num_layers(), " layers of width ",
                     msg.row_width(), ", expected ", num_layers, " of width ", kv->row_width()));
  }
  if (kv->length() != 0)
    return absl::FailedPreconditionError("KV already received for " + msg.request_id());
  if (msg.num_tokens() > kv->capacity()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV for ", msg.request_id(), " holds ", msg.num_tokens(),
                     " tokens; the reservation holds ", kv->capacity()));
  }
  if (msg.has_device()) {
    const v1::DeviceKv& dev = msg.device();
    if (msg.num_tokens() < 0 || dev.block_size() <= 0 || !msg.rows().empty() ||
        static_cast<int64_t>(dev.blocks_size()) * dev.block_size() < msg.num_tokens()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV for ", msg.request_id(), ": ", dev.blocks_size(), " device blocks of ",
          dev.block_size(), " do not hold ", msg.num_tokens(), " tokens (or rows sent too)"));
    }
    DeviceKvBlocks src;
    src.pool_handle = dev.pool_handle();
    src.device = dev.device();
    src.num_blocks = dev.num_blocks();
    src.block_size = dev.block_size();
    src.blocks.assign(dev.blocks().begin(), dev.blocks().end());
    src.sender = dev.sender();
    return kv->AppendDeviceBlocks(src, msg.num_tokens());
  }
  const size_t layer_values = static_cast<size_t>(std::max(msg.num_tokens(), 0)) * msg.row_width();
  const size_t layer_bytes = layer_values * (msg.rows_bf16() ? sizeof(uint16_t) : sizeof(float));
  if (msg.num_tokens() < 0 || msg.rows().size() != layer_bytes * num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("KV for ", msg.request_id(), ": ",
                                                   msg.rows().size(), " bytes do not hold ",
                                                   msg.num_tokens(), " tokens"));
  }
  std::vector<float> layer(layer_values);
  std::vector<uint16_t> halves(msg.rows_bf16() ? layer_values : 0);
  for (int l = 0; l < num_layers; ++l) {
    if (msg.rows_bf16()) {
      std::memcpy(halves.data(), msg.rows().data() + l * layer_bytes, layer_bytes);
      for (size_t i = 0; i < layer_values; ++i) layer[i] = Bf16ToF32(halves[i]);
    } else {
      std::memcpy(layer.data(), msg.rows().data() + l * layer_bytes, layer_bytes);  // aligned copy
    }
    kv->AppendRows(l, layer.data(), msg.num_tokens());
  }
  return absl::OkStatus();
}

}  // namespace moesh
