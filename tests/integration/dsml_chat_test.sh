#!/usr/bin/env bash
# Chat with a DeepSeek-V3.2 checkpoint through the HTTP API of a real local
# cluster (`moesh serve-local`): `mkmodel --family v3.2` writes no chat
# template, as V3.2 ships none, so the router renders V3.2's own encoder. Each
# V3.2 case of tests/golden/dsml_encoding/cases.json (thinking on and off,
# tools, a tool call and its results, earlier reasoning dropped) is sent to
# /v1/chat/completions and its golden prompt to /v1/completions: the same
# prompt tokens and the same greedy text (reasoning plus content) prove the
# router rendered the golden. Then the thinking switch's errors, a tool message
# answering no call (400), tool_choice "required" (the call's opening forced).
# usage: dsml_chat_test.sh PATH/TO/moesh SOURCE_DIR
set -euo pipefail
MOESH=${1:?usage: dsml_chat_test.sh PATH/TO/moesh SOURCE_DIR}
SRC=${2:?}
PY=/usr/bin/python3
TMP=$(mktemp -d "${TEST_TMPDIR:-/tmp}/moesh_dsml.XXXXXX")
PID=
trap '[ -n "$PID" ] && { kill -INT $PID 2>/dev/null; wait $PID 2>/dev/null; }; rm -rf "$TMP"' EXIT
fail() {
  echo "FAIL: $*" >&2
  tail -5 "$TMP/log" >&2 || true
  [ -f "$TMP/cluster/router.log" ] && tail -5 "$TMP/cluster/router.log" >&2
  exit 1
}

"$MOESH" mkmodel --family v3.2 --preset tiny --out "$TMP/m" --seed 7 >/dev/null
grep -q deepseek_v32 "$TMP/m/config.json" || fail "not a V3.2 checkpoint"
if grep -q chat_template "$TMP/m/tokenizer_config.json"; then fail "mkmodel wrote a chat template"; fi
"$MOESH" serve-local --model "$TMP/m" --port 0 --http_port 0 --work_dir "$TMP/cluster" \
  >"$TMP/log" 2>&1 &
PID=$!
for _ in $(seq 900); do grep -q "HTTP API on" "$TMP/log" && break; kill -0 $PID || fail "serve-local exited"; sleep 0.1; done
URL=$(grep -o "HTTP API on http://[0-9.:]*" "$TMP/log" | awk '{print $4}')
[ -n "$URL" ] || fail "serve-local printed no HTTP URL"

"$PY" - "$URL" "$SRC/tests/golden/dsml_encoding" <<'PYEOF' || fail "V3.2 chat"
import json, sys, urllib.error, urllib.request
url, golden = sys.argv[1:3]
BOS = "<｜begin▁of▁sentence｜>"
def post(path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))
def error(body):
    try:
        post("/v1/chat/completions", body)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)["error"]
    raise AssertionError("no error for %s" % body)

sampling = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
cases = [c for c in json.load(open(golden + "/cases.json")) if c["dialect"] == "v3.2"]
assert len(cases) >= 6, cases
for c in cases:
    want = open("%s/%s.txt" % (golden, c["name"]), encoding="utf-8").read()
    assert want.startswith(BOS)
    body = dict(sampling, messages=c["messages"],
                chat_template_kwargs={"thinking": c["thinking"]})
    if "tools" in c:
        body["tools"] = c["tools"]
    chat = post("/v1/chat/completions", body)
    # The golden without its BOS: /v1/completions adds the BOS token itself.
    comp = post("/v1/completions", dict(sampling, prompt=want[len(BOS):]))
    assert chat["usage"]["prompt_tokens"] == comp["usage"]["prompt_tokens"], (c["name"], chat, comp)
    msg = chat["choices"][0]["message"]
    text = (msg.get("reasoning_content") or "") + (msg["content"] or "")
    assert text == comp["choices"][0]["text"], (c["name"], msg, comp)
    # Thinking: the prompt opened <think>, so the text is reasoning.
    if c["thinking"]:
        assert msg.get("reasoning_content") == comp["choices"][0]["text"], (c["name"], msg)
    else:
        assert "reasoning_content" not in msg, (c["name"], msg)
    print("golden %s: %d prompt tokens" % (c["name"], chat["usage"]["prompt_tokens"]))

user = [{"role": "user", "content": "Hi"}]
code, e = error({"messages": user, "chat_template_kwargs": {"thinking": "yes"}})
assert code == 400 and e["param"] == "chat_template_kwargs.thinking", e
code, e = error({"messages": user, "chat_template_kwargs": []})
assert code == 400 and e["param"] == "chat_template_kwargs", e
code, e = error({"messages": user + [{"role": "tool", "content": "42"}]})
assert code == 400 and "tool" in e["message"], e
tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
r = post("/v1/chat/completions", dict(sampling, messages=user, tools=[tool], tool_choice="required"))
assert r["choices"][0]["finish_reason"] == "length", r
# Streaming with thinking: the reasoning comes as its own deltas.
req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(dict(
    sampling, messages=user, stream=True, chat_template_kwargs={"thinking": True})).encode(),
    {"Content-Type": "application/json"})
reasoning = ""
with urllib.request.urlopen(req, timeout=120) as s:
    for line in s:
        line = line.decode().strip()
        if line.startswith("data: {"):
            reasoning += json.loads(line[6:])["choices"][0]["delta"].get("reasoning_content", "")
whole = post("/v1/chat/completions", dict(sampling, messages=user,
                                          chat_template_kwargs={"thinking": True}))
assert reasoning == whole["choices"][0]["message"]["reasoning_content"], (reasoning, whole)
print("python client: OK")
PYEOF
echo "dsml_chat_test: OK"
