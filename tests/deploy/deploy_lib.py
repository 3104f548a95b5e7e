"""Helpers shared by the tests in tests/deploy: a check counter, the metrics
catalogue (docs/METRICS.md) parser, the Prometheus text format parser, and
the Grafana dashboard's queries."""
import json
import math
import re
import socket
import urllib.parse
import urllib.request


class Checks:
    """Counts named checks; `summary()` prints 'N passed, N failed' and returns the exit code."""

    def __init__(self, name):
        self.name = name
        self.passed = 0
        self.failed = []

    def check(self, what, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"ok    {what}", flush=True)
        else:
            self.failed.append(what)
            print(f"FAIL  {what}" + (f": {detail}" if detail else ""), flush=True)
        return ok

    def equal(self, what, got, want):
        return self.check(what, got == want, f"got {got!r}, want {want!r}")

    def close(self, what, got, want, rel=1e-9, abs_tol=1e-12):
        ok = got is not None and math.isclose(got, want, rel_tol=rel, abs_tol=abs_tol)
        return self.check(what, ok, f"got {got!r}, want {want!r} (rel {rel})")

    def summary(self):
        print(f"{self.name}: {self.passed} passed, {len(self.failed)} failed")
        for f in self.failed:
            print(f"  failed: {f}")
        return 0 if not self.failed else 1


class Fatal(Exception):
    """A failure after which the test cannot go on."""


def fatal(msg):
    raise Fatal(msg)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


# --- the catalogue ------------------------------------------------------------

CATALOGUE_ROW = re.compile(r"^\|\s*`(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)`\s*\|"
                           r"\s*(?P<type>counter|gauge|histogram|summary)\s*\|"
                           r"(?P<labels>[^|]*)\|(?P<services>[^|]*)\|(?P<meaning>.*)\|\s*$")


def parse_catalogue(path):
    """docs/METRICS.md table rows -> [{name, type, labels (set), services (set), meaning}].

    A row: | `name` | type | `label`, `label` or — | `service`, `service` | meaning |
    Labels exclude `service` (every series has it) and histograms' `le`."""
    rows = []
    with open(path) as f:
        for line in f:
            m = CATALOGUE_ROW.match(line.strip())
            if not m:
                continue
            labels = set(re.findall(r"`([a-zA-Z_][a-zA-Z0-9_]*)`", m["labels"]))
            services = set(re.findall(r"`([a-zA-Z_][a-zA-Z0-9_]*)`", m["services"]))
            rows.append({"name": m["name"], "type": m["type"], "labels": labels, "services": services,
                         "meaning": m["meaning"].strip()})
    return rows


# --- the Prometheus text format -------------------------------------------------

SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text):
    """-> {family: {"type": t, "help": h, "samples": [(sample name, {labels}, value)]}}."""
    families = {}
    types = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, t = line.split(None, 3)
            types[name] = t.strip()
            families.setdefault(name, {"type": "", "help": "", "samples": []})["type"] = t.strip()
        elif line.startswith("# HELP "):
            parts = line.split(None, 3)
            families.setdefault(parts[2], {"type": "untyped", "help": "", "samples": []})["help"] = \
                parts[3] if len(parts) > 3 else ""
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            if not m:
                continue
            name = m["name"]
            family = name
            for suffix in ("_bucket", "_sum", "_count"):
                if name.endswith(suffix) and name[: -len(suffix)] in types:
                    family = name[: -len(suffix)]
            labels = dict(LABEL.findall(m["labels"] or ""))
            families.setdefault(family, {"type": "untyped", "help": "", "samples": []})["samples"].append(
                (name, labels, float(m["value"].replace("Nan", "NaN"))))
    return families


def family_labels(family):
    """Label names a family's samples carry, less `service`, `le` and `quantile`."""
    names = set()
    for _, labels, _ in family["samples"]:
        names |= set(labels)
    return names - {"service", "le", "quantile"}


# --- PromQL ------------------------------------------------------------------

IDENT = re.compile(r"(?<![a-zA-Z0-9_:$\"'])([a-zA-Z_:][a-zA-Z0-9_:]*)")


def metric_names(expr):
    """Metric names an expression references: moesh_* series and moesh:* recording rules."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # drop label values
    return {n for n in IDENT.findall(expr) if n.startswith("moesh_") or n.startswith("moesh:")}


def family_of(name, histogram_families):
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in histogram_families:
            return name[: -len(suffix)]
    return name


# Grafana's variables, as the tests substitute them.
GRAFANA_VARS = {"${namespace}": ".*", "$namespace": ".*", "$__rate_interval": "1m", "${__rate_interval}": "1m",
                "$__range": "5m", "${__range}": "5m", "$__interval": "15s", "${__interval}": "15s"}


def substitute_grafana_vars(expr):
    for k in sorted(GRAFANA_VARS, key=len, reverse=True):
        expr = expr.replace(k, GRAFANA_VARS[k])
    return expr


def dashboard_panels(dashboard):
    """All panels, rows' nested panels included."""
    out = []
    for p in dashboard.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def dashboard_queries(dashboard):
    """-> [(panel title, refId, expr)] of every Prometheus query on the dashboard."""
    out = []
    for p in dashboard_panels(dashboard):
        for t in p.get("targets", []):
            if "expr" in t:
                out.append((p.get("title", "?"), t.get("refId", "?"), t["expr"]))
    for v in dashboard.get("templating", {}).get("list", []):
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        if v.get("type") == "query" and isinstance(q, str):
            m = re.match(r"label_values\((.*),\s*[a-zA-Z_]+\)$", q)
            out.append((f"variable {v['name']}", "var", m.group(1) if m else q))
    return out


class Prometheus:
    """A client of one Prometheus server's HTTP API."""

    def __init__(self, address):
        self.base = f"http://{address}"

    def api(self, path, **params):
        url = f"{self.base}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            body = json.loads(http_get(url, timeout=10))
        except urllib.error.HTTPError as e:
            body = json.loads(e.read().decode())
        return body

    def query(self, expr):
        """-> (result list, error string or None)."""
        body = self.api("query", query=expr)
        if body.get("status") != "success":
            return None, f"{body.get('errorType')}: {body.get('error')}"
        return body["data"]["result"], None

    def scalar(self, expr):
        """The value of an expression that returns exactly one series, else None."""
        result, err = self.query(expr)
        if err or not result or len(result) != 1:
            return None
        return float(result[0]["value"][1])

    def by_label(self, expr, label):
        result, err = self.query(expr)
        if err:
            return {}
        return {r["metric"].get(label, ""): float(r["value"][1]) for r in result}
