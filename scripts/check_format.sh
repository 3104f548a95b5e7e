#!/usr/bin/env bash
# Fails if a C++/CUDA source is not clang-formatted (.clang-format: Google,
# 100 columns) or is longer than 800 lines once formatted (split it: one idea
# per file, docs/STYLE.md). Fix with:
#   git ls-files '*.h' '*.cc' '*.cu' '*.cuh' ':!third_party' | xargs clang-format -i
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.h' '*.cc' '*.cu' '*.cuh' |
  grep -v '^third_party/' | while read -r f; do [ -f "$f" ] && echo "$f"; done)
status=0
if ! "$CLANG_FORMAT" --dry-run -Werror "${files[@]}" 2>/tmp/check_format.$$; then
  grep -E '^[^ ].*: error:' /tmp/check_format.$$ | sed -E 's/:[0-9]+:[0-9]+: error:.*//' | sort | uniq -c |
    awk '{ printf "not formatted: %s (%d places)\n", $2, $1 }'
  status=1
fi
rm -f /tmp/check_format.$$
for f in "${files[@]}"; do
  n=$(wc -l <"$f")
  if [ "$n" -gt 800 ]; then
    echo "too long: $f has $n lines (at most 800)"
    status=1
  fi
done
[ "$status" = 0 ] && echo "check_format: ${#files[@]} files formatted, none over 800 lines"
exit "$status"
