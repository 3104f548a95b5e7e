#include "common/tokenizer/post_processor.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace moesh {

absl::StatusOr<PostProcessor> PostProcessor::FromJson(const JsonField& post_processor) {
  PostProcessor p;
  if (post_processor.is_null()) return p;
  ASSIGN_OR_RETURN(std::string type, post_processor.Type());
  if (type == "TemplateProcessing") {
    RETURN_IF_ERROR(p.ParseTemplate(post_processor));
  } else if (type == "Sequence") {
    const JsonField list = post_processor["processors"];
    RETURN_IF_ERROR(list.ExpectArray());
    for (size_t i = 0; i < list.value().size(); ++i) {
      const JsonField step = list.at(i);
      ASSIGN_OR_RETURN(std::string step_type, step.Type());
      if (step_type == "TemplateProcessing") {
        if (p.has_template_) return step.Error("a second TemplateProcessing is not supported");
        RETURN_IF_ERROR(p.ParseTemplate(step));
      } else if (step_type != "ByteLevel") {
        return step["type"].Error(
            absl::StrCat("\"", step_type, "\" is not supported (TemplateProcessing, ByteLevel)"));
      }
    }
  } else if (type != "ByteLevel") {
    return post_processor["type"].Error(
        absl::StrCat("\"", type, "\" is not supported (TemplateProcessing, ByteLevel, Sequence)"));
  }
  return p;
}

absl::Status PostProcessor::ParseTemplate(const JsonField& f) {
  has_template_ = true;
  const JsonField single = f["single"];
  RETURN_IF_ERROR(single.ExpectArray());
  const JsonField specials = f["special_tokens"];
  bool seen_sequence = false;
  for (size_t i = 0; i < single.value().size(); ++i) {
    const JsonField piece = single.at(i);
    if (!piece["Sequence"].is_null()) {
      ASSIGN_OR_RETURN(std::string id, piece["Sequence"]["id"].String());
      if (id != "A" || seen_sequence) {
        return piece["Sequence"]["id"].Error("a single template holds sequence A once");
      }
      seen_sequence = true;
      continue;
    }
    ASSIGN_OR_RETURN(std::string name, piece["SpecialToken"]["id"].String());
    const JsonField ids = specials[name]["ids"];
    RETURN_IF_ERROR(ids.ExpectArray());
    for (size_t k = 0; k < ids.value().size(); ++k) {
      ASSIGN_OR_RETURN(int64_t id, ids.at(k).Int());
      if (id < 0 || id > INT32_MAX) return ids.at(k).Error("is out of range");
      (seen_sequence ? after_ : before_).push_back(static_cast<int32_t>(id));
    }
  }
  if (!seen_sequence) return single.Error("has no Sequence A");
  return absl::OkStatus();
}

std::vector<int32_t> PostProcessor::AddSpecialTokens(std::vector<int32_t> ids) const {
  if (before_.empty() && after_.empty()) return ids;
  std::vector<int32_t> out;
  out.reserve(before_.size() + ids.size() + after_.size());
  out.insert(out.end(), before_.begin(), before_.end());
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), after_.begin(), after_.end());
  return out;
}

}  // namespace moesh
