#!/usr/bin/env python3
"""Calls glm-server from Python: info, then a streamed greedy generation.

Stubs come from the installed .proto files with the user's grpcio-tools (see docs/api.md):

    pip install grpcio grpcio-tools
    python -m grpc_tools.protoc -I proto --python_out=gen --grpc_python_out=gen \
        proto/glmserve/v1/glmserve.proto
    PYTHONPATH=gen python docs/python/generate.py --target=127.0.0.1:50051 --prompt=151331,151333,9703

tools/python_example.sh runs exactly this against a real server (a development check; CI has
no PyPI).
"""
import argparse

import grpc
from glmserve.v1 import glmserve_pb2, glmserve_pb2_grpc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="127.0.0.1:50051")
    ap.add_argument("--prompt", default="151331,151333,9703")
    ap.add_argument("--max_new_tokens", type=int, default=16)
    a = ap.parse_args()
    with grpc.insecure_channel(a.target) as channel:
        stub = glmserve_pb2_grpc.GlmServiceStub(channel)
        info = stub.GetModelInfo(glmserve_pb2.GetModelInfoRequest(), timeout=30)
        print(f"model {info.model} on {info.device}, vocab {info.config.vocab_size}")
        request = glmserve_pb2.GenerateRequest(
            prompt_token_ids=[int(t) for t in a.prompt.split(",")],
            stop=glmserve_pb2.StopCriteria(max_new_tokens=a.max_new_tokens, ignore_eos=True),
            request_id="python-example")
        tokens = []
        for response in stub.Generate(request, timeout=300):
            tokens.extend(t.token_id for t in response.tokens)
            if response.HasField("finished"):
                f = response.finished
                print("tokens", " ".join(map(str, tokens)))
                print(f"finished {glmserve_pb2.FinishReason.Name(f.reason)}, "
                      f"{f.generated_tokens} tokens, request {f.request_id}")


if __name__ == "__main__":
    main()
