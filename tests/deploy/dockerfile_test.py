#!/usr/bin/python3
"""deploy/docker/Dockerfile and Dockerfile.cuda against the build (this
machine has no Docker engine, so the images are not built here):

  * stages: a Debian 12 build stage and a debian:12-slim runtime stage (CUDA:
    nvidia/cuda devel and runtime images);
  * the binaries built and copied = the service executables the CMake files
    define (add_executable moesh, moesh_*), and they exist in BIN_DIR;
  * the build stage's packages = scripts/install_deps.sh less the
    test-only ones;
  * the runtime stage's packages = the packages that provide the libraries
    the built binaries link (deploy/docker/runtime-packages.sh), less those
    debian:12-slim already has: nothing missing, nothing extra, no -dev;
  * a non-root numeric USER that the image creates, the entrypoint script,
    the ports the Helm chart uses;
  * the entrypoint maps each service to its binary and passes the flags
    through (with stub binaries, then the real ones with --version).

usage: dockerfile_test.py BIN_DIR SOURCE_DIR
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
from deploy_lib import Checks  # noqa: E402

import yaml  # python3-yaml

# install_deps.sh packages the images do not build with: tests and tools (clang-format
# and git for the source checks, scripts/check_format.sh and check_layers.py; clang-14
# for the fuzz targets, scripts/fuzz.sh; openssl for the tests' throwaway certificates).
TEST_ONLY = {"python3-grpcio", "python3-protobuf", "libgtest-dev", "libgmock-dev", "bazel-bootstrap", "prometheus",
             "python3-yaml", "clang-format", "git", "clang-14", "openssl", "curl"}
# In debian:bookworm-slim already (apt needs them).
SLIM_BASE = {"libc6", "libgcc-s1", "libstdc++6"}
ENTRYPOINT_MAP = {"router": "moesh_router", "prefill": "moesh_prefill_worker", "decode": "moesh_decode_worker",
                  "expert": "moesh_expert_worker", "moesh": "moesh"}


def parse_dockerfile(path):
    """-> (args {name: default}, stages [{"from", "name", "instructions": [(op, text)]}])."""
    with open(path) as f:
        text = f.read()
    text = re.sub(r"\\\n", " ", text)  # line continuations
    args, stages = {}, []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "ARG" and not stages:
            k, _, v = rest.partition("=")
            args[k.strip()] = v.strip()
        elif op == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            image = re.sub(r"\$\{(\w+)\}", lambda mm: args.get(mm.group(1), mm.group(0)), m.group(1))
            stages.append({"from": image, "name": m.group(2), "instructions": []})
        elif stages:
            stages[-1]["instructions"].append((op, " ".join(rest.split())))
    return args, stages


def apt_packages(stage):
    pkgs = set()
    for op, text in stage["instructions"]:
        if op == "RUN" and "apt-get install" in text:
            for cmd in text.split("&&"):
                if "apt-get install" in cmd:
                    pkgs |= {w for w in shlex.split(cmd.split("apt-get install", 1)[1]) if not w.startswith("-")}
    return pkgs


def run_text(stage):
    return " ".join(t for op, t in stage["instructions"] if op == "RUN")


def cmake_service_targets(src):
    targets = set()
    for root, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if not d.startswith((".", "build", "bazel-")) and d not in ("third_party", "models")]
        if "CMakeLists.txt" in files:
            with open(os.path.join(root, "CMakeLists.txt")) as f:
                for m in re.finditer(r"add_executable\(\s*(moesh(?:_[a-z_]+)?)\s+([^)]*)\)", f.read()):
                    if "EXCLUDE_FROM_ALL" not in m.group(2).split():
                        targets.add(m.group(1))
    return targets


def install_deps_packages(src):
    with open(os.path.join(src, "scripts", "install_deps.sh")) as f:
        m = re.search(r"PACKAGES=\((.*?)\)", f.read(), re.S)
    return set(shlex.split(m.group(1), comments=True))


def chart_ports(src):
    with open(os.path.join(src, "deploy", "helm", "moesh", "values.yaml")) as f:
        ports = yaml.safe_load(f)["ports"]
    return {str(ports["grpc"]), str(ports["metrics"])}


def check_common(c, name, stages, binaries, build_pkgs, src, plugins=frozenset()):
    """plugins: CMake MODULE targets (lib<target>.so) the image carries beside the binaries."""
    build, runtime = stages
    ninja = run_text(build).split("ninja -C /build", 1)[-1].split(" && mkdir", 1)[0]
    built = {w for w in ninja.split() if re.fullmatch(r"moesh\w*", w)}
    copied = set(re.findall(r"/build/(moesh\w*)", run_text(build)))
    copied_plugins = set(re.findall(r"/build/lib(moesh\w*)\.so", run_text(build)))
    want = f"the service binaries ({', '.join(sorted(binaries))})" + (
        f" and the plugins {', '.join(sorted(plugins))}" if plugins else "")
    c.check(f"{name}: the build stage builds and copies exactly {want}",
            built == binaries | plugins and copied == binaries and copied_plugins == plugins,
            f"built {sorted(built)}, copied {sorted(copied)}, plugins copied {sorted(copied_plugins)}")
    c.equal(f"{name}: the build stage installs scripts/install_deps.sh's packages (less test-only ones)",
            apt_packages(build), build_pkgs)
    c.check(f"{name}: Release build without tests", "-DCMAKE_BUILD_TYPE=Release" in run_text(build)
            and "-DMOESH_BUILD_TESTS=OFF" in run_text(build))
    copies = [t for op, t in runtime["instructions"] if op == "COPY"]
    c.check(f"{name}: the runtime stage copies the binaries from the build stage into /usr/local/bin",
            any(t.startswith("--from=build ") and t.endswith("/usr/local/bin/") for t in copies), str(copies))
    c.check(f"{name}: the runtime stage installs the entrypoint script as /usr/local/bin/moesh-entrypoint",
            any("deploy/docker/entrypoint.sh /usr/local/bin/moesh-entrypoint" in t and "--chmod=0755" in t
                for t in copies), str(copies))
    ins = dict((op, t) for op, t in runtime["instructions"])
    user = ins.get("USER", "")
    uid = user.split(":")[0]
    c.check(f"{name}: runs as a non-root numeric user ({user}) that the image creates",
            uid.isdigit() and int(uid) != 0 and re.search(rf"useradd [^&]*--uid {uid}\b", run_text(runtime)), user)
    c.equal(f"{name}: ENTRYPOINT is moesh-entrypoint", ins.get("ENTRYPOINT"), '["/usr/local/bin/moesh-entrypoint"]')
    c.equal(f"{name}: EXPOSEs the chart's grpc and metrics ports", set(ins.get("EXPOSE", "").split()), chart_ports(src))
    c.check(f"{name}: the runtime stage installs no -dev package", not any(p.endswith("-dev") for p in
                                                                            apt_packages(runtime)))
    c.check(f"{name}: apt lists are removed after each install",
            all("rm -rf /var/lib/apt/lists/*" in t for op, t in build["instructions"] + runtime["instructions"]
                if op == "RUN" and "apt-get update" in t))
    c.check(f"{name}: --no-install-recommends everywhere",
            all("--no-install-recommends" in t for op, t in build["instructions"] + runtime["instructions"]
                if op == "RUN" and "apt-get install" in t))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    bin_dir, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    c = Checks("dockerfile_test")
    docker = os.path.join(src, "deploy", "docker")

    binaries = cmake_service_targets(src)
    c.equal("the CMake files define five service executables", binaries, set(ENTRYPOINT_MAP.values()))
    for b in sorted(binaries):
        c.check(f"{b} is built in {bin_dir}", os.access(os.path.join(bin_dir, b), os.X_OK))
    build_pkgs = install_deps_packages(src) - TEST_ONLY

    # --- Dockerfile (CPU) ---
    args, stages = parse_dockerfile(os.path.join(docker, "Dockerfile"))
    c.equal("Dockerfile: two stages, build and runtime", [s["name"] for s in stages], ["build", "runtime"])
    c.equal("Dockerfile: built on Debian 12, run on Debian 12 slim", [s["from"] for s in stages],
            ["debian:bookworm", "debian:bookworm-slim"])
    if len(stages) == 2:
        check_common(c, "Dockerfile", stages, binaries, build_pkgs, src)
        c.check("Dockerfile: builds without CUDA", "-DMOESH_CUDA=OFF" in run_text(stages[0]))
        r = subprocess.run([os.path.join(docker, "runtime-packages.sh")] + [os.path.join(bin_dir, b)
                                                                              for b in sorted(binaries)],
                           capture_output=True, text=True)
        c.check("runtime-packages.sh maps every library the binaries link to its package", r.returncode == 0, r.stderr)
        needed = set(r.stdout.split())
        listed = apt_packages(stages[1])
        c.equal("Dockerfile: the runtime packages are exactly those of the libraries the built binaries link "
                "(less libc6, libgcc-s1, libstdc++6 of debian:bookworm-slim)", listed, needed - SLIM_BASE)

    # --- Dockerfile.cuda ---
    args, stages = parse_dockerfile(os.path.join(docker, "Dockerfile.cuda"))
    c.equal("Dockerfile.cuda: two stages, build and runtime", [s["name"] for s in stages], ["build", "runtime"])
    froms = [s["from"] for s in stages]
    c.check("Dockerfile.cuda: nvidia/cuda devel image to build, runtime image to run",
            len(froms) == 2 and re.fullmatch(r"nvidia/cuda:[\d.]+-devel-ubuntu[\d.]+", froms[0])
            and re.fullmatch(r"nvidia/cuda:[\d.]+-runtime-ubuntu[\d.]+", froms[1])
            and froms[0].split(":")[1].split("-")[0] == froms[1].split(":")[1].split("-")[0], str(froms))
    if len(stages) == 2:
        check_common(c, "Dockerfile.cuda", stages, binaries, build_pkgs, src, plugins={"moesh_cuda_backends"})
        c.check("Dockerfile.cuda: builds the CUDA backend", "-DMOESH_CUDA=ON" in run_text(stages[0]))
        c.check("Dockerfile.cuda: the runtime stage installs what runtime-packages.sh found in the build stage",
                "deploy/docker/runtime-packages.sh /out/bin/* > /out/runtime-packages.txt" in run_text(stages[0])
                and "xargs -a /tmp/runtime-packages.txt apt-get install" in run_text(stages[1]))

    for ignore in ("Dockerfile.dockerignore", "Dockerfile.cuda.dockerignore"):
        with open(os.path.join(docker, ignore)) as f:
            patterns = {ln.strip() for ln in f if ln.strip() and not ln.startswith("#")}
        c.check(f"{ignore} keeps .git, build trees and models out of the context",
                {".git", "build", "build-*", "bazel-*", "models"} <= patterns, str(patterns))
    with open(os.path.join(src, "CMakeLists.txt")) as f:
        cmake = f.read()
    c.check("the CMake options the Dockerfiles set exist", "MOESH_BUILD_TESTS" in cmake and "MOESH_CUDA" in cmake)

    # --- the entrypoint ---
    entrypoint = os.path.join(docker, "entrypoint.sh")
    with tempfile.TemporaryDirectory() as stubs:
        for b in ENTRYPOINT_MAP.values():
            with open(os.path.join(stubs, b), "w") as f:
                f.write(f'#!/bin/sh\necho "{b}" "$@"\n')
            os.chmod(os.path.join(stubs, b), 0o755)
        env = dict(os.environ, MOESH_BIN_DIR=stubs)
        for service, binary in ENTRYPOINT_MAP.items():
            r = subprocess.run([entrypoint, service, "--a=1", "b c"], capture_output=True, text=True, env=env)
            c.equal(f"moesh-entrypoint {service} runs {binary} with the flags", r.stdout.strip(), f"{binary} --a=1 b c")
        r = subprocess.run([entrypoint, "nonsense"], capture_output=True, text=True, env=env)
        c.check("moesh-entrypoint refuses an unknown service (exit 64) and says which exist",
                r.returncode == 64 and "router" in r.stderr, r.stderr)
        r = subprocess.run([entrypoint], capture_output=True, text=True, env=env)
        c.equal("moesh-entrypoint without arguments prints usage and exits 64", r.returncode, 64)
    env = dict(os.environ, MOESH_BIN_DIR=bin_dir)
    for service in ("router", "prefill", "decode", "expert"):
        r = subprocess.run([entrypoint, service, "--version"], capture_output=True, text=True, env=env)
        c.check(f"moesh-entrypoint {service} --version runs the real binary", r.returncode == 0
                and ENTRYPOINT_MAP[service] in r.stdout, r.stdout + r.stderr)
    return c.summary()


if __name__ == "__main__":
    sys.exit(main())
