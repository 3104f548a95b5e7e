#include "common/tokenizer/char_class.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <iterator>
#include <string>

namespace moesh {
namespace {

struct OverlayRow {
  UChar32 first, last;
  uint32_t major;  // U_GC_L_MASK, U_GC_M_MASK, ...
};

// Characters newer than ICU's Unicode version that the tokenizers library already
// classifies (see unicode_overlay_gen.cc). Sorted, disjoint.
constexpr OverlayRow kOverlay[] = {
#include "common/tokenizer/unicode_overlay.inc"
};

// The general-category mask of c: ICU's, or for code points ICU does not know yet, the
// whole major category (e.g. U_GC_L_MASK) that the overlay gives, or Cn.
uint32_t CategoryOf(char32_t c, bool* major_only) {
  const UChar32 cp = static_cast<UChar32>(c);
  const uint32_t gc = U_GET_GC_MASK(cp);
  *major_only = false;
  if (gc != U_GC_CN_MASK) return gc;
  const OverlayRow* row =
      std::upper_bound(std::begin(kOverlay), std::end(kOverlay), cp,
                       [](UChar32 value, const OverlayRow& r) { return value < r.first; });
  if (row == std::begin(kOverlay) || cp > (row - 1)->last) return gc;
  *major_only = true;
  return (row - 1)->major;
}

}  // namespace

std::optional<uint32_t> CharClass::CategoryMask(absl::string_view name) {
  const int32_t mask =
      u_getPropertyValueEnum(UCHAR_GENERAL_CATEGORY_MASK, std::string(name).c_str());
  if (mask == UCHAR_INVALID_CODE || mask <= 0) return std::nullopt;
  return static_cast<uint32_t>(mask);
}

CharClass CharClass::Single(char32_t c) {
  CharClass cls;
  cls.AddRange(c, c);
  return cls;
}

CharClass CharClass::Category(uint32_t mask, bool negated) {
  CharClass cls;
  if (negated) {
    cls.not_categories_.push_back(mask);
  } else {
    cls.categories_ = mask;
  }
  return cls;
}

CharClass CharClass::Whitespace(bool negated) {
  CharClass cls;
  (negated ? cls.not_whitespace_ : cls.whitespace_) = true;
  return cls;
}

void CharClass::AddRange(char32_t lo, char32_t hi) { ranges_.emplace_back(lo, hi); }

void CharClass::AddClass(const CharClass& other) {
  // Only called with the un-negated classes that escapes and literals make.
  ranges_.insert(ranges_.end(), other.ranges_.begin(), other.ranges_.end());
  categories_ |= other.categories_;
  not_categories_.insert(not_categories_.end(), other.not_categories_.begin(),
                         other.not_categories_.end());
  whitespace_ |= other.whitespace_;
  not_whitespace_ |= other.not_whitespace_;
}

bool CharClass::Contains(char32_t c) const {
  bool member = false;
  for (const auto& [lo, hi] : ranges_) {
    if (c >= lo && c <= hi) {
      member = true;
      break;
    }
  }
  if (!member && (categories_ != 0 || !not_categories_.empty())) {
    bool major_only;
    const uint32_t gc = CategoryOf(c, &major_only);
    // With only the major category known, say yes only where every subcategory would
    // (so \p{L} knows, \p{Lu} says no).
    member = major_only ? (gc & ~categories_) == 0 : (gc & categories_) != 0;
    for (uint32_t mask : not_categories_) member = member || (gc & mask) == 0;
  }
  if (!member && (whitespace_ || not_whitespace_)) {
    const bool space = u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE);
    member = (whitespace_ && space) || (not_whitespace_ && !space);
  }
  return member != negated_;
}

}  // namespace moesh
