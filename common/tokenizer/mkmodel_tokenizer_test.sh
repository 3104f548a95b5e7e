#!/usr/bin/env bash
# `moesh mkmodel` writes the embedded tokenizer.json of its preset into the model dir.
# Usage: mkmodel_tokenizer_test.sh MOESH_BINARY REPO_DIR
set -euo pipefail
moesh="$1"
golden="$2/tests/golden/tokenizer"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for preset in tiny small; do
  "$moesh" mkmodel --family v3 --preset "$preset" --out "$tmp/$preset" >/dev/null
  cmp "$tmp/$preset/tokenizer.json" "$golden/$preset/tokenizer.json"
done
# The binary reads nothing from the source tree: a copy elsewhere does the same.
cp "$moesh" "$tmp/moesh-copy"
(cd / && "$tmp/moesh-copy" mkmodel --family v2-lite --out "$tmp/copy" >/dev/null)
cmp "$tmp/copy/tokenizer.json" "$golden/tiny/tokenizer.json"
echo "mkmodel_tokenizer_test: OK"
