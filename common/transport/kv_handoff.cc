#include "common/transport/kv_handoff.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/dtype.h"

namespace moesh {

absl::StatusOr<KvTransfer> SerializeKv(const std::string& request_id, const KvSequence& kv,
                                       int num_layers, KvHandoff how, int first_row) {
  KvTransfer t;
  t.request_id = request_id;
  t.num_layers = num_layers;
  t.num_tokens = kv.length();
  t.row_width = kv.row_width();
  if (how == KvHandoff::kDevice) {
    absl::StatusOr<DeviceKvBlocks> d = kv.DeviceBlocks();
    if (!d.ok()) return d.status();
    t.device = *std::move(d);
    return t;
  }
  const bool bf16 = kv.bf16_rows();
  t.rows_bf16 = bf16;
  t.first_row = std::clamp(first_row, 0, kv.length());
  const size_t skip_values = static_cast<size_t>(t.first_row) * kv.row_width();
  const size_t layer_values = static_cast<size_t>(kv.length() - t.first_row) * kv.row_width();
  if (bf16) {
    t.bf16_rows.resize(layer_values * num_layers);
  } else {
    t.rows.resize(layer_values * num_layers);
  }
  std::vector<float> scratch;
  for (int l = 0; l < num_layers; ++l) {
    const float* src = kv.Rows(l, &scratch) + skip_values;
    if (bf16) {
      uint16_t* dst = t.bf16_rows.data() + l * layer_values;
      for (size_t i = 0; i < layer_values; ++i) dst[i] = F32ToBf16(src[i]);  // exact: bf16 values
    } else {
      std::memcpy(t.rows.data() + l * layer_values, src, layer_values * sizeof(float));
    }
  }
  return t;
}

absl::Status CheckKvTransfer(const KvTransfer& t) {
  if (t.cached_tokens < 0 || t.cached_tokens > std::max(t.num_tokens, 0)) {
    return absl::InvalidArgumentError(absl::StrCat("KV for ", t.request_id, ": ", t.cached_tokens,
                                                   " cached tokens of ", t.num_tokens));
  }
  if (t.device.has_value()) {
    const DeviceKvBlocks& dev = *t.device;
    if (t.num_tokens < 0 || dev.block_size <= 0 || !t.rows.empty() || !t.bf16_rows.empty() ||
        t.first_row != 0 ||
        static_cast<int64_t>(dev.blocks.size()) * dev.block_size < t.num_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV for ", t.request_id, ": ", dev.blocks.size(), " device blocks of ", dev.block_size,
          " do not hold ", t.num_tokens, " tokens (or rows sent too)"));
    }
    return absl::OkStatus();
  }
  const size_t element = t.rows_bf16 ? sizeof(uint16_t) : sizeof(float);
  const size_t bytes =
      t.rows_bf16 ? t.bf16_rows.size() * sizeof(uint16_t) : t.rows.size() * sizeof(float);
  const bool other_empty = t.rows_bf16 ? t.rows.empty() : t.bf16_rows.empty();
  if (t.num_tokens < 0 || t.num_layers < 0 || t.row_width < 0 || !other_empty || t.first_row < 0 ||
      t.first_row > t.num_tokens ||
      bytes !=
          static_cast<size_t>(t.num_tokens - t.first_row) * t.row_width * element * t.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV for ", t.request_id, ": ", bytes, " bytes do not hold ",
        t.first_row == 0 ? absl::StrCat(t.num_tokens, " tokens")
                         : absl::StrCat("tokens ", t.first_row, " to ", t.num_tokens)));
  }
  return absl::OkStatus();
}

absl::Status DeserializeKv(const KvTransfer& t, int num_layers, KvSequence* kv) {
  if (t.num_layers != num_layers || t.row_width != kv->row_width()) {
    return absl::InvalidArgumentError(absl::StrCat("KV for ", t.request_id, " has ", t.num_layers,
                                                   " layers of width ", t.row_width, ", expected ",
                                                   num_layers, " of width ", kv->row_width()));
  }
  // A sequence starting with rows from its pool's prefix cache holds the
  // transfer's first `skip` rows already (the same tokens' rows): it takes
  // only the rest.
  const int skip = kv->cached_tokens();
  if (kv->length() != skip)
    return absl::FailedPreconditionError("KV already received for " + t.request_id);
  if (t.first_row > skip) {
    return absl::FailedPreconditionError(absl::StrCat("KV for ", t.request_id, ": rows from token ",
                                                      t.first_row, " for a sequence holding ", skip,
                                                      " cached ones"));
  }
  if (skip > 0 && skip >= t.num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("KV for ", t.request_id, ": ", t.num_tokens,
                                                   " tokens for a sequence holding ", skip,
                                                   " cached ones"));
  }
  if (t.num_tokens > kv->capacity()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV for ", t.request_id, " holds ", t.num_tokens,
                     " tokens; the reservation holds ", kv->capacity()));
  }
  if (absl::Status s = CheckKvTransfer(t); !s.ok()) return s;
  if (t.device.has_value()) return kv->AppendDeviceBlocks(*t.device, t.num_tokens);
  const size_t layer_values = static_cast<size_t>(t.num_tokens - t.first_row) * t.row_width;
  std::vector<float> layer(t.rows_bf16 ? layer_values : 0);
  for (int l = 0; l < num_layers; ++l) {
    const float* src;
    if (t.rows_bf16) {
      const uint16_t* halves = t.bf16_rows.data() + l * layer_values;
      for (size_t i = 0; i < layer_values; ++i) layer[i] = Bf16ToF32(halves[i]);
      src = layer.data();
    } else {
      src = t.rows.data() + l * layer_values;
    }
    kv->AppendRows(l, src + static_cast<size_t>(skip - t.first_row) * t.row_width,
                   t.num_tokens - skip);
  }
  return absl::OkStatus();
}

}  // namespace moesh
