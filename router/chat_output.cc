#include "router/chat_output.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/tokenizer/dsml_encoding.h"
#include "common/tokenizer/utf8.h"

namespace moesh {
namespace {

constexpr absl::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr absl::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr absl::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr absl::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr absl::string_view kSep = "<｜tool▁sep｜>";
constexpr absl::string_view kInvokeBegin = "<｜DSML｜invoke";
constexpr absl::string_view kInvokeEnd = "</｜DSML｜invoke>";
constexpr absl::string_view kParamBegin = "<｜DSML｜parameter";
constexpr absl::string_view kParamEnd = "</｜DSML｜parameter>";

// The length of the longest suffix of `text` that is a proper prefix of
// `marker`: text a later chunk may turn into the marker.
size_t PartialMarker(absl::string_view text, absl::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (absl::StartsWith(marker, text.substr(text.size() - n))) return n;
  }
  return 0;
}

// The length of an unfinished UTF-8 character that ends `text`: the bytes a
// later chunk may complete.
size_t Utf8PartialTail(absl::string_view text) {
  for (size_t p = text.size() > 3 ? text.size() - 3 : 0; p < text.size(); ++p) {
    if (DecodeUtf8At(text, p).kind == Utf8Step::kIncomplete) return text.size() - p;
  }
  return 0;
}

}  // namespace

ChatOutputParser::ChatOutputParser(Options options)
    : options_(std::move(options)),
      dsml_open_(absl::StrCat("<｜DSML｜", options_.dsml_block, ">")),
      dsml_close_(absl::StrCat("</｜DSML｜", options_.dsml_block, ">")),
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
        if (absl::StartsWith(pending_, kThinkStart)) {
          pending_.erase(0, kThinkStart.size());
          state_ = State::kReasoning;
          continue;
        }
        if (absl::StartsWith(kThinkStart, pending_)) return;  // undecided (or empty)
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
        if (options_.tool_format == ToolFormat::kDsml) {
          if (!TakeDsmlContent(out)) return;
          state_ = State::kTools;
          continue;
        }
        if (!TakeUntil(kCallsBegin, &out->content)) return;
        raw_tools_ = std::string(kCallsBegin);
        state_ = State::kTools;
        continue;
      case State::kTools:
        if (!(options_.tool_format == ToolFormat::kDsml ? TakeDsmlCall(out) : TakeCall(out))) {
          return;
        }
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
  if (open_call_) return TakeCallArguments(out);
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
  // The header, [<｜tool▁call▁begin｜>]TYPE<｜tool▁sep｜>NAME, ends at its
  // "\n" (or at the call's end: a call without arguments).
  const size_t newline = rest.find('\n');
  const size_t end = rest.substr(0, newline).find(kCallEnd);
  if (newline == absl::string_view::npos && end == absl::string_view::npos) return false;
  const bool whole = end != absl::string_view::npos;
  absl::string_view header = rest.substr(0, whole ? end : newline);
  absl::ConsumePrefix(&header, kCallBegin);
  const size_t sep = header.find(kSep);
  if (sep != absl::string_view::npos) header.remove_prefix(sep + kSep.size());
  ParsedToolCall call;
  call.index = calls_++;
  call.id = absl::StrCat(options_.id_prefix, call.index);
  call.name = std::string(absl::StripAsciiWhitespace(header));
  AddCallPiece(out, std::move(call));
  raw_tools_.clear();
  pending_.erase(0, start + (whole ? end + kCallEnd.size() : newline + 1));
  open_call_ = !whole;
  args_ = Args::kOpening;
  fenced_ = false;
  return true;
}

bool ChatOutputParser::TakeCallArguments(ChatDelta* out) {
  constexpr absl::string_view kSpace = " \t\r\n";
  constexpr absl::string_view kFence = "```";
  const size_t end = pending_.find(kCallEnd.data(), 0, kCallEnd.size());
  const bool ended = end != std::string::npos;
  absl::string_view text = absl::string_view(pending_).substr(0, ended ? end : pending_.size());
  // Before the text: whitespace, the opening fence ("```json" or "```"),
  // whitespace again; taken once the next byte decides them.
  size_t taken = 0;
  if (args_ == Args::kOpening) {
    const size_t s = std::min(text.find_first_not_of(kSpace), text.size());
    absl::string_view rest = text.substr(s);
    if (!ended && absl::StartsWith(absl::StrCat(kFence, "json"), rest)) {
      pending_.erase(0, s);  // undecided (or empty)
      return false;
    }
    taken = s;
    if (absl::StartsWith(rest, kFence)) {
      fenced_ = true;
      taken += kFence.size() + (absl::StartsWith(rest.substr(kFence.size()), "json") ? 4 : 0);
      args_ = Args::kLeading;
    } else {
      args_ = Args::kText;
    }
  }
  if (args_ == Args::kLeading) {
    const size_t s = text.find_first_not_of(kSpace, taken);
    if (s == absl::string_view::npos && !ended) {
      pending_.clear();
      return false;
    }
    taken = std::min(s, text.size());
    args_ = Args::kText;
  }
  absl::string_view body = text.substr(taken);
  ParsedToolCall piece;
  piece.index = calls_ - 1;
  if (ended) {
    // The closing fence and the whitespace around it are the format's.
    body = absl::StripTrailingAsciiWhitespace(body);
    if (fenced_ && absl::ConsumeSuffix(&body, kFence)) {
      body = absl::StripTrailingAsciiWhitespace(body);
    }
    piece.arguments = std::string(body);
    pending_.erase(0, end + kCallEnd.size());
    open_call_ = false;
  } else {
    // Held back: what may start the end marker, then what may be the closing
    // fence with whitespace around it, then an unfinished UTF-8 character.
    size_t n = body.size() - PartialMarker(body, kCallEnd);
    while (n > 0 && kSpace.find(body[n - 1]) != absl::string_view::npos) --n;
    if (fenced_) {
      for (int ticks = 0; ticks < 3 && n > 0 && body[n - 1] == '`'; ++ticks) --n;
      while (n > 0 && kSpace.find(body[n - 1]) != absl::string_view::npos) --n;
    }
    n -= Utf8PartialTail(body.substr(0, n));
    piece.arguments = std::string(body.substr(0, n));
    pending_.erase(0, taken + n);
  }
  if (!piece.arguments.empty()) AddCallPiece(out, std::move(piece));
  return ended;
}

bool ChatOutputParser::TakeDsmlContent(ChatDelta* out) {
  const size_t at = pending_.find(dsml_open_);
  if (at == std::string::npos) {
    // Hold back what may become the opening, with the "\n\n" before it.
    const size_t keep = std::max(PartialMarker(pending_, absl::StrCat("\n\n", dsml_open_)),
                                 PartialMarker(pending_, dsml_open_));
    out->content.append(pending_, 0, pending_.size() - keep);
    pending_.erase(0, pending_.size() - keep);
    return false;
  }
  const size_t cut = at >= 2 && pending_.compare(at - 2, 2, "\n\n") == 0 ? at - 2 : at;
  out->content.append(pending_, 0, cut);
  raw_tools_ = pending_.substr(cut, at + dsml_open_.size() - cut);
  pending_.erase(0, at + dsml_open_.size());
  return true;
}

void ChatOutputParser::AddCallPiece(ChatDelta* out, ParsedToolCall piece) {
  if (!out->tool_calls.empty() && out->tool_calls.back().index == piece.index) {
    out->tool_calls.back().arguments += piece.arguments;
    return;
  }
  out->tool_calls.push_back(std::move(piece));
}

bool ChatOutputParser::TakeDsmlCall(ChatDelta* out) {
  const size_t start = pending_.find_first_not_of(" \t\r\n");
  if (start == std::string::npos) return false;
  absl::string_view rest = absl::string_view(pending_).substr(start);
  if (open_call_) return TakeDsmlParameter(out, start);
  if (absl::StartsWith(rest, dsml_close_)) {
    pending_.erase(0, start + dsml_close_.size());
    raw_tools_.clear();
    state_ = State::kAfterTools;
    return true;
  }
  // A call starts with its header `<｜DSML｜invoke name="NAME">`: reported
  // then, its arguments as its parameters come.
  const std::string header = absl::StrCat(kInvokeBegin, " name=\"");
  if (absl::StartsWith(rest, header)) {
    const size_t name_end = rest.find("\">", header.size());
    if (name_end == absl::string_view::npos) return false;
    ParsedToolCall call;
    call.index = calls_++;
    call.id = absl::StrCat(options_.id_prefix, call.index);
    call.name = std::string(rest.substr(header.size(), name_end - header.size()));
    pending_.erase(0, start + name_end + 2);
    raw_tools_.clear();
    AddCallPiece(out, std::move(call));
    open_call_ = true;
    call_params_ = 0;
    return true;
  }
  if (absl::StartsWith(header, rest)) return false;  // may still become the header
  // Not a call: content as written, once the invoke it opened ends.
  const size_t end = rest.find(kInvokeEnd);
  if (end == absl::string_view::npos) return false;
  absl::StrAppend(&out->content, raw_tools_, pending_.substr(0, start + end + kInvokeEnd.size()));
  raw_tools_.clear();
  pending_.erase(0, start + end + kInvokeEnd.size());
  return true;
}

bool ChatOutputParser::TakeDsmlParameter(ChatDelta* out, size_t start) {
  absl::string_view rest = absl::string_view(pending_).substr(start);
  ParsedToolCall piece;
  piece.index = calls_ - 1;
  if (absl::StartsWith(rest, kInvokeEnd)) {
    piece.arguments = call_params_ > 0 ? "}" : "{}";
    pending_.erase(0, start + kInvokeEnd.size());
    open_call_ = false;
    AddCallPiece(out, std::move(piece));
    return true;
  }
  if (!absl::StartsWith(rest, kParamBegin)) {
    if (absl::StartsWith(kInvokeEnd, rest) || absl::StartsWith(kParamBegin, rest)) return false;
    // Text the format does not have between parameters: dropped, up to the
    // next marker.
    const size_t next = std::min(rest.find(kParamBegin), rest.find(kInvokeEnd));
    const size_t drop = next != absl::string_view::npos
                            ? next
                            : rest.size() - std::max(PartialMarker(rest, kInvokeEnd),
                                                     PartialMarker(rest, kParamBegin));
    if (drop == 0) return false;
    pending_.erase(0, start + drop);
    return true;
  }
  const size_t end = rest.find(kParamEnd);
  if (end == absl::string_view::npos) return false;
  const std::string param(rest.substr(kParamBegin.size(), end - kParamBegin.size()));
  pending_.erase(0, start + end + kParamEnd.size());
  std::string json;
  if (!ParameterJson(param, &json)) return true;  // unreadable: dropped
  piece.arguments = absl::StrCat(call_params_++ > 0 ? ", " : "{", json);
  AddCallPiece(out, std::move(piece));
  return true;
}

bool ChatOutputParser::ParameterJson(absl::string_view param, std::string* json) {
  // ` name="K" string="true|false">V`
  if (!absl::ConsumePrefix(&param, " name=\"")) return false;
  const size_t key_end = param.find("\" string=\"");
  if (key_end == absl::string_view::npos) return false;
  const std::string key(param.substr(0, key_end));
  param.remove_prefix(key_end + 10);
  bool is_str;
  if (absl::ConsumePrefix(&param, "true\">")) {
    is_str = true;
  } else if (absl::ConsumePrefix(&param, "false\">")) {
    is_str = false;
  } else {
    return false;
  }
  *json = absl::StrCat(
      PythonJsonDumps(nlohmann::ordered_json(key)), ": ",
      is_str ? PythonJsonDumps(nlohmann::ordered_json(std::string(param))) : std::string(param));
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
      if (open_call_ && options_.tool_format == ToolFormat::kDeepSeekV3) {
        // Cut off mid-call: the end of the text ends it (a marker it began is
        // the format's, and so is a closing fence begun on a line of its own).
        pending_.resize(pending_.size() - PartialMarker(pending_, kCallEnd));
        const size_t text = pending_.find_last_not_of(" \t\r\n") + 1;
        const size_t ticks = text - std::min(text, pending_.find_last_not_of('`', text - 1) + 1);
        if (fenced_ && text > 0 && ticks < 3 && ticks < text && pending_[text - ticks - 1] == '\n')
          pending_.resize(text - ticks);
        pending_.append(kCallEnd.data(), kCallEnd.size());
        Drain(&out);
      }
      if (open_call_) {  // cut off mid-call: its arguments closed
        ParsedToolCall piece;
        piece.index = calls_ - 1;
        piece.arguments = call_params_ > 0 ? "}" : "{}";
        AddCallPiece(&out, std::move(piece));
        open_call_ = false;
      }
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
