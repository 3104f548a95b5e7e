#!/usr/bin/python3
"""Turns `moesh serve-local` output into Prometheus file_sd targets.

serve-local prints one line per process on stderr:

    router  pid 7378  grpc 127.0.0.1:34129  metrics http://127.0.0.1:37661/metrics

This prints (or writes with --out) a file_sd JSON list with one target per
process, labelled `process` (router, expert-0, decode-0, ...) and `component`
(router, expert, decode, prefill), for prometheus-local.yml.

usage: local_targets.py SERVE_LOCAL_LOG [--out FILE]
"""
import json
import re
import sys

LINE = re.compile(r"^\s*(?P<process>[a-z]+(?:-\d+)?)\s+pid\s+\d+\s+grpc\s+\S+\s+metrics\s+"
                  r"http://(?P<address>[^/\s]+)(?P<path>/\S*)")


def parse(text):
    """Returns [(process, metrics host:port, path)] in the order serve-local printed them."""
    out = []
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            out.append((m["process"], m["address"], m["path"]))
    return out


def file_sd(processes):
    groups = []
    for process, address, path in processes:
        labels = {"process": process, "component": process.split("-")[0]}
        if path != "/metrics":
            labels["__metrics_path__"] = path
        groups.append({"targets": [address], "labels": labels})
    return groups


def main(argv):
    if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--out"):
        sys.exit(__doc__.strip().splitlines()[-1])
    with open(argv[1]) as f:
        processes = parse(f.read())
    if not processes:
        sys.exit(f"local_targets: no 'NAME pid N grpc ADDR metrics URL' lines in {argv[1]}")
    text = json.dumps(file_sd(processes), indent=2) + "\n"
    if len(argv) == 4:
        with open(argv[3], "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main(sys.argv)
