#include "router/chat_output.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace moesh {
namespace {

constexpr absl::string_view kThinkBegin = "<think>";
constexpr absl::string_view kThinkEnd = "</think>";
constexpr absl::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr absl::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr absl::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr absl::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr absl::string_view kSep = "<｜tool▁sep｜>";

// The length of the longest suffix of `text` that is a proper prefix of
// `marker`: text a later chunk may turn into the marker.
size_t PartialMarker(absl::string_view text, absl::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (absl::StartsWith(marker, text.substr(text.size() - n))) return n;
  }
  return 0;
}

}  // namespace

ChatOutputParser::ChatOutputParser(Options options)
    : options_(std::move(options)),
      state_(!options_.reasoning     ? State::kContent
             : options_.in_reasoning ? State::kReasoning
                                     : State::kMaybeThink) {}

ChatDelta ChatOutputParser::Feed(absl::string_view text) {
  ChatDelta out;
  pending_.append(text.data(), text.size());
  Drain(&out);
  return out;
}

void ChatOutputParser::Drain(ChatDelta* out) {
  for (;;) {
    switch (state_) {
      case State::kMaybeThink:
        if (absl::StartsWith(pending_, kThinkBegin)) {
          pending_.erase(0, kThinkBegin.size());
          state_ = State::kReasoning;
          continue;
        }
        if (absl::StartsWith(kThinkBegin, pending_)) return;  // undecided (or empty)
        state_ = State::kContent;
        continue;
      case State::kReasoning:
        if (!TakeUntil(kThinkEnd, &out->reasoning)) return;
        state_ = State::kContent;
        continue;
      case State::kContent:
        if (!options_.tools) {
          out->content += pending_;
          pending_.clear();
          return;
        }
        if (!TakeUntil(kCallsBegin, &out->content)) return;
        raw_tools_ = std::string(kCallsBegin);
        state_ = State::kTools;
        continue;
      case State::kTools:
        if (!TakeCall(out)) return;
        continue;
      case State::kAfterTools:
        out->content += pending_;
        pending_.clear();
        return;
    }
  }
}

bool ChatOutputParser::TakeUntil(absl::string_view marker, std::string* into) {
  const size_t at = pending_.find(marker.data(), 0, marker.size());
  if (at != std::string::npos) {
    into->append(pending_, 0, at);
    pending_.erase(0, at + marker.size());
    return true;
  }
  const size_t keep = PartialMarker(pending_, marker);
  into->append(pending_, 0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return false;
}

bool ChatOutputParser::TakeCall(ChatDelta* out) {
  // Whitespace between calls is the format's; it is not content.
  const size_t start = pending_.find_first_not_of(" \t\r\n");
  if (start == std::string::npos) return false;
  absl::string_view rest = absl::string_view(pending_).substr(start);
  if (absl::StartsWith(rest, kCallsEnd)) {
    pending_.erase(0, start + kCallsEnd.size());
    raw_tools_.clear();
    state_ = State::kAfterTools;
    return true;
  }
  const size_t end = rest.find(kCallEnd);
  if (end == absl::string_view::npos) return false;
  // The call's text, copied: pending_ drops it below.
  const std::string call_text(rest.substr(0, end));
  absl::string_view call = call_text;
  raw_tools_.clear();
  pending_.erase(0, start + end + kCallEnd.size());
  absl::ConsumePrefix(&call, kCallBegin);
  // TYPE<｜tool▁sep｜>NAME\n```json\nARGS\n```
  const size_t sep = call.find(kSep);
  if (sep != absl::string_view::npos) call.remove_prefix(sep + kSep.size());
  const size_t newline = call.find('\n');
  ParsedToolCall parsed;
  parsed.index = calls_++;
  parsed.id = absl::StrCat(options_.id_prefix, parsed.index);
  parsed.name = std::string(absl::StripAsciiWhitespace(call.substr(0, newline)));
  absl::string_view args =
      newline == absl::string_view::npos ? absl::string_view() : call.substr(newline + 1);
  args = absl::StripAsciiWhitespace(args);
  if (absl::ConsumePrefix(&args, "```")) {
    absl::ConsumePrefix(&args, "json");
    absl::ConsumeSuffix(&args, "```");
    args = absl::StripAsciiWhitespace(args);
  }
  parsed.arguments = std::string(args);
  out->tool_calls.push_back(std::move(parsed));
  return true;
}

ChatDelta ChatOutputParser::Finish() {
  ChatDelta out;
  Drain(&out);
  switch (state_) {
    case State::kMaybeThink:
    case State::kContent:
    case State::kAfterTools:
      out.content += pending_;
      break;
    case State::kReasoning:
      out.reasoning += pending_;
      break;
    case State::kTools:
      // An unfinished call: its text, as written, is content.
      if (!absl::StripAsciiWhitespace(pending_).empty() || calls_ == 0) {
        absl::StrAppend(&out.content, raw_tools_, pending_);
      }
      break;
  }
  pending_.clear();
  raw_tools_.clear();
  state_ = State::kAfterTools;
  return out;
}

}  // namespace moesh
