#!/usr/bin/env python3
"""Checks that every #include in the tree points down the layers.

moesh is built in layers (docs/DESIGN.md, "The house"). Each source folder (a
"room") belongs to one layer; a file may include files of its own room, of
other rooms of its layer, or of any layer below, never above. Within a layer
the rooms' includes must not close a cycle, and the service rooms (one folder
per service binary) do not include one another. Generated protos (proto/) sit
just below the transport: only the edges (transport, serving, services,
binaries) speak wire types.

Usage: scripts/check_layers.py [REPO_DIR]     exits 1 and names each offence.
There is no exceptions list: fix the include or move the file.
"""
import collections
import os
import re
import subprocess
import sys

# Bottom up. A room is a folder prefix; the longest matching prefix wins.
LAYERS = [
    ("base", ["base", "common/rpc", "common/metrics"]),
    ("kernels", ["kernels/cpu", "kernels/cuda"]),
    ("model", ["common/model", "common/tokenizer"]),
    ("engine", ["common/engine"]),
    ("backend", ["common/backend", "common/cuda_backend"]),
    ("proto", ["proto"]),
    ("transport", ["common/transport"]),
    ("serving", ["common/serving"]),
    ("service", ["common/service"]),
    ("services", ["router", "prefill_worker", "decode_worker", "expert_worker"]),
    ("binaries", ["cli", "tools/bench", "tests/golden", "tests/integration", "tests/security",
                  "tests/fuzz", "examples"]),
]
# Rooms of these layers are independent programs: no includes between them.
APART = {"services"}
SOURCE = re.compile(r"\.(h|cc|cu|cuh|inc)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# Generated headers: proto/moesh/v1/x.proto -> "moesh/v1/x.pb.h".
PROTO_INCLUDE = re.compile(r"^(moesh|grpc/health)/.*\.pb\.h$")


def room_of(path, rooms):
    best = None
    for room in rooms:
        if path == room or path.startswith(room + "/"):
            if best is None or len(room) > len(best):
                best = room
    return best


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    os.chdir(repo)
    layer_of = {}
    for i, (_, rooms) in enumerate(LAYERS):
        for room in rooms:
            layer_of[room] = i
    files = subprocess.check_output(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                                    text=True).split("\n")
    files = [f for f in files if SOURCE.search(f) and not f.startswith("third_party/") and os.path.isfile(f)]
    errors = []
    edges = collections.defaultdict(set)  # room -> rooms it includes (same layer only)
    for f in sorted(files):
        src_room = room_of(f, layer_of)
        if src_room is None:
            errors.append(f"{f}: in no layer (add its folder to LAYERS in scripts/check_layers.py)")
            continue
        src_layer = layer_of[src_room]
        with open(f, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for m in INCLUDE.finditer(text):
            inc = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            if PROTO_INCLUDE.match(inc):
                dst_room = "proto"
            elif os.path.isfile(inc):
                dst_room = room_of(inc, layer_of)
                if dst_room is None:
                    errors.append(f"{f}:{line}: includes {inc}, which is in no layer")
                    continue
            else:
                continue  # a system or third-party header, or one beside the file
            if dst_room == src_room:
                continue
            dst_layer = layer_of[dst_room]
            src_name, dst_name = LAYERS[src_layer][0], LAYERS[dst_layer][0]
            if dst_layer > src_layer:
                errors.append(f"{f}:{line}: {src_name} ({src_room}) includes {inc} from the {dst_name} layer above it")
            elif dst_layer == src_layer:
                if src_name in APART:
                    errors.append(f"{f}:{line}: service {src_room} includes {inc} of service {dst_room}; "
                                  f"what two services share belongs in common/")
                edges[src_room].add(dst_room)
    # Cycles among the rooms of one layer.
    state = {}

    def visit(room, stack):
        state[room] = 1
        stack.append(room)
        for nxt in sorted(edges.get(room, ())):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                errors.append("include cycle between rooms: " + " -> ".join(cycle))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[room] = 2

    for room in sorted(edges):
        if room not in state:
            visit(room, [])
    for e in errors:
        print(e)
    if errors:
        print(f"check_layers: {len(errors)} offence(s) in {len(files)} files")
        return 1
    print(f"check_layers: {len(files)} files, every include points down "
          f"({' -> '.join(name for name, _ in LAYERS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
