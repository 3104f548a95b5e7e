// A Jinja template engine for chat templates: the subset of jinja2 that the
// chat templates shipped in checkpoints use (jinja_parse.h lists the syntax,
// jinja_builtins.h the filters, tests and functions), rendering what jinja2
// renders in the environment transformers' apply_chat_template makes
// (trim_blocks, lstrip_blocks, loop controls, an immutable sandbox: a
// template may not change a list or dict; namespace() is its one mutable
// object).
//
// A template comes from a checkpoint, so it is input too: rendering is
// bounded in steps, output size and call depth, and every failure is a
// Status (INVALID_ARGUMENT with the template's line; RESOURCE_EXHAUSTED past
// a bound), never a crash.
//
//   ASSIGN_OR_RETURN(auto t, jinja::Template::Parse(source));
//   ASSIGN_OR_RETURN(std::string text, t->Render({{"messages", msgs}}));
//
// Parse once, render from any number of threads: a Template is immutable.
#ifndef MOESH_COMMON_TOKENIZER_JINJA_H_
#define MOESH_COMMON_TOKENIZER_JINJA_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/jinja_parse.h"
#include "common/tokenizer/jinja_value.h"

namespace moesh {
namespace jinja {

struct RenderLimits {
  // Statements and expressions evaluated, and items a loop takes (a chat of
  // a thousand messages takes some 10^5).
  int64_t max_steps = 2'000'000;
  size_t max_output_bytes = 64 << 20;  // the rendered text
  int max_call_depth = 64;             // nested macro calls
};

class Template {
 public:
  static absl::StatusOr<std::unique_ptr<Template>> Parse(absl::string_view source,
                                                         const ParseOptions& options = {});

  // The text, with `context` as the template's variables (beside range,
  // namespace and dict).
  absl::StatusOr<std::string> Render(const ValueDict& context,
                                     const RenderLimits& limits = {}) const;

 private:
  explicit Template(Body body) : body_(std::move(body)) {}
  const Body body_;
};

}  // namespace jinja
}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_JINJA_H_
