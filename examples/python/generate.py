#!/usr/bin/env python3
"""Minimal moesh client in Python (grpcio): stream a generation from a router.

Stubs are generated on the fly from proto/ with protoc and gRPC's Python
plugin (Debian: protobuf-compiler protobuf-compiler-grpc python3-grpcio
python3-protobuf; run with /usr/bin/python3):

    /usr/bin/python3 examples/python/generate.py --server 127.0.0.1:50051 --prompt_ids 5,17,300
"""
import argparse
import os
import sys
import tempfile

import subprocess

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.join(HERE, "..", "..", "proto")


def load_stubs():
    out = tempfile.mkdtemp(prefix="moesh_py_")
    for name in ("common", "generation"):
        subprocess.run(["protoc", f"-I{PROTO_ROOT}", f"--python_out={out}", f"--grpc_python_out={out}",
                        "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
                        os.path.join(PROTO_ROOT, "moesh", "v1", f"{name}.proto")], check=True)
    sys.path.insert(0, out)
    from moesh.v1 import generation_pb2, generation_pb2_grpc  # noqa: E402
    return generation_pb2, generation_pb2_grpc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True,
                    help="host:port, or several comma-separated: a request that fails UNAVAILABLE "
                         "before its first message goes to the next router")
    ap.add_argument("--prompt_ids", help="comma-separated token ids")
    ap.add_argument("--prompt", help="text (the model needs a tokenizer.json)")
    ap.add_argument("--max_new_tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.0)
    args = ap.parse_args()
    pb, pb_grpc = load_stubs()

    req = pb.GenerateRequest()
    if args.prompt is not None:
        req.text = args.prompt.encode("utf-8")
    else:
        req.token_ids.ids.extend(int(t) for t in args.prompt_ids.split(","))
    req.sampling.temperature = args.temperature
    req.stop.max_new_tokens = args.max_new_tokens

    servers = [a for a in args.server.split(",") if a]
    for i, server in enumerate(servers):
        with grpc.insecure_channel(server) as channel:
            stub = pb_grpc.GenerationStub(channel)
            ids = []
            got = 0
            try:
                for msg in stub.Generate(req, timeout=60):
                    got += 1
                    ids.extend(msg.token_ids)
                    if msg.text:
                        print(msg.text, end="", flush=True)
                    if msg.HasField("final"):
                        reason = pb.FinishReason.Name(msg.final.finish_reason)
                        print(f"\nids: {ids}\nfinish: {reason}, {msg.final.usage.completion_tokens} tokens, "
                              f"ttft {msg.final.timings.time_to_first_token_seconds * 1e3:.1f} ms")
                return
            except grpc.RpcError as e:
                # Nothing streamed yet from a router that is down: the next one runs it.
                if e.code() == grpc.StatusCode.UNAVAILABLE and got == 0 and i + 1 < len(servers):
                    print(f"router {server} unavailable ({e.details()}); trying {servers[i + 1]}",
                          file=sys.stderr)
                    continue
                where = f" (the stream from router {server} broke after {got} messages)" if got else ""
                sys.exit(f"error: {e.code().name}: {e.details()}{where}")

if __name__ == "__main__":
    main()
