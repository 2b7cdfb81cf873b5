#!/usr/bin/env python3
"""Write the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/), run by hand.

Seeds are small valid inputs (and a few near misses) from which libFuzzer mutates; they are
also replayed under ctest in every build. Needs grpcio-tools from PyPI for the protobuf
seeds (dev-time only; CI never runs this):

    /tmp/gvenv/bin/pip install grpcio-tools
    /tmp/gvenv/bin/python tools/make_fuzz_corpus.py
"""

import glob
import importlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(REPO, "tests", "fuzz", "corpus")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors_image(tensors, pad_to=8, extra=b""):
    """tensors: [(name, dtype, shape, bytes)] laid out contiguously."""
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((pad_to - len(h) % pad_to) % pad_to)
    return struct.pack("<Q", len(h)) + h + data + extra


def safetensors_seeds():
    f32 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.0)
    bf16 = struct.pack("<4H", 0x3F80, 0xC000, 0x3F00, 0x4040)
    write("safetensors_header", "two_tensors", safetensors_image(
        [("a", "F32", [2, 2], f32), ("b", "BF16", [4], bf16)]))
    write("safetensors_header", "empty_and_scalar", safetensors_image(
        [("e", "F32", [0, 3], b""), ("s", "F16", [], b"\x00\x3c")]))
    write("safetensors_header", "trailing_byte", safetensors_image(
        [("a", "F32", [4], f32)], extra=b"\x00"))
    write("safetensors_header", "header_only", safetensors_image([]))
    for path in sorted(glob.glob(os.path.join(REPO, "tests/golden/*/model.safetensors"))):
        # The golden checkpoints' headers with their data cut to the first tensor keep
        # real tensor names and shapes in a small seed.
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = f.read(n)
        write("safetensors_header", "golden_header_" + path.split("/")[-2],
              struct.pack("<Q", n) + header)
        break


def config_seeds():
    for path in sorted(glob.glob(os.path.join(REPO, "tests/golden/*/config.json"))):
        with open(path) as f:
            write("config_json", path.split("/")[-2], f.read())
    write("config_json", "minimal", json.dumps({
        "model_type": "glm4_moe", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
        "intermediate_size": 48, "moe_intermediate_size": 8, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "first_k_dense_replace": 1}))
    write("config_json", "wrong_types", '{"hidden_size": "64", "num_hidden_layers": -1}')


def index_seeds():
    for path in sorted(glob.glob(os.path.join(REPO, "tests/golden/*/model.safetensors.index.json"))):
        with open(path) as f:
            write("shard_index", path.split("/")[-2], f.read())
    write("shard_index", "traversal", json.dumps(
        {"metadata": {}, "weight_map": {"a": "../etc/passwd", "b": "model-1.safetensors"}}))
    write("shard_index", "small", json.dumps(
        {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                        "lm_head.weight": "model-00002-of-00002.safetensors"}}))


def proto_module():
    out = tempfile.mkdtemp()
    subprocess.check_call([sys.executable, "-m", "grpc_tools.protoc",
                           "-I", os.path.join(REPO, "proto"), "--python_out", out,
                           os.path.join(REPO, "proto/glmserve/v1/glmserve.proto")])
    sys.path.insert(0, out)
    return importlib.import_module("glmserve.v1.glmserve_pb2"), out


def proto_seeds():
    pb, out = proto_module()
    try:
        t = pb.Tensor(dtype=pb.DATA_TYPE_FP32, shape=[2, 2], raw_data=struct.pack("<4f", 1, 2, 3, 4))
        write("tensor_codec", "fp32", t.SerializeToString())
        t = pb.Tensor(dtype=pb.DATA_TYPE_BF16, shape=[3], raw_data=struct.pack("<3H", 0x3F80, 0x0001, 0x8000))
        write("tensor_codec", "bf16_subnormal_negzero", t.SerializeToString())
        t = pb.Tensor(dtype=pb.DATA_TYPE_FP16, shape=[2, 1], raw_data=struct.pack("<2H", 0x3C00, 0x0001))
        write("tensor_codec", "fp16_subnormal", t.SerializeToString())
        t = pb.Tensor(dtype=pb.DATA_TYPE_FP32, shape=[1], raw_data=struct.pack("<f", float("nan")))
        write("tensor_codec", "nan", t.SerializeToString())

        g = pb.GenerateRequest(prompt_token_ids=[1, 2, 3])
        g.stop.max_new_tokens = 8
        g.sampling.temperature = 0.7
        g.sampling.top_p = 0.9
        g.sampling.seed = 5
        g.logprobs.enabled = True
        g.logprobs.top_logprobs = 3
        write("request_convert", "generate", b"\x01" + g.SerializeToString())
        g2 = pb.GenerateRequest(prompt_token_ids=[300])
        write("request_convert", "generate_bad_id", b"\x01" + g2.SerializeToString())
        g3 = pb.GenerateRequest(tools_json=['{"type": "function", "function": {"name": "get_weather"}}'],
                                enable_thinking=False, tool_choice_function="get_weather")
        g3.messages.add(role="user", content="Weather in Paris?")
        write("request_convert", "generate_tool_choice", b"\x01" + g3.SerializeToString())
        # Invalid UTF-8 in `string` fields, hand-encoded (protobuf will not serialize it):
        # stop {stop_strings: "\xc3"} (field 3 holding field 4), prompt_text (field 6)
        # "ok \xff\xfe". The server's wire walk (server/wire_utf8.h) must refuse it naming the
        # field, not crash what reads it later.
        write("request_convert", "generate_bad_utf8",
              b"\x01" + b"\x1a\x03\x22\x01\xc3" + b"\x32\x05ok \xff\xfe")
        # The wire walk's edges: a bad tool call in the second message, unknown groups nested
        # to the bound and past it, a length past the end inside a message.
        write("request_convert", "walk_tool_call_bad_utf8",
              b"\x01" + b"\x3a\x03\x12\x01x" + b"\x3a\x08\x22\x06\x12\x04\xed\xa0\x80!")
        write("request_convert", "walk_groups_100", b"\x01" + b"\xd3\x05" * 100 + b"\xd4\x05" * 100)
        write("request_convert", "walk_groups_101", b"\x01" + b"\xd3\x05" * 101 + b"\xd4\x05" * 101)
        write("request_convert", "walk_truncated", b"\x01" + b"\x3a\x04\x12\x09ab")
        f = pb.ForwardRequest()
        f.token_ids.ids.extend([4, 5, 6])
        f.return_hidden_states = True
        f.return_logits = True
        f.last_position_only = True
        f.session_id = "s1"
        f.create_session = True
        write("request_convert", "forward_tokens", b"\x00" + f.SerializeToString())
        f = pb.ForwardRequest()
        f.hidden_states.dtype = pb.DATA_TYPE_FP32
        f.hidden_states.shape.extend([1, 64])
        f.hidden_states.raw_data = struct.pack("<64f", *([0.25] * 64))
        f.layer_begin = 1
        f.return_hidden_states = True
        write("request_convert", "forward_hidden", b"\x00" + f.SerializeToString())
    finally:
        shutil.rmtree(out)


def text_seeds():
    """core/text: plain multilingual text, a GLM reply with reasoning and a tool call, a chat
    prompt with added tokens, invalid UTF-8, and JSON (tests/fuzz/text_fuzz.cc)."""
    write("text", "plain", "Hello, world! 你好 😀\n\n  x")
    write("text", "reply", '<think>plan</think>ok<tool_call>f<arg_key>a</arg_key>'
                           '<arg_value>[1, {"b": 2}]</arg_value></tool_call>')
    write("text", "chat", "[gMASK]<sop><|user|>\nhi<|assistant|>")
    write("text", "invalid", b"bad \xff\xfe utf8 \xe2\x82")
    write("text", "json", '{"a": [1, 2.5e-7, "x"], "b": null}')


def main():
    if os.path.isdir(CORPUS):
        shutil.rmtree(CORPUS)
    safetensors_seeds()
    config_seeds()
    index_seeds()
    proto_seeds()
    text_seeds()
    for d in sorted(os.listdir(CORPUS)):
        print(d, len(os.listdir(os.path.join(CORPUS, d))), "seeds")


if __name__ == "__main__":
    main()
