#!/usr/bin/python3
"""The observability stack for real: a `moesh serve-local` cluster on a fresh
tiny model, a real Prometheus server (Debian's `prometheus`) scraping every
service through deploy/prometheus/prometheus-local.yml with the rules in
deploy/prometheus/rules, traffic from `moesh complete`, then Prometheus's HTTP
API must agree with what the client saw:

  * TTFT histogram: count = requests answered, sum = the TTFTs the client got
    back, every bucket = the client's TTFTs at or below its bound, and
    histogram_quantile = the same interpolation over the client's TTFTs (and
    inside the bucket that holds the client's own quantile);
  * moesh_generation_tokens_total{service="router"} = tokens the client got;
    {service="decode_worker"} = those less the first token of each request
    (prefill makes it);
  * moesh_expert_tokens_total summed = sum over requests of
    (prompt tokens + generated tokens - 1) x top_k x MoE layers — every
    token that went through a forward pass (the last generated token never
    does), once per MoE layer, top_k times; per layer, every MoE layer gets
    an equal share and every (layer, expert) has exactly one series;
  * prompt tokens, finish reasons, failures, ITL/e2e counts, KV-transfer bytes,
    round trips per forward pass, gauges back at rest.

It also keeps docs/METRICS.md in sync with a real scrape (every family, type,
label set and exporting service), evaluates every query of the Grafana
dashboard deploy/grafana/moesh.json and every recording rule against the live
server (each must return data), and runs promtool on the configs and rules.

usage: prometheus_test.py PATH/TO/moesh SOURCE_DIR
env:   PROMETHEUS, PROMTOOL (default: from PATH, /usr/bin)
"""
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import deploy_lib  # noqa: E402
from deploy_lib import Checks, Prometheus, fatal  # noqa: E402

# (prompt ids, max_new_tokens): lengths 1 to 64, max_new_tokens 2 to 32.
# (max_new_tokens 1 is left out: such a request crashes the decode worker
# today; see the report of issue 6.)
SEQUENTIAL = [
    ([5, 17, 300], 16),
    ([7], 2),
    (list(range(2, 22)), 8),
    ([100, 200, 300, 400, 11], 32),
    (list(range(30, 94)), 4),
]
CONCURRENT = [([3 + i, 5 + 2 * i, 300 - i], 6 + i) for i in range(8)]
BAD = ([1, 100000], 4)  # a token id outside the vocabulary: INVALID_ARGUMENT (gRPC code 3)


def find_tool(env, name):
    path = os.environ.get(env) or shutil.which(name) or f"/usr/bin/{name}"
    if not os.access(path, os.X_OK):
        fatal(f"{name} not found: install Debian's package with scripts/install_deps.sh "
              f"(apt-get install --no-install-recommends prometheus)")
    return path


class Processes:
    """The processes this test starts, each in its own process group, stopped at exit."""

    def __init__(self):
        self.procs = []

    def start(self, argv, log_path, **kw):
        log = open(log_path, "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **kw)
        self.procs.append((p, argv[0]))
        return p

    def stop_all(self):
        for p, _ in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGINT)  # serve-local stops its cluster on SIGINT
        for p, _ in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def moe_layers(cfg):
    """Indices of the MoE layers, as DeepSeek's modeling code picks them."""
    freq = cfg.get("moe_layer_freq", 1) or 1
    return [i for i in range(cfg["num_hidden_layers"])
            if cfg.get("n_routed_experts") and i >= cfg.get("first_k_dense_replace", 0) and i % freq == 0]


def bucket_quantile(q, buckets):
    """Prometheus's histogram_quantile over [(upper bound, cumulative count)], +Inf last."""
    buckets = sorted(buckets)
    if len(buckets) < 2 or not math.isinf(buckets[-1][0]) or buckets[-1][1] == 0:
        return float("nan")
    rank = q * buckets[-1][1]
    b = next(i for i, (_, c) in enumerate(buckets) if c >= rank)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    start, end, count = 0.0, buckets[b][0], buckets[b][1]
    if b > 0:
        start = buckets[b - 1][0]
        count -= buckets[b - 1][1]
        rank -= buckets[b - 1][1]
    return start + (end - start) * (rank / count)


def complete(moesh, server, prompt, max_new):
    argv = [moesh, "complete", "--server", server, "--prompt_ids", ",".join(map(str, prompt)),
            "--max_new_tokens", str(max_new), "--json", "--timeout", "30"]
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        return {"ok": False, "error": r.stderr.strip() or r.stdout.strip(), "prompt": prompt}
    j = json.loads(r.stdout)
    return {"ok": True, "prompt": prompt, "max_new": max_new, "ids": j["output_ids"], "usage": j["usage"],
            "finish_reason": j["finish_reason"], "ttft": j["time_to_first_token_seconds"], "wall": wall}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-2])
    moesh, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    started = time.monotonic()
    try:
        prometheus_bin = find_tool("PROMETHEUS", "prometheus")
        promtool = find_tool("PROMTOOL", "promtool")
    except deploy_lib.Fatal as e:
        print(f"FAIL  {e}")
        print("prometheus_test: 0 passed, 1 failed")
        return 1
    sys.path.insert(0, os.path.join(src, "deploy", "prometheus"))
    import local_targets  # noqa: E402

    tmp = tempfile.mkdtemp(prefix="moesh_prom.", dir=os.environ.get("TEST_TMPDIR") or None)
    procs = Processes()
    c = Checks("prometheus_test")
    try:
        run(c, moesh, src, tmp, procs, prometheus_bin, promtool, local_targets, started)
    except deploy_lib.Fatal as e:
        c.check("the test ran to its end", False, str(e))
    finally:
        procs.stop_all()
        if not c.failed:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"logs kept in {tmp}")
    print(f"took {time.monotonic() - started:.1f} s")
    return c.summary()


def wait_for(what, fn, timeout, interval=0.1):
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        v = fn()
        if v:
            return v
        time.sleep(interval)
    fatal(f"timed out ({timeout} s) waiting for {what}")


def run(c, moesh, src, tmp, procs, prometheus_bin, promtool, local_targets, started):
    # --- the cluster -----------------------------------------------------------
    model = os.path.join(tmp, "model")
    subprocess.run([moesh, "mkmodel", "--family", "v3", "--preset", "tiny", "--out", model], check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    serve_log = os.path.join(tmp, "serve-local.log")
    serve = procs.start([moesh, "serve-local", "--model", model, "--port", "0", "--work_dir",
                         os.path.join(tmp, "cluster")], serve_log)

    def serving():
        if serve.poll() is not None:
            fatal(f"serve-local exited ({serve.returncode}):\n{open(serve_log).read()}")
        text = open(serve_log).read()
        return "serving on" in text and text
    text = wait_for("serve-local", serving, 30)
    server = text.split("serving on ")[1].split()[0]
    processes = local_targets.parse(text)
    c.equal("serve-local printed a metrics address for the router, 2 expert, 1 decode and 1 prefill workers",
            sorted(p.split("-")[0] for p, _, _ in processes), ["decode", "expert", "expert", "prefill", "router"])

    # --- Prometheus, configured from deploy/prometheus ---------------------------
    prom_dir = os.path.join(tmp, "prometheus")
    os.makedirs(os.path.join(prom_dir, "targets"))
    shutil.copytree(os.path.join(src, "deploy", "prometheus", "rules"), os.path.join(prom_dir, "rules"))
    with open(os.path.join(src, "deploy", "prometheus", "prometheus-local.yml")) as f:
        config = f.read()
    for key in ("scrape_interval", "evaluation_interval", "refresh_interval"):
        c.check(f"prometheus-local.yml sets {key} (the test shortens it to 1s)", f"{key}: 5s" in config)
        config = config.replace(f"{key}: 5s", f"{key}: 1s")
    config_path = os.path.join(prom_dir, "prometheus-local.yml")
    with open(config_path, "w") as f:
        f.write(config)
    with open(os.path.join(prom_dir, "targets", "moesh.json"), "w") as f:
        json.dump(local_targets.file_sd(processes), f)

    r = subprocess.run([promtool, "check", "config", config_path], capture_output=True, text=True)
    c.check("promtool check config prometheus-local.yml (with its rules)", r.returncode == 0, r.stdout + r.stderr)
    rules = sorted(os.path.join(src, "deploy", "prometheus", "rules", f)
                   for f in os.listdir(os.path.join(src, "deploy", "prometheus", "rules")))
    r = subprocess.run([promtool, "check", "rules", *rules], capture_output=True, text=True)
    c.check("promtool check rules deploy/prometheus/rules", r.returncode == 0, r.stdout + r.stderr)
    r = subprocess.run([promtool, "test", "rules", "moesh_rules_test.yml"], capture_output=True, text=True, cwd=HERE)
    c.check("promtool test rules tests/deploy/moesh_rules_test.yml", r.returncode == 0, r.stdout + r.stderr)

    prom_address = f"127.0.0.1:{deploy_lib.free_port()}"
    prom = procs.start([prometheus_bin, f"--config.file={config_path}",
                        f"--storage.tsdb.path={os.path.join(prom_dir, 'data')}",
                        f"--web.listen-address={prom_address}", "--log.level=warn"],
                       os.path.join(tmp, "prometheus.log"))
    api = Prometheus(prom_address)

    def prom_ready():
        if prom.poll() is not None:
            fatal(f"prometheus exited ({prom.returncode}):\n{open(os.path.join(tmp, 'prometheus.log')).read()}")
        try:
            return deploy_lib.http_get(f"http://{prom_address}/-/ready", timeout=1) is not None
        except OSError:
            return False
    wait_for("prometheus /-/ready", prom_ready, 30)

    def all_up():
        ups = api.by_label("up", "process")
        return len(ups) == len(processes) and all(v == 1 for v in ups.values()) and ups
    ups = wait_for("every target scraped and up", all_up, 20)
    c.equal("Prometheus scrapes every process (up == 1)", sorted(ups), sorted(p for p, _, _ in processes))

    # --- traffic ---------------------------------------------------------------
    results = [complete(moesh, server, p, n) for p, n in SEQUENTIAL]
    with ThreadPoolExecutor(len(CONCURRENT)) as pool:
        results += list(pool.map(lambda pn: complete(moesh, server, *pn), CONCURRENT))
    bad = complete(moesh, server, *BAD)
    t_end = time.time()
    failed = [r for r in results if not r["ok"]]
    if failed:
        fatal(f"requests failed: {failed}")
    c.check("the out-of-vocabulary request fails", not bad["ok"] and "vocabulary" in bad["error"], str(bad))
    n = len(results)
    for r in results:
        if len(r["ids"]) != r["usage"]["completion_tokens"] or r["usage"]["prompt_tokens"] != len(r["prompt"]):
            fatal(f"client output inconsistent with its usage: {r}")

    # Every scrape that starts after the last response sees final values.
    wait_for("a scrape of every target after the traffic",
             lambda: (api.scalar("min(timestamp(up))") or 0) > t_end + 0.05, 15)

    # --- what the client saw, against Prometheus ---------------------------------
    top_k = cfg["num_experts_per_tok"]
    layers = moe_layers(cfg)
    prompt_tokens = sum(len(r["prompt"]) for r in results)
    gen_tokens = sum(len(r["ids"]) for r in results)
    forward_tokens = sum(len(r["prompt"]) + len(r["ids"]) - 1 for r in results)
    ttfts = sorted(r["ttft"] for r in results)
    print(f"sent {n} requests (+1 bad): {prompt_tokens} prompt tokens, {gen_tokens} generated, "
          f"{forward_tokens} through the model; top_k {top_k}, MoE layers {layers}")

    ttft = "moesh_time_to_first_token_seconds"
    c.equal("TTFT histogram count == requests answered", api.scalar(f"sum({ttft}_count)"), float(n))
    c.close("TTFT histogram sum == sum of the TTFTs the client got back", api.scalar(f"sum({ttft}_sum)"),
            sum(ttfts), rel=1e-6)
    buckets = {float(le): v for le, v in api.by_label(f"sum by (le) ({ttft}_bucket)", "le").items()}
    c.check("TTFT histogram has buckets, +Inf last", len(buckets) > 2 and math.inf in buckets, str(buckets))
    c.equal("every TTFT bucket == client TTFTs at or below its bound",
            {le: v for le, v in buckets.items()}, {le: float(sum(t <= le for t in ttfts)) for le in buckets})
    c.check("every client TTFT is below its request's wall time", all(r["ttft"] <= r["wall"] for r in results))
    for q in (0.5, 0.9, 0.99):
        got = api.scalar(f"histogram_quantile({q}, sum by (le) ({ttft}_bucket))")
        want = bucket_quantile(q, list(buckets.items()))
        c.close(f"histogram_quantile({q}) TTFT == the interpolation over the client's TTFTs", got, want)
        kth = ttfts[max(0, math.ceil(q * n) - 1)]
        bounds = sorted(buckets)
        hi = next(b for b in bounds if kth <= b)
        lo = max([0.0] + [b for b in bounds if b < hi])
        c.check(f"histogram_quantile({q}) TTFT = {got:.6f} s lies in the bucket ({lo}, {hi}] of the client's "
                f"own {q} quantile {kth:.6f} s", got is not None and lo <= got <= hi)
    got = api.scalar(f"histogram_quantile(0.99, sum by (le) (rate({ttft}_bucket[1m])))")
    c.check("the dashboard form histogram_quantile(0.99, rate(...[1m])) gives a finite TTFT within the buckets",
            got is not None and 0 <= got <= max(b for b in buckets if not math.isinf(b)), str(got))

    c.equal("moesh_generation_tokens_total{service=router} == tokens the client got",
            api.scalar('sum(moesh_generation_tokens_total{service="router"})'), float(gen_tokens))
    c.equal("moesh_generation_tokens_total{service=decode_worker} == tokens less each request's first",
            api.scalar('sum(moesh_generation_tokens_total{service="decode_worker"})'), float(gen_tokens - n))
    c.equal("moesh_prompt_tokens_total{service=router} == prompt tokens sent",
            api.scalar('sum(moesh_prompt_tokens_total{service="router"})'), float(prompt_tokens))
    c.equal("moesh_prompt_tokens_total{service=prefill_worker} == prompt tokens sent",
            api.scalar('sum(moesh_prompt_tokens_total{service="prefill_worker"})'), float(prompt_tokens))
    reasons = {}
    for r in results:
        reasons[r["finish_reason"]] = reasons.get(r["finish_reason"], 0) + 1
    c.equal("moesh_request_success_total by finish_reason == the client's finish reasons",
            api.by_label("sum by (finish_reason) (moesh_request_success_total)", "finish_reason"),
            {k: float(v) for k, v in reasons.items()})
    c.equal("moesh_request_failure_total by code == the one out-of-vocabulary request (3, INVALID_ARGUMENT)",
            api.by_label("sum by (code) (moesh_request_failure_total)", "code"), {"3": 1.0})
    c.equal("moesh_inter_token_latency_seconds count == generated tokens less each request's first",
            api.scalar("sum(moesh_inter_token_latency_seconds_count)"), float(gen_tokens - n))
    c.equal("moesh_e2e_request_latency_seconds count == requests answered",
            api.scalar("sum(moesh_e2e_request_latency_seconds_count)"), float(n))
    e2e_sum = api.scalar("sum(moesh_e2e_request_latency_seconds_sum)")
    c.check("e2e latency sum >= TTFT sum and <= the clients' wall time",
            e2e_sum is not None and sum(ttfts) <= e2e_sum <= sum(r["wall"] for r in results), str(e2e_sum))

    want_expert = forward_tokens * top_k * len(layers)
    c.equal(f"sum(moesh_expert_tokens_total) == (prompt + generated - 1 per request) x top_k {top_k} x "
            f"{len(layers)} MoE layers = {want_expert}", api.scalar("sum(moesh_expert_tokens_total)"),
            float(want_expert))
    c.equal("moesh_expert_tokens_total by layer == forward tokens x top_k on each MoE layer",
            api.by_label("sum by (layer) (moesh_expert_tokens_total)", "layer"),
            {str(i): float(forward_tokens * top_k) for i in layers})
    series = api.query("count by (layer, expert) (moesh_expert_tokens_total)")[0]
    c.equal("one moesh_expert_tokens_total series per (MoE layer, expert), each from one worker",
            sorted((s["metric"]["layer"], int(s["metric"]["expert"]), s["value"][1]) for s in series),
            sorted((str(i), e, "1") for i in layers for e in range(cfg["n_routed_experts"])))
    # One round trip per MoE layer of every forward pass, or of every micro-batch when a
    # forward is split into micro-batches that overlap dispatch with compute.
    for service, forwards in (("decode_worker", "moesh_decode_step_seconds_count"),
                              ("prefill_worker", "moesh_prefill_batch_seconds_count")):
        trips = api.scalar(f'sum(moesh_expert_roundtrip_seconds_count{{service="{service}"}})') or 0
        passes = api.scalar(f"sum({forwards})") or 0
        c.check(f"expert round trips of the {service} ({trips:g}) are a multiple of the {len(layers)} MoE layers, "
                f"at least one per layer of each of its {passes:g} forward passes",
                passes > 0 and trips % len(layers) == 0 and trips >= passes * len(layers))
    c.equal("decode batch sizes add up to the decode worker's generated tokens",
            api.scalar("sum(moesh_decode_batch_size_sum)"), float(gen_tokens - n))
    c.check("the expert workers merged no more batches than dispatches",
            (api.scalar("sum(moesh_expert_batches_total)") or 0)
            <= (api.scalar("sum(moesh_expert_dispatches_total)") or -1))
    c.equal("one KV handoff per request", api.scalar("sum(moesh_kv_transfer_seconds_count)"), float(n))
    kv_bytes = api.scalar("sum(moesh_kv_transfer_bytes_total)") or 0
    per_token_layer = kv_bytes / prompt_tokens / cfg["num_hidden_layers"]
    latent = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    c.check(f"KV bytes handed off == prompt tokens x layers x (kv_lora_rank + qk_rope_head_dim = {latent}) x "
            f"(2 or 4 bytes): got {per_token_layer} bytes per token and layer",
            per_token_layer in (latent * 2, latent * 4))
    c.equal("no transport errors", api.scalar("sum(moesh_transport_errors_total)"), 0.0)
    c.equal("at rest: no request running (router, decode worker)",
            api.by_label("moesh_num_requests_running", "service"), {"router": 0.0, "decode_worker": 0.0})
    c.equal("at rest: no prompt waiting", api.scalar("sum(moesh_num_requests_waiting)"), 0.0)
    c.equal("at rest: KV cache empty", api.scalar("sum(moesh_kv_cache_usage_perc)"), 0.0)
    c.equal("at rest: all 512 KV blocks free (serve-local's --kv_blocks)",
            api.scalar("sum(moesh_kv_cache_free_blocks)"), 512.0)

    # --- docs/METRICS.md against a real scrape -----------------------------------
    check_catalogue(c, src, processes)

    # --- recording rules, dashboard ---------------------------------------------
    check_rules_and_dashboard(c, src, api)
    c.check(f"under a minute ({time.monotonic() - started:.1f} s)", time.monotonic() - started < 60)


def check_catalogue(c, src, processes):
    catalogue = deploy_lib.parse_catalogue(os.path.join(src, "docs", "METRICS.md"))
    c.check("docs/METRICS.md has a catalogue table", len(catalogue) > 10, f"{len(catalogue)} rows")
    scraped = {}  # (family, service) -> (type, labels)
    for process, address, path in processes:
        families = deploy_lib.parse_exposition(deploy_lib.http_get(f"http://{address}{path}"))
        for name, fam in families.items():
            services = {labels.get("service") for _, labels, _ in fam["samples"]} - {None}
            service = services.pop() if services else "*"
            scraped[(name, service)] = (fam["type"], deploy_lib.family_labels(fam))
    documented = {}
    for row in catalogue:
        for service in row["services"] or {"*"}:
            documented[(row["name"], service)] = (row["type"], row["labels"])
    missing = sorted(k for k in scraped if k not in documented)
    c.check("every scraped (metric, service) is in docs/METRICS.md", not missing, f"undocumented: {missing}")
    extra = sorted(k for k in documented if k not in scraped)
    c.check("every (metric, service) in docs/METRICS.md is exported", not extra, f"not exported: {extra}")
    wrong = sorted((k, scraped[k], documented[k]) for k in scraped if k in documented and scraped[k] != documented[k])
    c.check("docs/METRICS.md has each metric's type and labels right", not wrong,
            "; ".join(f"{k}: scraped {s}, documented {d}" for k, s, d in wrong))


def check_rules_and_dashboard(c, src, api):
    import yaml  # python3-yaml
    rule_names = set()
    rules_dir = os.path.join(src, "deploy", "prometheus", "rules")
    for f in sorted(os.listdir(rules_dir)):
        with open(os.path.join(rules_dir, f)) as fh:
            for g in yaml.safe_load(fh)["groups"]:
                for rule in g["rules"]:
                    if "record" in rule:
                        rule_names.add(rule["record"])

    def rules_evaluated():
        body = api.api("rules")
        groups = body["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules and all(r.get("lastEvaluation", "").startswith("20") and
                             not r["lastEvaluation"].startswith("0001") for r in rules) and rules
    rules = wait_for("every rule evaluated once", rules_evaluated, 10)
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    c.check(f"all {len(rules)} rules evaluate without error in the live server", not bad, str(bad))

    def recorded():
        return all(api.query(name)[0] for name in rule_names)
    wait_for("every recording rule to have a value", recorded, 10)
    c.check(f"every recording rule ({len(rule_names)}) has data", True)

    r = subprocess.run([sys.executable, os.path.join(src, "deploy", "grafana", "make_dashboard.py"), "--check"],
                       capture_output=True, text=True)
    c.check("deploy/grafana/moesh.json is what make_dashboard.py writes", r.returncode == 0, r.stderr)
    with open(os.path.join(src, "deploy", "grafana", "moesh.json")) as f:
        dashboard = json.load(f)
    catalogue = deploy_lib.parse_catalogue(os.path.join(src, "docs", "METRICS.md"))
    histograms = {r["name"] for r in catalogue if r["type"] == "histogram"}
    known = {r["name"] for r in catalogue} | rule_names
    live = set(api.api("label/__name__/values")["data"]) | rule_names
    queries = deploy_lib.dashboard_queries(dashboard)
    c.check("the dashboard has queries", len(queries) > 10, str(len(queries)))
    referenced = set()
    for title, ref, expr in queries:
        names = deploy_lib.metric_names(expr)
        families = {deploy_lib.family_of(nm, histograms) for nm in names}
        referenced |= families
        unknown = sorted(f for f in families if f not in known)
        not_live = sorted(nm for nm in names if nm not in live)
        c.check(f"dashboard '{title}' {ref}: every metric is in docs/METRICS.md or a recording rule "
                f"and exists in Prometheus", not unknown and not not_live,
                f"expr {expr!r}: unknown {unknown}, not in Prometheus {not_live}")
        result, err = api.query(deploy_lib.substitute_grafana_vars(expr))
        c.check(f"dashboard '{title}' {ref}: the query returns data", not err and result,
                f"{err or 'empty result'} for {deploy_lib.substitute_grafana_vars(expr)!r}")
    used_rules = {n for n in referenced if n in rule_names}
    for name in list(used_rules):
        for f in os.listdir(rules_dir):
            with open(os.path.join(rules_dir, f)) as fh:
                for g in yaml.safe_load(fh)["groups"]:
                    for rule in g["rules"]:
                        if rule.get("record") == name:
                            referenced |= {deploy_lib.family_of(nm, histograms)
                                           for nm in deploy_lib.metric_names(rule["expr"])}
    not_shown = sorted(r["name"] for r in catalogue if r["name"].startswith("moesh_") and r["name"] not in referenced)
    c.check("the dashboard shows every moesh_ metric of the catalogue", not not_shown, f"not on it: {not_shown}")


if __name__ == "__main__":
    sys.exit(main())
