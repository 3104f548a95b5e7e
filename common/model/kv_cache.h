// The MLA latent KV cache of one sequence, kept contiguously per layer.
//
// Each token contributes one row per layer: [kv_lora_rank normalised latent |
// qk_rope_head_dim roped key]. This is the reference cache of the CPU engine;
// the serving engine's paged cache stores the same rows in fixed-size blocks.
// Not thread-safe; one owner (the sequence) at a time.
#ifndef MOESH_COMMON_MODEL_KV_CACHE_H_
#define MOESH_COMMON_MODEL_KV_CACHE_H_

#include <cstdint>
#include <vector>

namespace moesh {

class SequenceKvCache {
 public:
  SequenceKvCache(int num_layers, int row_width) : row_width_(row_width), layers_(num_layers) {}

  int row_width() const { return row_width_; }
  // Tokens whose rows every layer holds.
  int length() const { return length_; }

  // Appends `n` rows to `layer`; returns where to write them ([n, row_width]).
  // REQUIRES: the rows of earlier layers for the same tokens are appended
  // first; the call for the last layer advances length().
  float* Append(int layer, int n);
  // [rows(layer), row_width] of `layer`, rows = length() or length() + n
  // while a forward pass is appending.
  const float* rows(int layer) const { return layers_[layer].data(); }
  int num_rows(int layer) const { return static_cast<int>(layers_[layer].size()) / row_width_; }

  // Drops every token at index >= n.
  void Truncate(int n);

 private:
  const int row_width_;
  int length_ = 0;
  std::vector<std::vector<float>> layers_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_MODEL_KV_CACHE_H_
