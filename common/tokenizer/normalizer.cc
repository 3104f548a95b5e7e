#include "common/tokenizer/normalizer.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace moesh {
namespace {

absl::Status Collect(const JsonField& f, bool* nfc) {
  if (f.is_null()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string type, f.Type());
  if (type == "NFC") {
    *nfc = true;
    return absl::OkStatus();
  }
  if (type == "Sequence") {
    const JsonField list = f["normalizers"];
    RETURN_IF_ERROR(list.ExpectArray());
    for (size_t i = 0; i < list.value().size(); ++i) RETURN_IF_ERROR(Collect(list.at(i), nfc));
    return absl::OkStatus();
  }
  return f["type"].Error(
      absl::StrCat("normalizer \"", type, "\" is not supported (NFC, Sequence)"));
}

}  // namespace

absl::StatusOr<Normalizer> Normalizer::FromJson(const JsonField& normalizer) {
  Normalizer n;
  RETURN_IF_ERROR(Collect(normalizer, &n.nfc_));
  if (n.nfc_) {
    UErrorCode status = U_ZERO_ERROR;
    icu::Normalizer2::getNFCInstance(status);
    if (U_FAILURE(status)) {
      return absl::InternalError(absl::StrCat("ICU has no NFC data: ", u_errorName(status)));
    }
  }
  return n;
}

std::string Normalizer::Normalize(absl::string_view text) const {
  if (!nfc_) return std::string(text);
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  const icu::UnicodeString in = icu::UnicodeString::fromUTF8(
      icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  if (U_SUCCESS(status) && nfc->isNormalized(in, status) && U_SUCCESS(status)) {
    return std::string(text);
  }
  status = U_ZERO_ERROR;
  const icu::UnicodeString out = nfc->normalize(in, status);
  std::string result;
  out.toUTF8String(result);
  return result;
}

}  // namespace moesh
