#include "cli/serving_workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace moesh::cli {

int LognormalLength(double mean, double sigma, std::mt19937_64* rng) {
  if (sigma <= 0) return std::max(1, static_cast<int>(std::lround(mean)));
  // E[exp(N(mu, sigma))] = exp(mu + sigma^2 / 2) = mean.
  std::lognormal_distribution<double> d(std::log(std::max(mean, 1.0)) - sigma * sigma / 2, sigma);
  return std::max(1, static_cast<int>(std::lround(d(*rng))));
}

std::vector<int32_t> RandomTokens(int n, int vocab, std::mt19937_64* rng) {
  std::uniform_int_distribution<int32_t> d(2, std::max(vocab - 1, 2));
  std::vector<int32_t> out(std::max(n, 0));
  for (int32_t& t : out) t = d(*rng);
  return out;
}

std::vector<Conversation> RandomDataset(int n, double prompt_mean, double output_mean, double sigma,
                                        int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Conversation> out(std::max(n, 0));
  for (Conversation& c : out) {
    c.user.push_back(RandomTokens(LognormalLength(prompt_mean, sigma, &rng), vocab, &rng));
    c.max_new_tokens.push_back(LognormalLength(output_mean, sigma, &rng));
  }
  return out;
}

std::vector<Conversation> MultiTurnDataset(int n, int turns, int system_prompts, int system_len,
                                           double prompt_mean, double output_mean, double sigma,
                                           int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> systems(std::max(system_prompts, 1));
  for (auto& s : systems) s = RandomTokens(system_len, vocab, &rng);
  std::vector<Conversation> out(std::max(n, 0));
  for (size_t i = 0; i < out.size(); ++i) {
    Conversation& c = out[i];
    c.prefix = systems[i % systems.size()];
    for (int t = 0; t < std::max(turns, 1); ++t) {
      c.user.push_back(RandomTokens(LognormalLength(prompt_mean, sigma, &rng), vocab, &rng));
      c.max_new_tokens.push_back(LognormalLength(output_mean, sigma, &rng));
    }
  }
  return out;
}

absl::StatusOr<std::vector<Conversation>> ShareGptDataset(
    const std::string& path, int n,
    const std::function<absl::StatusOr<std::vector<int32_t>>(const std::string&)>& tokenize) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open the ShareGPT file ", path));
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": a ShareGPT file is a JSON array of {\"conversations\": [...]}"));
  }
  std::vector<Conversation> out;
  for (const nlohmann::json& entry : j) {
    if (static_cast<int>(out.size()) >= n) break;
    if (!entry.is_object() || !entry.contains("conversations")) continue;
    const nlohmann::json& turns = entry["conversations"];
    if (!turns.is_array() || turns.size() < 2) continue;
    const nlohmann::json &ask = turns[0], &reply = turns[1];
    if (!ask.is_object() || !reply.is_object() || !ask.contains("value") ||
        !reply.contains("value") || !ask["value"].is_string() || !reply["value"].is_string()) {
      continue;
    }
    const std::string from = ask.value("from", "");
    if (from != "human" && from != "user") continue;
    absl::StatusOr<std::vector<int32_t>> prompt = tokenize(ask["value"].get<std::string>());
    if (!prompt.ok()) return prompt.status();
    absl::StatusOr<std::vector<int32_t>> answer = tokenize(reply["value"].get<std::string>());
    if (!answer.ok()) return answer.status();
    if (prompt->empty()) continue;
    Conversation c;
    c.user.push_back(std::move(*prompt));
    c.max_new_tokens.push_back(std::max<int>(1, static_cast<int>(answer->size())));
    out.push_back(std::move(c));
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no usable entries"));
  return out;
}

RequestRecord StreamGenerate(v1::Generation::Stub* stub, const v1::GenerateRequest& request,
                             std::chrono::seconds timeout,
                             const std::function<void(int)>& on_tokens) {
  using Clock = std::chrono::steady_clock;
  RequestRecord rec;
  rec.prompt_tokens = request.token_ids().ids_size();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  const auto t0 = Clock::now();
  auto reader = stub->Generate(&ctx, request);
  v1::GenerateResponse m;
  bool first = true;
  auto last = t0;
  while (reader->Read(&m)) {
    if (m.has_final()) {
      rec.cached_tokens = m.final().usage().cached_tokens();
      if (m.final().usage().prompt_tokens() > 0)
        rec.prompt_tokens = m.final().usage().prompt_tokens();
    }
    if (m.token_ids_size() == 0) continue;
    const auto now = Clock::now();
    const double since = std::chrono::duration<double>(now - last).count();
    if (first) {
      rec.ttft = std::chrono::duration<double>(now - t0).count();
      first = false;
    } else {
      for (int k = 0; k < m.token_ids_size(); ++k) rec.itl.push_back(since / m.token_ids_size());
    }
    last = now;
    rec.output.insert(rec.output.end(), m.token_ids().begin(), m.token_ids().end());
    if (on_tokens) on_tokens(m.token_ids_size());
  }
  const grpc::Status s = reader->Finish();
  rec.e2e = std::chrono::duration<double>(Clock::now() - t0).count();
  rec.output_tokens = static_cast<int>(rec.output.size());
  rec.code = s.error_code();
  rec.error = s.error_message();
  return rec;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

double SteadyTokensPerSecond(const std::vector<RequestRecord>& records, int concurrency) {
  std::vector<double> firsts;
  double last_send = 0;
  for (const RequestRecord& r : records) {
    last_send = std::max(last_send, r.start);
    if (r.code == grpc::StatusCode::OK) firsts.push_back(r.start + r.ttft);
  }
  if (concurrency < 1 || static_cast<int>(firsts.size()) < concurrency) return 0;
  std::nth_element(firsts.begin(), firsts.begin() + (concurrency - 1), firsts.end());
  const double from = firsts[concurrency - 1], to = last_send;
  if (!(to > from)) return 0;
  int64_t tokens = 0;
  for (const RequestRecord& r : records) {
    if (r.code != grpc::StatusCode::OK) continue;
    double at = r.start + r.ttft;
    tokens += at >= from && at <= to;
    for (double gap : r.itl) {
      at += gap;
      tokens += at >= from && at <= to;
    }
  }
  return static_cast<double>(tokens) / (to - from);
}

RunSummary RunSummary::Of(const std::vector<RequestRecord>& records, double seconds,
                          double slo_ttft_s, double slo_itl_s) {
  RunSummary s;
  s.seconds = seconds;
  std::vector<double> ttft, itl, e2e;
  for (const RequestRecord& r : records) {
    ++s.sent;
    if (r.code != grpc::StatusCode::OK) {
      ++(r.code == grpc::StatusCode::RESOURCE_EXHAUSTED ? s.refused : s.failed);
      if (s.first_error.empty()) s.first_error = r.error;
      continue;
    }
    ++s.completed;
    s.prompt_tokens += r.prompt_tokens;
    s.output_tokens += r.output_tokens;
    s.cached_tokens += r.cached_tokens;
    ttft.push_back(r.ttft);
    e2e.push_back(r.e2e);
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
    double mean_itl = 0;
    for (double x : r.itl) mean_itl += x;
    if (!r.itl.empty()) mean_itl /= static_cast<double>(r.itl.size());
    if ((slo_ttft_s <= 0 || r.ttft <= slo_ttft_s) && (slo_itl_s <= 0 || mean_itl <= slo_itl_s))
      ++s.good;
  }
  const double ps[3] = {0.5, 0.9, 0.99};
  for (int i = 0; i < 3; ++i) {
    s.ttft[i] = Percentile(ttft, ps[i]);
    s.itl[i] = Percentile(itl, ps[i]);
    s.e2e[i] = Percentile(e2e, ps[i]);
  }
  return s;
}

}  // namespace moesh::cli
