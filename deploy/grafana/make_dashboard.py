#!/usr/bin/python3
"""Writes deploy/grafana/moesh.json, the moesh Grafana dashboard.

The dashboard is generated so that its layout stays regular and every query
uses the same selectors; edit this file, then run

    /usr/bin/python3 deploy/grafana/make_dashboard.py          # rewrites moesh.json
    /usr/bin/python3 deploy/grafana/make_dashboard.py --check  # exit 1 if moesh.json is stale

tests/deploy/prometheus_test.py runs every query below against a live
Prometheus scraping a real cluster; tests/deploy/helm_chart_test.py
type-checks the JSON against Grafana's dashboard schema.
"""
import json
import os
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moesh.json")
DS = {"type": "prometheus", "uid": "${datasource}"}
NS = 'namespace=~"$namespace"'
RATE = "$__rate_interval"


def sel(metric, **labels):
    """metric{namespace=~"$namespace", k="v", ...}"""
    matchers = [NS] + [f'{k}="{v}"' for k, v in labels.items()]
    return f"{metric}{{{', '.join(matchers)}}}"


def quantiles(metric, by="", qs=(0.5, 0.9, 0.99), **labels):
    group = f"{by}, le" if by else "le"
    legend_by = "".join(f" {{{{{b.strip()}}}}}" for b in by.split(",") if b.strip())
    return [(f"histogram_quantile({q}, sum by ({group}) (rate({sel(metric + '_bucket', **labels)}[{RATE}])))",
             f"p{int(q * 100)}{legend_by}") for q in qs]


class Dashboard:
    def __init__(self):
        self.panels = []
        self.y = 0
        self.x = 0
        self.row_h = 0
        self.next_id = 1

    def _id(self):
        i = self.next_id
        self.next_id += 1
        return i

    def row(self, title):
        if self.x:
            self.y += self.row_h
        self.x, self.row_h = 0, 0
        self.panels.append({"type": "row", "title": title, "id": self._id(), "collapsed": False, "panels": [],
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}})
        self.y += 1

    def panel(self, kind, title, description, queries, unit="short", w=8, h=8, fmt="time_series", **extra):
        if self.x + w > 24:
            self.y += self.row_h
            self.x, self.row_h = 0, 0
        targets = []
        for i, (expr, legend) in enumerate(queries):
            t = {"datasource": DS, "refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                 "range": True, "instant": False}
            if fmt != "time_series":
                t["format"] = fmt
            targets.append(t)
        p = {"type": kind, "title": title, "description": description, "id": self._id(), "datasource": DS,
             "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y}, "targets": targets,
             "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}}
        if kind == "timeseries":
            p["options"] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                            "tooltip": {"mode": "multi", "sort": "desc"}}
            p["fieldConfig"]["defaults"]["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                                                      "showPoints": "never", "spanNulls": True}
        p.update(extra)
        self.panels.append(p)
        self.x += w
        self.row_h = max(self.row_h, h)


def build():
    d = Dashboard()
    router = {"service": "router"}

    d.row("Traffic")
    d.panel("stat", "Requests / s", "Finished requests per second (router).",
            [(f"sum(rate({sel('moesh_request_success_total', **router)}[{RATE}]))", "requests/s")],
            unit="reqps", w=4, h=6,
            options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                     "colorMode": "value", "graphMode": "area", "textMode": "auto"})
    d.panel("stat", "Generated tokens / s", "Tokens streamed to clients per second (router).",
            [(f"sum(rate({sel('moesh_generation_tokens_total', **router)}[{RATE}]))", "tokens/s")],
            unit="short", w=4, h=6,
            options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                     "colorMode": "value", "graphMode": "area", "textMode": "auto"})
    d.panel("timeseries", "Requests by finish reason",
            "moesh_request_success_total by finish_reason, and the prompts decode workers computed "
            "themselves instead of a prefill worker (moesh_local_prefills_total, "
            "--max_local_prefill_tokens).",
            [(f"sum by (finish_reason) (rate({sel('moesh_request_success_total', **router)}[{RATE}]))",
              "{{finish_reason}}"),
             (f"sum(rate({sel('moesh_local_prefills_total', **router)}[{RATE}]))", "prefilled on a decode worker")],
            unit="reqps", w=8, h=6)
    d.panel("timeseries", "Failed requests by gRPC code",
            "moesh_request_failure_total by numeric gRPC code (3 INVALID_ARGUMENT, 4 DEADLINE_EXCEEDED, "
            "8 RESOURCE_EXHAUSTED, 14 UNAVAILABLE), and streams moved to another prefill/decode pair "
            "because a worker serving them failed (moesh_stream_migrations_total).",
            [(f"sum by (code) (rate({sel('moesh_request_failure_total', **router)}[{RATE}]))", "code {{code}}"),
             (f"sum(rate({sel('moesh_stream_migrations_total', **router)}[{RATE}]))", "migrated")],
            unit="reqps", w=8, h=6)
    d.panel("timeseries", "Token throughput", "Prompt tokens admitted and tokens generated per second (router).",
            [(f"sum(rate({sel('moesh_prompt_tokens_total', **router)}[{RATE}]))", "prompt"),
             (f"sum(rate({sel('moesh_generation_tokens_total', **router)}[{RATE}]))", "generation")],
            unit="short", w=12)
    d.panel("timeseries", "Requests running and waiting",
            "Streams open at the router, requests in decode batches, prompts queued for prefill.",
            [(f"sum({sel('moesh_num_requests_running', **router)})", "running (router)"),
             (f"sum({sel('moesh_num_requests_running', service='decode_worker')})", "running (decode workers)"),
             (f"sum({sel('moesh_num_requests_waiting')})", "waiting (prefill queue)")],
            unit="short", w=12)
    d.panel("timeseries", "Workers each router holds",
            "moesh_router_workers by router and kind: the members each router's heartbeats keep "
            "(router HA: every router should hold every worker).",
            [(f"sum by (instance, kind) ({sel('moesh_router_workers', **router)})", "{{instance}} {{kind}}")],
            unit="short", w=24, h=6)

    d.row("Latency")
    d.panel("timeseries", "Time to first token", "moesh_time_to_first_token_seconds quantiles (router).",
            quantiles("moesh_time_to_first_token_seconds", **router), unit="s")
    d.panel("timeseries", "Inter-token latency", "moesh_inter_token_latency_seconds quantiles (router).",
            quantiles("moesh_inter_token_latency_seconds", **router), unit="s")
    d.panel("timeseries", "End-to-end request latency", "moesh_e2e_request_latency_seconds quantiles (router).",
            quantiles("moesh_e2e_request_latency_seconds", **router), unit="s")
    d.panel("heatmap", "Time to first token distribution",
            "TTFT observations per histogram bucket (router).",
            [(f"sum by (le) (increase({sel('moesh_time_to_first_token_seconds_bucket', **router)}[{RATE}]))",
              "{{le}}")], unit="s", w=24, fmt="heatmap",
            options={"calculate": False, "yAxis": {"axisPlacement": "left", "unit": "s"},
                     "color": {"mode": "scheme", "scheme": "Spectral", "steps": 64, "exponent": 0.5,
                               "fill": "dark-orange", "reverse": False},
                     "cellGap": 1, "legend": {"show": True}, "tooltip": {"mode": "single", "yHistogram": True},
                     "rowsFrame": {"layout": "auto"}, "filterValues": {"le": 1e-9}})

    d.row("Prefill and decode workers")
    d.panel("timeseries", "Prefill queue", "Prompts and prompt tokens queued per prefill worker.",
            [(f"sum by (instance) ({sel('moesh_num_requests_waiting', service='prefill_worker')})",
              "prompts {{instance}}"),
             (f"sum by (instance) ({sel('moesh_prefill_queued_tokens', service='prefill_worker')})",
              "tokens {{instance}}")], unit="short")
    d.panel("timeseries", "Prefill batch time", "Wall time of one batched prefill forward.",
            quantiles("moesh_prefill_batch_seconds", qs=(0.5, 0.99), service="prefill_worker"), unit="s")
    d.panel("timeseries", "Prompt tokens prefilled / s", "Per prefill worker.",
            [(f"sum by (instance) (rate({sel('moesh_prompt_tokens_total', service='prefill_worker')}[{RATE}]))",
              "{{instance}}")], unit="short")
    d.panel("timeseries", "KV cache usage", "Fraction of KV blocks in use per decode worker.",
            [(f"max by (instance) ({sel('moesh_kv_cache_usage_perc', service='decode_worker')})", "{{instance}}")],
            unit="percentunit")
    d.panel("timeseries", "KV cache free blocks", "Free KV blocks per decode worker.",
            [(f"min by (instance) ({sel('moesh_kv_cache_free_blocks', service='decode_worker')})", "{{instance}}")],
            unit="short")
    d.panel("timeseries", "KV admission queue and preemptions",
            "Requests queued per decode worker for KV blocks (new and preempted), running requests "
            "preempted per second because the KV cache ran dry, by how they resume (recompute or "
            "swap), and swaps that fell back to recompute (--swap_space_mb full).",
            [(f"sum by (instance) ({sel('moesh_decode_num_requests_waiting', service='decode_worker')})",
              "waiting {{instance}}"),
             (f"sum by (instance, mode) (rate({sel('moesh_decode_preemptions_total', service='decode_worker')}[{RATE}]))",
              "preempted/s {{mode}} {{instance}}"),
             (f"sum by (instance) (rate({sel('moesh_decode_swap_fallbacks_total', service='decode_worker')}[{RATE}]))",
              "swap fallbacks/s {{instance}}")], unit="short")
    d.panel("timeseries", "KV swapped to host memory",
            "Host memory the KV rows of swapped-out requests hold per decode worker "
            "(--preemption_mode=swap, at most --swap_space_mb).",
            [(f"sum by (instance) ({sel('moesh_decode_swapped_bytes', service='decode_worker')})",
              "{{instance}}")], unit="bytes")
    d.panel("timeseries", "KV swap time",
            "Wall time of copying a preempted request's KV rows to host memory (out) and back (in).",
            quantiles("moesh_decode_swap_seconds", by="direction", qs=(0.5, 0.99), service="decode_worker"),
            unit="s")
    d.panel("timeseries", "Decode batch", "Requests per decode step: mean and p99, running requests.",
            [(f"sum(rate({sel('moesh_decode_batch_size_sum', service='decode_worker')}[{RATE}])) / "
              f"sum(rate({sel('moesh_decode_batch_size_count', service='decode_worker')}[{RATE}]))", "mean"),
             quantiles("moesh_decode_batch_size", qs=(0.99,), service="decode_worker")[0],
             (f"sum by (instance) ({sel('moesh_num_requests_running', service='decode_worker')})",
              "running {{instance}}")], unit="short")
    d.panel("timeseries", "Decode step time", "Wall time of one continuous-batching decode step.",
            quantiles("moesh_decode_step_seconds", qs=(0.5, 0.99), service="decode_worker"), unit="s")
    d.panel("timeseries", "Chunked prefill",
            "Tokens per decode step (running decodes plus prompt chunks, under --max_num_batched_tokens), "
            "and prompt chunks per second computed in decode steps (colocated router, recomputes) and by "
            "prefill workers.",
            quantiles("moesh_decode_step_tokens", qs=(0.5, 0.99))
            + [(f"sum by (instance) (rate({sel('moesh_decode_prompt_chunks_total')}[{RATE}]))",
                "decode-step chunks/s {{instance}}"),
               (f"sum by (instance) (rate({sel('moesh_prefill_chunks_total')}[{RATE}]))",
                "prefill chunks/s {{instance}}")], unit="short", w=24)
    d.panel("timeseries", "Decode tokens / s", "Tokens generated per decode worker.",
            [(f"sum by (instance) (rate({sel('moesh_generation_tokens_total', service='decode_worker')}[{RATE}]))",
              "{{instance}}")], unit="short", w=16)
    d.panel("timeseries", "Prefix cache hit rate",
            "Prompt tokens whose KV rows came from the prefix cache, over all tokens looked up, per worker.",
            [(f"sum by (instance) (rate({sel('moesh_prefix_cache_hit_tokens_total')}[{RATE}])) / "
              f"(sum by (instance) (rate({sel('moesh_prefix_cache_hit_tokens_total')}[{RATE}])) + "
              f"sum by (instance) (rate({sel('moesh_prefix_cache_miss_tokens_total')}[{RATE}])))",
              "{{instance}}")], unit="percentunit", w=12)
    d.panel("timeseries", "Prefix cache blocks and evictions",
            "KV blocks the prefix cache holds (in use or reclaimable), and cached blocks evicted per second.",
            [(f"sum by (instance) ({sel('moesh_prefix_cache_blocks')})", "blocks {{instance}}"),
             (f"sum by (instance) (rate({sel('moesh_prefix_cache_evictions_total')}[{RATE}]))",
              "evicted/s {{instance}}")], unit="short", w=12)

    d.row("Experts")
    expert_rate = f"sum by (layer, expert) (rate({sel('moesh_expert_tokens_total')}[{RATE}]))"
    d.panel("heatmap", "Expert load (tokens / s per layer and expert)",
            "moesh_expert_tokens_total rate, one row per (MoE layer, expert), replicas summed.",
            [(expert_rate, "L{{layer}} E{{expert}}")], unit="short", w=24, h=12,
            options={"calculate": False, "yAxis": {"axisPlacement": "left"},
                     "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64, "exponent": 0.5,
                               "fill": "dark-orange", "reverse": False},
                     "cellGap": 1, "legend": {"show": True}, "tooltip": {"mode": "single", "yHistogram": False},
                     "rowsFrame": {"layout": "auto"}})
    d.panel("timeseries", "Expert balance ratio", "Per MoE layer: hottest expert's load over the mean (1 = balanced).",
            [(f"max by (layer) ({expert_rate}) / avg by (layer) ({expert_rate})", "layer {{layer}}")], unit="short")
    d.panel("bargauge", "Tokens per expert (time range)", "Tokens routed to each expert over the range, all layers.",
            [(f"sum by (expert) (increase({sel('moesh_expert_tokens_total')}[$__range]))", "expert {{expert}}")],
            unit="short", w=16,
            options={"orientation": "vertical", "displayMode": "gradient", "showUnfilled": True,
                     "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}})
    d.panel("timeseries", "Expert compute time", "One grouped expert computation (a merged batch).",
            quantiles("moesh_expert_compute_seconds", qs=(0.5, 0.99), service="expert_worker"), unit="s")
    d.panel("timeseries", "Expert batches", "Grouped computations per second and dispatches merged into each.",
            [(f"sum(rate({sel('moesh_expert_batches_total', service='expert_worker')}[{RATE}]))", "batches/s"),
             (f"sum(rate({sel('moesh_expert_dispatches_total', service='expert_worker')}[{RATE}])) / "
              f"sum(rate({sel('moesh_expert_batches_total', service='expert_worker')}[{RATE}]))",
              "dispatches per batch")], unit="short", w=16)
    d.panel("timeseries", "Expert worker balance and rebalances",
            "The busiest expert worker's share of tokens over the mean (router, automatic rebalancer), "
            "rebalances per hour by result, and replicas dropped per hour (moved away by a rebalance).",
            [(f"max({sel('moesh_expert_worker_balance_ratio', service='router')})", "balance ratio"),
             (f"sum by (result) (increase({sel('moesh_rebalances_total', service='router')}[1h]))",
              "rebalances/h {{result}}"),
             (f"sum(increase({sel('moesh_expert_replicas_dropped_total', service='router')}[1h]))",
              "replicas dropped/h")], unit="short")
    d.panel("timeseries", "Rebalance duration",
            "Planning, loading the new replicas, switching the map and dropping the replicas it left.",
            quantiles("moesh_rebalance_seconds", qs=(0.5, 0.99), service="router"), unit="s", w=16)

    d.row("Transport")
    d.panel("timeseries", "Attention ↔ expert round trip",
            "Dispatch, expert FFNs and combine of one MoE layer, by attention-side service and transport.",
            quantiles("moesh_expert_roundtrip_seconds", by="service, transport", qs=(0.5, 0.99)), unit="s")
    d.panel("timeseries", "Transport errors", "Failed data-plane calls per second.",
            [(f"sum by (service, transport) (rate({sel('moesh_transport_errors_total')}[{RATE}]))",
              "{{service}} {{transport}}")], unit="short")
    d.panel("timeseries", "Expert dispatch bytes",
            "Hidden-state bytes per second sent to expert workers, by attention-side service and wire "
            "encoding (--dispatch_dtype: fp32, bf16, fp8 with its scales).",
            [(f"sum by (service, encoding) (rate({sel('moesh_expert_dispatch_bytes_total')}[{RATE}]))",
              "{{service}} {{encoding}}")], unit="Bps")
    d.panel("timeseries", "KV transfer", "KV cache bytes per second handed from prefill to decode workers.",
            [(f"sum by (instance) (rate({sel('moesh_kv_transfer_bytes_total', service='prefill_worker')}[{RATE}]))",
              "{{instance}}")], unit="Bps")
    d.panel("timeseries", "KV transfer latency", "One request's KV handoff from prefill to decode.",
            quantiles("moesh_kv_transfer_seconds", qs=(0.5, 0.99), service="prefill_worker"), unit="s")
    d.panel("timeseries", "Scrape targets up", "Prometheus's view of every moesh process.",
            [('sum by (job) (up{job=~".*moesh.*", ' + NS + '})', "{{job}} up"),
             ('count by (job) (up{job=~".*moesh.*", ' + NS + '})', "{{job}} targets")], unit="short", w=16)

    return {
        "title": "moesh",
        "uid": "moesh-overview",
        "description": "moesh: DeepSeek MoE serving cluster (router, prefill, decode and expert workers). "
                       "Metrics: docs/METRICS.md.",
        "tags": ["moesh", "llm", "moe"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "links": [],
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {"selected": False, "text": "default", "value": "default"}, "hide": 0, "refresh": 1,
             "regex": "", "options": [], "includeAll": False, "multi": False},
            {"name": "namespace", "label": "Namespace", "type": "query", "datasource": DS,
             "query": {"query": "label_values(moesh_num_requests_running, namespace)", "refId": "namespace"},
             "current": {"selected": True, "text": "All", "value": "$__all"}, "hide": 0, "refresh": 2,
             "regex": "", "options": [], "includeAll": True, "allValue": ".*", "multi": False, "sort": 1},
        ]},
        "panels": d.panels,
    }


def main():
    text = json.dumps(build(), indent=2, ensure_ascii=False) + "\n"
    if sys.argv[1:] == ["--check"]:
        with open(OUT) as f:
            if f.read() != text:
                sys.exit(f"{OUT} is stale: run {sys.argv[0]}")
        return
    with open(OUT, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
