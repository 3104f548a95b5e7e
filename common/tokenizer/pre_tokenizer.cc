#include "common/tokenizer/pre_tokenizer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/tokenizer/utf8.h"

namespace moesh {
namespace {

absl::StatusOr<SplitRegex> ParseSplit(const JsonField& f) {
  const JsonField pattern = f["pattern"];
  RETURN_IF_ERROR(pattern.ExpectObject());
  absl::StatusOr<SplitRegex> re;
  if (!pattern["Regex"].is_null()) {
    ASSIGN_OR_RETURN(std::string regex, pattern["Regex"].String());
    re = SplitRegex::Compile(regex);
    if (!re.ok()) return pattern["Regex"].Error(re.status().message());
  } else {
    ASSIGN_OR_RETURN(std::string literal, pattern["String"].String());
    if (literal.empty() || !ValidateUtf8(literal).ok()) {
      return pattern["String"].Error("must be a non-empty UTF-8 string");
    }
    re = SplitRegex::Literal(literal);
  }
  ASSIGN_OR_RETURN(std::string behavior, f["behavior"].String());
  if (behavior != "Isolated") {
    return f["behavior"].Error(absl::StrCat("\"", behavior, "\" is not supported (Isolated)"));
  }
  ASSIGN_OR_RETURN(bool invert, f["invert"].Bool(false));
  if (invert) return f["invert"].Error("true is not supported");
  return re;
}

absl::Status CheckByteLevel(const JsonField& f) {
  ASSIGN_OR_RETURN(bool add_prefix_space, f["add_prefix_space"].Bool(true));
  if (add_prefix_space) return f["add_prefix_space"].Error("must be false");
  ASSIGN_OR_RETURN(bool use_regex, f["use_regex"].Bool(true));
  if (use_regex) return f["use_regex"].Error("must be false (the Split steps do the splitting)");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PreTokenizer> PreTokenizer::FromJson(const JsonField& pre_tokenizer) {
  if (pre_tokenizer.is_null()) {
    return pre_tokenizer.Error("missing (a byte-level tokenizer needs a ByteLevel pre_tokenizer)");
  }
  ASSIGN_OR_RETURN(std::string type, pre_tokenizer.Type());
  PreTokenizer result;
  if (type == "ByteLevel") {
    RETURN_IF_ERROR(CheckByteLevel(pre_tokenizer));
    return result;
  }
  if (type != "Sequence") {
    return pre_tokenizer["type"].Error(
        absl::StrCat("\"", type, "\" is not supported (Sequence, ByteLevel)"));
  }
  const JsonField steps = pre_tokenizer["pretokenizers"];
  RETURN_IF_ERROR(steps.ExpectArray());
  const size_t n = steps.value().size();
  for (size_t i = 0; i < n; ++i) {
    const JsonField step = steps.at(i);
    ASSIGN_OR_RETURN(std::string step_type, step.Type());
    if (step_type == "Split") {
      ASSIGN_OR_RETURN(SplitRegex re, ParseSplit(step));
      result.splits_.push_back(std::move(re));
    } else if (step_type == "ByteLevel") {
      if (i + 1 != n) return step.Error("ByteLevel must be the last step");
      RETURN_IF_ERROR(CheckByteLevel(step));
    } else {
      return step["type"].Error(
          absl::StrCat("\"", step_type, "\" is not supported (Split, ByteLevel)"));
    }
  }
  if (n == 0 || steps.at(n - 1)["type"].value() != "ByteLevel") {
    return steps.Error("must end with a ByteLevel step");
  }
  return result;
}

void PreTokenizer::Split(absl::string_view text, std::vector<absl::string_view>* pieces) const {
  if (text.empty()) return;
  std::vector<char32_t> cps;
  std::vector<size_t> offsets;
  DecodeUtf8(text, &cps, &offsets);
  std::vector<std::pair<size_t, size_t>> current = {{0, cps.size()}}, next, matches;
  for (const SplitRegex& re : splits_) {
    next.clear();
    for (const auto& [begin, end] : current) {
      matches.clear();
      re.FindAll(absl::MakeConstSpan(cps).subspan(begin, end - begin), &matches);
      size_t pos = begin;
      for (const auto& [mb, me] : matches) {
        if (begin + mb > pos) next.emplace_back(pos, begin + mb);
        next.emplace_back(begin + mb, begin + me);
        pos = begin + me;
      }
      if (end > pos) next.emplace_back(pos, end);
    }
    current.swap(next);
  }
  for (const auto& [begin, end] : current) {
    pieces->push_back(text.substr(offsets[begin], offsets[end] - offsets[begin]));
  }
}

}  // namespace moesh
