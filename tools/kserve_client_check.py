#!/usr/bin/env python3
"""Drives glm-server's KServe v2 gRPC service with Triton's official client (tritonclient).

Dev-time check, run by hand (not by CI: PyPI is not available there) against a running server:
    python3 -m venv V && V/bin/pip install 'tritonclient[grpc]'
    build/server/glm-server &
    V/bin/python tools/kserve_client_check.py --url=127.0.0.1:50051
Prints every answer; exits 1 at the first one that breaks what docs/api_kserve.md promises.
Its output is recorded in docs/api_kserve.md.
"""
import argparse
import sys

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


def check(condition, what):
    print(("ok    " if condition else "FAIL  ") + what)
    if not condition:
        sys.exit(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", default="127.0.0.1:50051")
    p.add_argument("--token", default="", help="a token of --auth_token_file, if any")
    args = p.parse_args()
    headers = {"authorization": f"Bearer {args.token}"} if args.token else None
    c = grpcclient.InferenceServerClient(url=args.url)

    check(c.is_server_live(), "ServerLive")
    check(c.is_server_ready(), "ServerReady")
    meta = c.get_server_metadata(headers=headers)
    check(meta.name == "glmserve", f"ServerMetadata: {meta.name} {meta.version}")
    # The model's name is what glm-server serves (--model); ask the metadata of a wrong one
    # to learn it from the error, as a client without configuration would.
    try:
        c.get_model_metadata("no-such-model", headers=headers)
        check(False, "unknown model refused")
    except InferenceServerException as e:
        check(e.status() == "StatusCode.NOT_FOUND", f"unknown model -> {e.status()}: {e.message()}")
        model = e.message().split("serves '")[1].rstrip("'")
    check(c.is_model_ready(model, headers=headers), f"ModelReady {model!r}")
    mm = c.get_model_metadata(model, headers=headers)
    print("      inputs:", [(t.name, t.datatype, list(t.shape)) for t in mm.inputs])
    print("      outputs:", [(t.name, t.datatype, list(t.shape)) for t in mm.outputs])
    hidden = next(t for t in mm.outputs if t.name == "hidden_states").shape[1]

    ids = np.array([[151331, 151333, 9703, 11]], dtype=np.int32)
    inp = grpcclient.InferInput("input_ids", list(ids.shape), "INT32")
    inp.set_data_from_numpy(ids)
    out = [grpcclient.InferRequestedOutput("logits")]
    r = c.infer(model, [inp], outputs=out, request_id="kserve-check-1", headers=headers)
    logits = r.as_numpy("logits")
    check(logits.shape[:2] == (1, 4) and np.isfinite(logits).all(),
          f"ModelInfer input_ids INT32 -> logits {logits.shape} {logits.dtype}, "
          f"argmax of the last row {int(logits[0, -1].argmax())}")

    # The same through two spans: hidden states after layer 1 go back in as an FP32 input.
    r1 = c.infer(model, [inp], outputs=[grpcclient.InferRequestedOutput("hidden_states")],
                 parameters={"layer_end": 1}, headers=headers)
    h = r1.as_numpy("hidden_states")
    check(h.shape == (1, 4, hidden), f"layer_end=1 -> hidden_states {h.shape}")
    hin = grpcclient.InferInput("hidden_states", list(h.shape), "FP32")
    hin.set_data_from_numpy(h)
    r2 = c.infer(model, [hin], outputs=out, parameters={"layer_begin": 1}, headers=headers)
    check(np.array_equal(r2.as_numpy("logits"), logits),
          "layer_begin=1 on those hidden states -> the same logits, bit for bit")

    ids64 = ids.astype(np.int64)
    inp64 = grpcclient.InferInput("input_ids", list(ids64.shape), "INT64")
    inp64.set_data_from_numpy(ids64)
    r3 = c.infer(model, [inp64], outputs=out, parameters={"last_position_only": True},
                 headers=headers)
    check(np.array_equal(r3.as_numpy("logits")[0, 0], logits[0, -1]),
          "INT64 ids, last_position_only -> the last row")

    bad = grpcclient.InferInput("input_ids", [2, 4], "INT32")
    bad.set_data_from_numpy(np.zeros((2, 4), dtype=np.int32))
    try:
        c.infer(model, [bad], headers=headers)
        check(False, "batch 2 refused")
    except InferenceServerException as e:
        check(e.status() == "StatusCode.INVALID_ARGUMENT", f"batch of 2 -> {e.message()[:70]}...")
    print("all checks passed")


if __name__ == "__main__":
    main()
