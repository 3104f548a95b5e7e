#include "common/engine/paged_kv_cache.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace moesh {

namespace {

constexpr uint64_t kHashSeed = 0x6d6f6573682d6b76ULL;  // the parent of a first block

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v;
  h *= 0x100000001b3ULL;  // FNV-1a's prime over 64-bit words
  h ^= h >> 29;
  return h;
}

uint64_t BlockHash(uint64_t parent, absl::Span<const int32_t> tokens) {
  uint64_t h = Mix(0xcbf29ce484222325ULL, parent);
  for (int32_t t : tokens) h = Mix(h, static_cast<uint32_t>(t));
  // splitmix64's finaliser: every input bit reaches every output bit.
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return h;
}

}  // namespace

std::vector<uint64_t> PrefixBlockHashes(absl::Span<const int32_t> tokens, int block_size) {
  std::vector<uint64_t> hashes;
  uint64_t parent = kHashSeed;
  for (size_t start = 0; start + block_size <= tokens.size(); start += block_size) {
    parent = BlockHash(parent, tokens.subspan(start, block_size));
    hashes.push_back(parent);
  }
  return hashes;
}

KvBlockPool::KvBlockPool(int num_layers, int row_width, int block_size, int num_blocks,
                         bool prefix_cache)
    : num_layers_(num_layers),
      row_width_(row_width),
      block_size_(block_size),
      num_blocks_(num_blocks),
      prefix_cache_(prefix_cache),
      storage_(static_cast<size_t>(num_blocks) * num_layers * block_size * row_width),
      info_(num_blocks) {
  // Lowest ids are handed out first.
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int KvBlockPool::free_blocks() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(free_.size() + lru_.size());
}

float KvBlockPool::usage() const {
  absl::MutexLock lock(&mu_);
  return num_blocks_ == 0 ? 0.0f
                          : 1.0f - static_cast<float>(free_.size() + lru_.size()) / num_blocks_;
}

PrefixCacheStats KvBlockPool::stats() const {
  absl::MutexLock lock(&mu_);
  PrefixCacheStats s = stats_;
  s.cached_blocks = static_cast<int>(by_hash_.size());
  return s;
}

std::vector<uint64_t> KvBlockPool::CachedHashes(int max) const {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> out;
  // Held blocks first (in use now), then the reclaimable ones, latest first.
  for (const auto& [hash, block] : by_hash_) {
    if (static_cast<int>(out.size()) >= max) return out;
    if (info_[block].refs > 0) out.push_back(hash);
  }
  for (auto it = lru_.rbegin(); it != lru_.rend() && static_cast<int>(out.size()) < max; ++it)
    out.push_back(info_[*it].hash);
  return out;
}

absl::StatusOr<std::unique_ptr<PagedKvSequence>> KvBlockPool::Allocate(
    int max_tokens, absl::Span<const int32_t> prefix) {
  std::vector<int> blocks;
  std::vector<uint64_t> hashes;
  absl::MutexLock lock(&mu_);
  if (prefix_cache_ && !prefix.empty()) {
    // The longest run of published blocks beginning the prefix, leaving at
    // least its last token to compute.
    const int most = (static_cast<int>(prefix.size()) - 1) / block_size_;
    uint64_t parent = kHashSeed;
    for (int i = 0; i < most; ++i) {
      const absl::Span<const int32_t> toks = prefix.subspan(i * block_size_, block_size_);
      const uint64_t h = BlockHash(parent, toks);
      const auto it = by_hash_.find(h);
      if (it == by_hash_.end()) break;
      const BlockInfo& b = info_[it->second];
      if (b.parent != parent || !std::equal(toks.begin(), toks.end(), b.tokens.begin())) break;
      blocks.push_back(it->second);
      hashes.push_back(h);
      parent = h;
    }
  }
  const int cached = static_cast<int>(blocks.size()) * block_size_;
  const int need =
      BlocksFor(std::max({max_tokens, cached + 1, 1})) - static_cast<int>(blocks.size());
  // Hold the matched blocks before taking new ones (eviction must not reclaim them).
  for (int b : blocks) {
    if (info_[b].refs++ == 0) lru_.erase(info_[b].lru);
  }
  if (absl::Status s = TakeLocked(need, &blocks); !s.ok()) {
    for (int b : blocks) {
      if (--info_[b].refs == 0) info_[b].lru = lru_.insert(lru_.end(), b);
    }
    return s;
  }
  if (prefix_cache_ && !prefix.empty()) {
    stats_.hit_tokens += cached;
    stats_.miss_tokens += static_cast<int64_t>(prefix.size()) - cached;
  }
  std::unique_ptr<PagedKvSequence> seq(new PagedKvSequence(this, std::move(blocks)));
  std::fill(seq->rows_.begin(), seq->rows_.end(), cached);
  seq->length_ = cached;
  seq->cached_tokens_ = cached;
  seq->hashes_ = std::move(hashes);
  return seq;
}

absl::Status KvBlockPool::Take(int n, std::vector<int>* blocks) {
  absl::MutexLock lock(&mu_);
  return TakeLocked(n, blocks);
}

absl::Status KvBlockPool::TakeLocked(int n, std::vector<int>* blocks) {
  if (n <= 0) return absl::OkStatus();
  const size_t reclaimable = free_.size() + lru_.size();
  if (reclaimable < static_cast<size_t>(n)) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache full: need ", n, " blocks of ",
                                                     block_size_, " tokens, ", reclaimable, " of ",
                                                     num_blocks_, " free"));
  }
  for (int i = 0; i < n; ++i) {
    int b;
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    } else {
      b = lru_.front();
      lru_.pop_front();
      BlockInfo& info = info_[b];
      by_hash_.erase(info.hash);
      info.published = false;
      info.tokens.clear();
      ++stats_.evictions;
    }
    info_[b].refs = 1;
    blocks->push_back(b);
  }
  return absl::OkStatus();
}

void KvBlockPool::Free(const std::vector<int>& blocks) {
  absl::MutexLock lock(&mu_);
  // Last block first: a prefix's tail is evicted before its head (a block is
  // reachable only through every block before it).
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    BlockInfo& info = info_[*it];
    const int b = *it;
    if (--info.refs > 0) continue;
    if (info.published) {
      info.lru = lru_.insert(lru_.end(), b);
    } else {
      free_.push_back(b);
    }
  }
}

void KvBlockPool::Publish(int block, uint64_t hash, uint64_t parent,
                          absl::Span<const int32_t> tokens) {
  absl::MutexLock lock(&mu_);
  BlockInfo& info = info_[block];
  if (info.published) return;
  if (const auto it = by_hash_.find(hash); it != by_hash_.end()) {
    // Another block holds these rows. Held, it stays the one published (this
    // one stays private); nobody holding it, this live one takes its place
    // (else evicting the idle copy would lose the prefix this one still holds).
    BlockInfo& old = info_[it->second];
    if (old.refs > 0) return;
    lru_.erase(old.lru);
    old.published = false;
    old.tokens.clear();
    free_.push_back(it->second);
  }
  info.published = true;
  info.hash = hash;
  info.parent = parent;
  info.tokens.assign(tokens.begin(), tokens.end());
  by_hash_[hash] = block;
}

absl::Status PagedKvSequence::Reserve(int tokens) {
  const int need = pool_->BlocksFor(tokens) - static_cast<int>(blocks_.size());
  return need > 0 ? pool_->Take(need, &blocks_) : absl::OkStatus();
}

void PagedKvSequence::AppendRows(int layer, const float* src, int n) {
  const int bs = pool_->block_size();
  const int w = pool_->row_width();
  for (int i = 0; i < n; ++i) {
    const int t = rows_[layer] + i;
    std::memcpy(pool_->Slot(blocks_[t / bs], layer, t % bs), src + static_cast<size_t>(i) * w,
                w * sizeof(float));
  }
  rows_[layer] += n;
  if (layer + 1 == pool_->num_layers()) length_ = rows_[layer];
}

const float* PagedKvSequence::Rows(int layer, std::vector<float>* scratch) const {
  const int bs = pool_->block_size();
  const int w = pool_->row_width();
  const int n = rows_[layer];
  scratch->resize(static_cast<size_t>(n) * w);
  for (int start = 0; start < n; start += bs) {
    const int count = std::min(bs, n - start);
    std::memcpy(scratch->data() + static_cast<size_t>(start) * w,
                pool_->Slot(blocks_[start / bs], layer, 0),
                static_cast<size_t>(count) * w * sizeof(float));
  }
  return scratch->data();
}

void PagedKvSequence::PublishPrefix(absl::Span<const int32_t> tokens) {
  if (!pool_->prefix_cache()) return;
  const int bs = pool_->block_size();
  const int full = std::min(length_, static_cast<int>(tokens.size())) / bs;
  for (int i = static_cast<int>(hashes_.size()); i < full; ++i) {
    const uint64_t parent = i == 0 ? kHashSeed : hashes_[i - 1];
    const absl::Span<const int32_t> toks = tokens.subspan(static_cast<size_t>(i) * bs, bs);
    const uint64_t h = BlockHash(parent, toks);
    pool_->Publish(blocks_[i], h, parent, toks);
    hashes_.push_back(h);
  }
}

}  // namespace moesh
