#!/usr/bin/env bash
# The OpenAI-compatible HTTP API of a real local cluster (`moesh serve-local`,
# API keys on), driven by curl and by Python's standard library: completions
# (JSON and SSE, the same tokens as the gRPC API), chat through the
# checkpoint's chat template, /v1/models, /health, and the errors: a missing
# key (401, and UNAUTHENTICATED on gRPC), malformed JSON and wrong types
# (400), an unknown model (404), an oversize body (413), n over 16 (400); n
# sibling choices, echo with the prompt's log-probabilities, and sampled
# tokens' own log-probabilities (chat and completions, streamed too); a
# client that goes away mid-stream has its request cancelled (the router's
# and the decode worker's running requests and KV blocks back to zero); a
# client that stops reading its stream holds up no one else; a tool round
# trip; stop strings, max_completion_tokens, cached_tokens in the usage and a
# body that is not UTF-8, end to end; keep-alive (a chunked stream, then
# another request on the connection; an oversize body closes it; off with
# --http_keep_alive_ms 0); 503 from a router no worker has joined (/health
# and requests) and 429 from a decode pool too small for a request.
# usage: http_api_test.sh PATH/TO/moesh SOURCE_DIR
set -euo pipefail
MOESH=${1:?usage: http_api_test.sh PATH/TO/moesh SOURCE_DIR}
SRC=${2:?}
PY=/usr/bin/python3
TMP=$(mktemp -d "${TEST_TMPDIR:-/tmp}/moesh_http.XXXXXX")
PID=
trap '[ -n "$PID" ] && { kill -TERM $PID 2>/dev/null; wait $PID 2>/dev/null; }; rm -rf "$TMP"' EXIT
fail() {
  echo "FAIL: $*" >&2
  tail -5 "$TMP/log" >&2 || true
  for f in "$TMP"/cluster/router.log "$TMP"/cluster/decode-0.log; do
    [ -f "$f" ] && { echo "--- $f" >&2; tail -5 "$f" >&2; }
  done
  exit 1
}

"$MOESH" mkmodel --family v3 --preset tiny --out "$TMP/m" --seed 5 >/dev/null
[ -f "$TMP/m/tokenizer_config.json" ] || fail "mkmodel wrote no tokenizer_config.json"
printf '# keys\nsk-test-1\n\n  sk-test-2  \n' >"$TMP/keys"
"$MOESH" serve-local --model "$TMP/m" --port 0 --http_port 0 --api_keys_file "$TMP/keys" \
  --work_dir "$TMP/cluster" >"$TMP/log" 2>&1 &
PID=$!
for _ in $(seq 900); do grep -q "HTTP API on" "$TMP/log" && break; kill -0 $PID || fail "serve-local exited"; sleep 0.1; done
URL=$(grep -o "HTTP API on http://[0-9.:]*" "$TMP/log" | awk '{print $4}')
GRPC=$(grep -o "serving on [0-9.:]*" "$TMP/log" | awk '{print $3}')
[ -n "$URL" ] && [ -n "$GRPC" ] || fail "serve-local printed no HTTP URL"
ROUTER_METRICS=$(grep -o "router .*metrics http://[0-9.:]*" "$TMP/log" | grep -o "http://[0-9.:]*$")
DECODE_METRICS=$(grep -o "decode-0 .*metrics http://[0-9.:]*" "$TMP/log" | grep -o "http://[0-9.:]*$")
KEY="Authorization: Bearer sk-test-2"
JSON="Content-Type: application/json"

# status BODY_FILE curl-args...: prints the HTTP status, the body into BODY_FILE.
# A connection that fails prints 000 (and fails the caller's comparison, not `set -e`).
status() { local out=$1; shift; curl -s -o "$out" -w '%{http_code}' "$@" || true; }
# jq-like field access with Python: field FILE EXPR (EXPR over `j`).
field() { "$PY" -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"; }
expect_error() {  # expect_error WANT_STATUS WANT_TYPE_OR_CODE curl-args...
  local want=$1 what=$2; shift 2
  local got; got=$(status "$TMP/err" "$@")
  [ "$got" = "$want" ] || fail "$* -> HTTP $got, want $want: $(cat "$TMP/err")"
  field "$TMP/err" "j['error']['message'] and (j['error']['type'], j['error']['code'])" \
    | grep -q "$what" || fail "$* -> $(cat "$TMP/err"), want $what"
}

[ "$(status "$TMP/h" "$URL/health")" = 200 ] || fail "/health not 200"
expect_error 401 invalid_api_key "$URL/v1/models"
expect_error 401 invalid_api_key -H "Authorization: Bearer wrong" "$URL/v1/models"
[ "$(status "$TMP/models" -H "$KEY" "$URL/v1/models")" = 200 ] || fail "/v1/models"
[ "$(field "$TMP/models" "j['data'][0]['id']")" = m ] || fail "model id: $(cat "$TMP/models")"
# gRPC's public API wants the key too.
if out=$("$MOESH" complete --server "$GRPC" --prompt_ids 7,8,9 --max_new_tokens 2 2>&1); then
  fail "gRPC without a key succeeded"
fi
echo "$out" | grep -q "no API key" || fail "gRPC without a key: $out"
"$MOESH" complete --server "$GRPC" --api_key sk-test-1 --prompt "Hello world" --max_new_tokens 12 \
  --ignore_eos --json >"$TMP/grpc.json" || fail "moesh complete with a key"

# Completions: the gRPC API's greedy text, as JSON and as SSE.
BODY='{"model":"m","prompt":"Hello world","max_tokens":12,"temperature":0,"ignore_eos":true}'
[ "$(status "$TMP/c" -H "$KEY" -H "$JSON" -d "$BODY" "$URL/v1/completions")" = 200 ] \
  || fail "completions: $(cat "$TMP/c")"
[ "$(field "$TMP/c" "j['choices'][0]['text']")" = "$(field "$TMP/grpc.json" "j['text']")" ] \
  || fail "HTTP text $(cat "$TMP/c") != gRPC $(cat "$TMP/grpc.json")"
[ "$(field "$TMP/c" "j['object'], j['usage']['completion_tokens'], j['choices'][0]['finish_reason']")" \
  = "text_completion 12 length" ] || fail "completion body: $(cat "$TMP/c")"
SSE='{"prompt":"Hello world","max_tokens":12,"temperature":0,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}'
curl -sN -H "$KEY" -H "$JSON" -d "$SSE" "$URL/v1/completions" >"$TMP/sse"
"$PY" - "$TMP/sse" "$TMP/c" <<'PYEOF' || fail "SSE stream: $(head -c 600 "$TMP/sse")"
import json, sys
raw = open(sys.argv[1]).read()
events = [e for e in raw.split("\n\n") if e]
assert all(e.startswith("data: ") for e in events), events
assert events[-1] == "data: [DONE]", events[-1]
chunks = [json.loads(e[6:]) for e in events[:-1]]
text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
want = json.load(open(sys.argv[2]))["choices"][0]["text"]
assert text == want, (text, want)
assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12, chunks[-1]
assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
PYEOF

# n siblings, echo + prompt log-probabilities, sampled tokens' own.
"$PY" - "$URL" <<'PYEOF' || fail "n / echo / logprobs"
import json, sys, urllib.request
url = sys.argv[1]
H = {"Authorization": "Bearer sk-test-1", "Content-Type": "application/json"}
def post(path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), H)
    return urllib.request.urlopen(req, timeout=60)
one = json.load(post("/v1/completions", {"prompt": "Hello world", "max_tokens": 1}))
body = {"prompt": "Hello world", "max_tokens": 6, "temperature": 1.0, "seed": 9, "n": 3,
        "ignore_eos": True, "logprobs": 0}
a = json.load(post("/v1/completions", body))
assert [c["index"] for c in a["choices"]] == [0, 1, 2], a
toks = [tuple(c["logprobs"]["tokens"]) for c in a["choices"]]
assert len(set(toks)) == 3, toks  # distinct seeds
for c in a["choices"]:
    lps = c["logprobs"]["token_logprobs"]
    assert len(lps) == 6 and all(isinstance(x, float) and x <= 0 for x in lps), c
assert a["usage"]["completion_tokens"] == 18, a["usage"]
assert a["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"], (a["usage"], one["usage"])
b = json.load(post("/v1/completions", body))
assert [c["logprobs"] for c in b["choices"]] == [c["logprobs"] for c in a["choices"]]  # reproducible
e = json.load(post("/v1/completions", {"prompt": "Hello world", "max_tokens": 3, "echo": True,
                                       "logprobs": 1, "temperature": 0}))
c = e["choices"][0]
assert c["text"].startswith("Hello world"), c
lp = c["logprobs"]
n_prompt = e["usage"]["prompt_tokens"]
assert len(lp["tokens"]) == n_prompt + 3, (lp, e["usage"])
assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None, lp
assert all(x <= 0 for x in lp["token_logprobs"][1:]), lp
assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"]), lp
# greedy: each output token's own is its best alternative's
for t, x, top in zip(lp["tokens"][n_prompt:], lp["token_logprobs"][n_prompt:], lp["top_logprobs"][n_prompt:]):
    assert abs(max(top.values()) - x) < 1e-6, (t, x, top)
msgs = [{"role": "user", "content": "Hi"}]
r = json.load(post("/v1/chat/completions", {"messages": msgs, "max_tokens": 5, "temperature": 1.0,
                                           "seed": 3, "logprobs": True}))
content = r["choices"][0]["logprobs"]["content"]
assert len(content) == r["usage"]["completion_tokens"], r
assert all(isinstance(x["logprob"], float) and x["logprob"] <= 0 and x["top_logprobs"] == []
           for x in content), content
indexes, finishes, done = set(), 0, 0
with post("/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "n": 2, "stream": True,
                                   "logprobs": True, "ignore_eos": True}) as s:
    for line in s:
        line = line.decode().strip()
        if not line:
            continue
        if line == "data: [DONE]":
            done += 1
            continue
        ch = json.loads(line[6:])["choices"][0]
        indexes.add(ch["index"])
        finishes += ch["finish_reason"] is not None
        if ch.get("logprobs"):
            assert all(x["logprob"] <= 0 for x in ch["logprobs"]["content"]), ch
assert indexes == {0, 1} and finishes == 2 and done == 1, (indexes, finishes, done)
PYEOF

# Errors, each in OpenAI's shape.
expect_error 400 invalid_request_error -H "$KEY" -H "$JSON" -d '{"prompt": "x",' "$URL/v1/completions"
expect_error 400 invalid_request_error -H "$KEY" -H "$JSON" -d '{"prompt":"x","temperature":"hot"}' "$URL/v1/completions"
expect_error 400 invalid_request_error -H "$KEY" -H "$JSON" -d '{"prompt":"x","n":17}' "$URL/v1/completions"
expect_error 400 invalid_request_error -H "$KEY" -H "$JSON" -d '{"messages":[]}' "$URL/v1/chat/completions"
expect_error 400 invalid_request_error -H "$KEY" -H "$JSON" -d '{"prompt":[1,100000]}' "$URL/v1/completions"
expect_error 404 model_not_found -H "$KEY" -H "$JSON" -d '{"model":"gpt-4","prompt":"x"}' "$URL/v1/completions"
head -c $((9 << 20)) /dev/zero | tr '\0' 'a' >"$TMP/big"
expect_error 413 request_too_large -H "$KEY" -H "$JSON" --data-binary @"$TMP/big" "$URL/v1/completions"
expect_error 401 invalid_api_key -H "$JSON" -d '{"prompt":"x"}' "$URL/v1/completions"
# Past the router's --max_new_tokens_limit (4096): 400 naming the field as the request did.
expect_error 400 invalid_request_error -H "$KEY" -H "$JSON" -d '{"prompt":"x","max_tokens":5000}' \
  "$URL/v1/completions"
[ "$(field "$TMP/err" "j['error']['param']")" = max_tokens ] || fail "max_tokens param: $(cat "$TMP/err")"
expect_error 400 invalid_request_error -H "$KEY" -H "$JSON" \
  -d '{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":5000}' "$URL/v1/chat/completions"
[ "$(field "$TMP/err" "j['error']['param']")" = max_completion_tokens ] \
  || fail "max_completion_tokens param: $(cat "$TMP/err")"
# Tools: malformed definitions and choices name their field (the tiny model's
# template is DeepSeek-V3's, tool branches included: calls work, below).
TOOL='{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}'
MSGS='"messages":[{"role":"user","content":"Hi"}]'
for bad in '"tools":[{"type":"function"}]|tools[0].function' \
    '"tools":[{"type":"function","function":{"name":"a b"}}]|tools[0].function.name' \
    "\"tools\":[$TOOL],\"tool_choice\":\"maybe\"|tool_choice" \
    "\"tools\":[$TOOL],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}|tool_choice.function.name"; do
  expect_error 400 invalid_request_error -H "$KEY" -H "$JSON" -d "{$MSGS,${bad%|*}}" "$URL/v1/chat/completions"
  [ "$(field "$TMP/err" "j['error']['param']")" = "${bad#*|}" ] || fail "param of ${bad%|*}: $(cat "$TMP/err")"
done
[ "$(status "$TMP/none" -H "$KEY" -H "$JSON" -d "{$MSGS,\"tools\":[$TOOL],\"tool_choice\":\"none\",\"max_tokens\":3,\"ignore_eos\":true}" \
  "$URL/v1/chat/completions")" = 200 ] || fail "tool_choice none: $(cat "$TMP/none")"
[ "$(field "$TMP/none" "'tool_calls' in j['choices'][0]['message'] or j['choices'][0]['finish_reason']")" = length ] \
  || fail "tool_choice none: $(cat "$TMP/none")"

# Python's standard library: chat through the template, streamed and not;
# a client that disconnects mid-stream.
"$PY" - "$URL" "$ROUTER_METRICS" "$DECODE_METRICS" <<'PYEOF' || fail "python client"
import json, socket, sys, time, urllib.error, urllib.request
url, router_metrics, decode_metrics = sys.argv[1:4]
H = {"Authorization": "Bearer sk-test-1", "Content-Type": "application/json"}
def post(path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), H)
    return urllib.request.urlopen(req, timeout=60)
msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
r = json.load(post("/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "temperature": 0,
                                           "logprobs": True, "top_logprobs": 2}))
assert r["object"] == "chat.completion", r
msg = r["choices"][0]["message"]
assert msg["role"] == "assistant" and isinstance(msg["content"], str), r
# The rendered template: BOS, the system prompt, <｜User｜>Hi there<｜Assistant｜>.
assert r["usage"]["prompt_tokens"] >= 5, r["usage"]
lp = r["choices"][0]["logprobs"]["content"]
assert len(lp) == r["usage"]["completion_tokens"] and len(lp[0]["top_logprobs"]) == 2, lp
assert lp[0]["logprob"] == lp[0]["top_logprobs"][0]["logprob"], lp[0]  # greedy: the best one
deltas, roles = [], []
with post("/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "temperature": 0,
                                   "stream": True}) as s:
    assert s.headers["Content-Type"].startswith("text/event-stream")
    for line in s:
        line = line.decode().strip()
        if not line:
            continue
        assert line.startswith("data: "), line
        if line == "data: [DONE]":
            break
        d = json.loads(line[6:])["choices"][0]["delta"]
        roles += [d["role"]] if "role" in d else []
        deltas.append(d.get("content", ""))
assert roles == ["assistant"] and "".join(deltas) == msg["content"], (deltas, msg)
# A tool round trip: a named tool_choice opens the call (the model writes its arguments),
# then the call and its result go back as history and the model answers.
tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
ask = [{"role": "user", "content": "Weather in Paris?"}]
r = json.load(post("/v1/chat/completions", {"messages": ask, "tools": tools, "max_tokens": 6,
                                           "ignore_eos": True, "temperature": 0,
                                           "tool_choice": {"type": "function",
                                                           "function": {"name": "get_weather"}}}))
call = r["choices"][0]["message"]
assert call["tool_calls"][0]["function"]["name"] == "get_weather", r
assert call["tool_calls"][0]["id"] and call["content"] is None, r
back = ask + [call, {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": "21 C"}]
r = json.load(post("/v1/chat/completions", {"messages": back, "tools": tools, "max_tokens": 4,
                                           "ignore_eos": True, "temperature": 0}))
assert r["choices"][0]["message"]["role"] == "assistant" and r["usage"]["completion_tokens"] == 4, r
try:
    post("/v1/chat/completions", {"messages": [{"role": "tool", "content": None}]})
    raise AssertionError("a tool message without content was rendered")
except urllib.error.HTTPError as e:
    assert e.code == 400 and "tool" in json.load(e)["error"]["message"]

# Fields end to end: a stop string ends the text before it (finish_reason "stop");
# max_completion_tokens is chat's max_tokens; a prompt sent twice finds its blocks in the
# prefix cache (usage.prompt_tokens_details.cached_tokens); a body that is not UTF-8 is a 400.
free = json.load(post("/v1/completions", {"prompt": "Hello", "max_tokens": 12, "temperature": 0,
                                         "ignore_eos": True}))["choices"][0]["text"]
if len(free) > 2:
    cut = free[1:3]
    r = json.load(post("/v1/completions", {"prompt": "Hello", "max_tokens": 12, "temperature": 0,
                                          "ignore_eos": True, "stop": [cut]}))
    assert r["choices"][0]["finish_reason"] == "stop" and r["choices"][0]["text"] == free[:free.index(cut)], (free, r)
r = json.load(post("/v1/chat/completions", {"messages": msgs, "max_completion_tokens": 3,
                                           "ignore_eos": True}))
assert r["usage"]["completion_tokens"] == 3, r["usage"]
long_prompt = "The quick brown fox jumps over the lazy dog. " * 20
for _ in range(2):
    r = json.load(post("/v1/completions", {"prompt": long_prompt, "max_tokens": 1}))
assert r["usage"]["prompt_tokens_details"]["cached_tokens"] >= 64, r["usage"]
try:
    urllib.request.urlopen(urllib.request.Request(url + "/v1/completions",
                                                  b'{"prompt": "\xff\xfe", "max_tokens": 1}', H), timeout=30)
    raise AssertionError("a body that is not UTF-8 was taken")
except urllib.error.HTTPError as e:
    assert e.code == 400 and json.load(e)["error"]["type"] == "invalid_request_error"

def metric(address, name, label=""):
    text = urllib.request.urlopen(address + "/metrics", timeout=10).read().decode()
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name) and label in l)
# A long stream whose client goes away after a few chunks.
host, port = url[len("http://"):].split(":")
body = json.dumps({"prompt": "Hello", "max_tokens": 2400, "ignore_eos": True, "stream": True})
sock = socket.create_connection((host, int(port)))
sock.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test-1\r\n"
              "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
got = b""
while got.count(b"data: ") < 4:
    got += sock.recv(4096)
assert metric(router_metrics, "moesh_num_requests_running") == 1
sock.close()
deadline = time.time() + 10
while time.time() < deadline:
    # ended as CANCELLED, nothing running, no KV held
    if (metric(router_metrics, "moesh_request_failure_total", 'code="1"') >= 1 and
            metric(router_metrics, "moesh_num_requests_running") == 0 and
            metric(decode_metrics, "moesh_num_requests_running") == 0 and
            metric(decode_metrics, "moesh_kv_cache_usage_perc") == 0):
        break
    time.sleep(0.05)
else:
    raise AssertionError("the abandoned stream still runs: " + str([
        metric(router_metrics, "moesh_request_failure_total", 'code="1"'),
        metric(router_metrics, "moesh_num_requests_running"),
        metric(decode_metrics, "moesh_num_requests_running"), metric(decode_metrics, "moesh_kv_cache_usage_perc"),
        metric(router_metrics, "moesh_generation_tokens_total")]))
tokens = metric(router_metrics, "moesh_generation_tokens_total")
assert tokens < 12 + 8 + 8 + 12 + 2400 - 200, tokens  # it stopped well before its 2400

# A slow reader: a stream whose client reads nothing (a 4 KB receive buffer, soon full)
# does not hold up the others: three requests of 16 tokens each finish while it is stuck,
# in the time they take alone (well within 20 s).
slow = socket.socket()
slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
slow.connect((host, int(port)))
body = json.dumps({"prompt": "Hello", "max_tokens": 1500, "ignore_eos": True, "stream": True,
                   "logprobs": 5})
slow.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test-1\r\n"
              "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
time.sleep(1.0)  # its stream is running and its socket filling
for i in range(3):
    t0 = time.time()
    r = json.load(post("/v1/completions", {"prompt": "Hi %d" % i, "max_tokens": 16,
                                           "ignore_eos": True, "temperature": 0}))
    took = time.time() - t0
    assert r["usage"]["completion_tokens"] == 16 and took < 20, (r["usage"], took)
assert metric(router_metrics, "moesh_num_requests_running") >= 1  # the slow one still runs
slow.close()
deadline = time.time() + 15
while time.time() < deadline and metric(router_metrics, "moesh_num_requests_running") > 0:
    time.sleep(0.05)
assert metric(router_metrics, "moesh_num_requests_running") == 0, "the slow reader's stream still runs"
# Keep-alive: a stream (chunked transfer encoding, ended by its zero chunk) and then a JSON
# request on the same connection; a body past the limit ends its connection with the 413.
import http.client
host, port = url.split("//")[1].split(":")
c = http.client.HTTPConnection(host, int(port), timeout=60)
c.request("POST", "/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 3, "stream": True}), H)
r1 = c.getresponse()
assert r1.getheader("Transfer-Encoding") == "chunked", r1.getheaders()
assert r1.read().decode().rstrip().endswith("data: [DONE]")
sock = c.sock
c.request("POST", "/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 2}), H)
r2 = c.getresponse()
assert r2.status == 200 and json.load(r2)["usage"]["completion_tokens"] == 2
assert c.sock is sock and sock is not None, "the second request did not reuse the connection"
def answer_until_close(head):
    """What the server sends back to `head` (and a body's first byte) until it closes (10 s)."""
    s = socket.create_connection((host, int(port)))
    s.sendall(head + b"{")
    s.settimeout(10)
    got = b""
    while True:
        d = s.recv(65536)
        if not d:
            return got
        got += d
got = answer_until_close(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                         b"sk-test-1\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n")
assert got.startswith(b"HTTP/1.1 413") and b"Connection: close" in got, got[:200]
# An answer before the body was read (401 without a key): the connection ends with it, at once,
# whatever the body announced (no thread waits for gigabytes); HEAD gets a head only.
got = answer_until_close(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n")
assert got.startswith(b"HTTP/1.1 401") and b"Connection: close" in got, got[:200]
c = http.client.HTTPConnection(host, int(port), timeout=60)
c.request("HEAD", "/health")
r = c.getresponse()
assert r.status == 200 and r.read() == b"", r.status
c.request("GET", "/health")
r = c.getresponse()
assert r.status == 200 and r.read() == b"{}", "the connection after HEAD"
print("python client: OK")
PYEOF

# stop: SIGTERM to $PID and its exit within 60 s (a drain that never ends fails the test).
stop() {
  kill -TERM $PID
  for _ in $(seq 600); do kill -0 $PID 2>/dev/null || { wait $PID || true; PID=; return; }; sleep 0.1; done
  fail "pid $PID still runs 60 s after SIGTERM"
}
# 503 and 429 from real processes. A router no worker has joined: /health and every
# request are 503 (OpenAI's error shape; a stream is refused before it starts, as JSON).
stop
: >"$TMP/log"  # truncated here, not by the child: the wait below must not read the last log
"$(dirname "$MOESH")/moesh_router" --model "$TMP/m" --listen 127.0.0.1:0 --internal_listen 127.0.0.1:0 \
  --http_listen 127.0.0.1:0 --http_keep_alive_ms 0 >"$TMP/log" 2>&1 &
PID=$!
for _ in $(seq 300); do grep -q "HTTP API on" "$TMP/log" && break; kill -0 $PID || fail "the router exited"; sleep 0.1; done
URL=$(grep -o "HTTP API on http://[0-9.:]*" "$TMP/log" | awk '{print $4}')
expect_error 503 service_unavailable "$URL/health"
# --http_keep_alive_ms 0: every response says it closes its connection.
curl -s -D "$TMP/head" -o /dev/null "$URL/health" || true
grep -qi "^Connection: close" "$TMP/head" || fail "keep-alive off, yet no 'Connection: close': $(cat "$TMP/head")"
expect_error 503 service_unavailable "$URL/v1/completions" -H "$JSON" -d '{"prompt": "Hi", "max_tokens": 4}'
expect_error 503 service_unavailable "$URL/v1/chat/completions" -H "$JSON" \
  -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": true}'
stop
# A cluster whose decode pool holds 2 blocks of 64 tokens: a request that may need 16 is 429
# (RESOURCE_EXHAUSTED: no pool holds it), one that fits is served.
: >"$TMP/log"
"$MOESH" serve-local --model "$TMP/m" --port 0 --http_port 0 --kv_blocks 2 \
  --work_dir "$TMP/small" >"$TMP/log" 2>&1 &
PID=$!
for _ in $(seq 900); do grep -q "HTTP API on" "$TMP/log" && break; kill -0 $PID || fail "serve-local exited"; sleep 0.1; done
URL=$(grep -o "HTTP API on http://[0-9.:]*" "$TMP/log" | awk '{print $4}')
expect_error 429 rate_limit "$URL/v1/completions" -H "$JSON" -d '{"prompt": "Hi", "max_tokens": 1000}'
[ "$(status "$TMP/ok" "$URL/v1/completions" -H "$JSON" -d '{"prompt": "Hi", "max_tokens": 8}')" = 200 ] \
  || fail "a request that fits the small pool: $(cat "$TMP/ok")"
echo "http_api_test: OK"
