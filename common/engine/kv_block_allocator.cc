#include "common/engine/kv_block_allocator.h"

#include <algorithm>

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

KvBlockAllocator::KvBlockAllocator(int block_size, int num_blocks, bool prefix_cache)
    : block_size_(block_size),
      num_blocks_(num_blocks),
      prefix_cache_(prefix_cache),
      info_(num_blocks) {
  // Lowest ids are handed out first.
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int KvBlockAllocator::free_blocks() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(free_.size() + lru_.size());
}

float KvBlockAllocator::usage() const {
  absl::MutexLock lock(&mu_);
  return num_blocks_ == 0 ? 0.0f
                          : 1.0f - static_cast<float>(free_.size() + lru_.size()) / num_blocks_;
}

PrefixCacheStats KvBlockAllocator::stats() const {
  absl::MutexLock lock(&mu_);
  PrefixCacheStats s = stats_;
  s.cached_blocks = static_cast<int>(by_hash_.size());
  return s;
}

std::vector<uint64_t> KvBlockAllocator::CachedHashes(int max) const {
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

absl::StatusOr<KvBlockRun> KvBlockAllocator::Allocate(int max_tokens,
                                                      absl::Span<const int32_t> prefix) {
  KvBlockRun run;
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
      run.blocks.push_back(it->second);
      run.hashes.push_back(h);
      parent = h;
    }
  }
  run.cached_tokens = static_cast<int>(run.blocks.size()) * block_size_;
  const int need = BlocksFor(std::max({max_tokens, run.cached_tokens + 1, 1})) -
                   static_cast<int>(run.blocks.size());
  // Hold the matched blocks before taking new ones (eviction must not reclaim them).
  for (int b : run.blocks) {
    if (info_[b].refs++ == 0) lru_.erase(info_[b].lru);
  }
  if (absl::Status s = TakeLocked(need, &run.blocks); !s.ok()) {
    for (int b : run.blocks) {
      if (--info_[b].refs == 0) info_[b].lru = lru_.insert(lru_.end(), b);
    }
    return s;
  }
  if (prefix_cache_ && !prefix.empty()) {
    stats_.hit_tokens += run.cached_tokens;
    stats_.miss_tokens += static_cast<int64_t>(prefix.size()) - run.cached_tokens;
  }
  return run;
}

absl::Status KvBlockAllocator::Take(int n, std::vector<int>* blocks) {
  absl::MutexLock lock(&mu_);
  return TakeLocked(n, blocks);
}

absl::Status KvBlockAllocator::TakeLocked(int n, std::vector<int>* blocks) {
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

void KvBlockAllocator::Free(absl::Span<const int> blocks) {
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

void KvBlockAllocator::PublishPrefix(absl::Span<const int> blocks, int length,
                                     absl::Span<const int32_t> tokens,
                                     std::vector<uint64_t>* hashes) {
  if (!prefix_cache_) return;
  const int full = std::min({length, static_cast<int>(tokens.size()),
                             static_cast<int>(blocks.size()) * block_size_}) /
                   block_size_;
  if (static_cast<int>(hashes->size()) >= full) return;
  absl::MutexLock lock(&mu_);
  for (int i = static_cast<int>(hashes->size()); i < full; ++i) {
    const uint64_t parent = i == 0 ? kHashSeed : (*hashes)[i - 1];
    const absl::Span<const int32_t> toks =
        tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    const uint64_t h = BlockHash(parent, toks);
    PublishLocked(blocks[i], h, parent, toks);
    hashes->push_back(h);
  }
}

void KvBlockAllocator::PublishLocked(int block, uint64_t hash, uint64_t parent,
                                     absl::Span<const int32_t> tokens) {
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

}  // namespace moesh
