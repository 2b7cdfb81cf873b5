#!/usr/bin/env python3
"""Drives glm-server's OpenAI-compatible endpoint with the official `openai` Python SDK.

Dev-time check, run by hand (not by CI: PyPI is not available there) against a running server:
    python3 -m venv V && V/bin/pip install openai
    build/server/glm-server --http_port=8000 &
    V/bin/python tools/openai_sdk_check.py --base_url=http://127.0.0.1:8000/v1
Every call prints what it got; the script exits 1 at the first answer that breaks what
docs/api_openai.md promises. Its output is recorded in docs/api_openai.md.
"""
import argparse
import sys

import openai


def check(condition, what):
    print(("ok    " if condition else "FAIL  ") + what)
    if not condition:
        sys.exit(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base_url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--api_key", default="none", help="a token of --auth_token_file, if any")
    args = p.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0)
    print("openai", openai.__version__)

    models = client.models.list()
    model = models.data[0].id
    check(len(models.data) == 1, f"models.list -> {model!r}")
    check(client.models.retrieve(model).id == model, f"models.retrieve({model!r})")
    try:
        client.models.retrieve("no-such-model")
        check(False, "unknown model id refused")
    except openai.NotFoundError as e:
        check(e.status_code == 404, "models.retrieve('no-such-model') -> 404")

    c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=12,
                                  temperature=0, logprobs=2)
    print("      text:", repr(c.choices[0].text))
    check(c.usage.completion_tokens <= 12 and c.choices[0].finish_reason in ("stop", "length"),
          f"completions.create: {c.usage.prompt_tokens} prompt + {c.usage.completion_tokens} "
          f"completion tokens, finish_reason {c.choices[0].finish_reason}")
    check(len(c.choices[0].logprobs.tokens) == c.usage.completion_tokens,
          "completions logprobs: one entry per token, top 2 each")

    pieces = list(client.completions.create(model=model, prompt="The capital of France is",
                                            max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    streamed = "".join(ch.choices[0].text for ch in pieces if ch.choices)
    check(streamed == c.choices[0].text,
          f"completions stream: {len(pieces)} chunks, same text as without streaming")
    check(pieces[-1].usage is not None and pieces[-1].usage.completion_tokens ==
          c.usage.completion_tokens, "completions stream: usage chunk last")

    a = client.completions.create(model=model, prompt="Once", max_tokens=16, temperature=1.0,
                                  seed=7)
    b = client.completions.create(model=model, prompt="Once", max_tokens=16, temperature=1.0,
                                  seed=7)
    check(a.choices[0].text == b.choices[0].text, "seed: the same sample twice")

    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is 2 + 2?"}]
    tools = [{"type": "function", "function": {
        "name": "add", "description": "Adds two numbers",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                        "b": {"type": "number"}}}}}]
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                       temperature=0, tools=tools, tool_choice="auto",
                                       logprobs=True, top_logprobs=2)
    m = r.choices[0].message
    reasoning = getattr(m, "reasoning_content", None)
    print("      content:", repr(m.content), " reasoning_content:", repr(reasoning),
          " tool_calls:", m.tool_calls)
    check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"),
          f"chat.completions.create: finish_reason {r.choices[0].finish_reason}, "
          f"{r.usage.completion_tokens} tokens, {len(r.choices[0].logprobs.content)} logprobs")

    content, reasoning_s = "", ""
    for ch in client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                             temperature=0, tools=tools, stream=True):
        d = ch.choices[0].delta
        content += d.content or ""
        reasoning_s += getattr(d, "reasoning_content", None) or ""
    check(content == (m.content or "") and reasoning_s == (reasoning or ""),
          "chat stream: the same content and reasoning_content as without streaming")

    r = client.chat.completions.create(model=model, messages=messages, max_tokens=8,
                                       temperature=0,
                                       extra_body={"chat_template_kwargs":
                                                   {"enable_thinking": False}})
    check(r.choices[0].message is not None, "chat with enable_thinking false (extra_body)")

    try:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
        check(False, "unknown model refused")
    except openai.NotFoundError as e:
        check(e.status_code == 404, f"unknown model -> 404 {e.body['message']!r}")
    try:
        client.completions.create(model=model, prompt="x", max_tokens=1,
                                  extra_body={"best_of_n": 3})
        check(False, "unknown field refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400, f"unknown field -> 400 {e.body['message'][:60]!r}...")
    try:
        client.completions.create(model=model, prompt="x", max_tokens=1,
                                  stop=[f"s{i}" for i in range(100000)])
        check(False, "10^5 stop strings refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400, f"10^5 stop strings -> 400 {e.body['message']!r}")
    try:
        # A structural limit is the request's fault: 400, which the SDK does not retry (429
        # would be retried).
        client.chat.completions.create(model=model, max_tokens=1,
                                       messages=[{"role": "user", "content": "x"}] * 4097)
        check(False, "4,097 messages refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400, f"4,097 messages -> 400 {e.body['message']!r}")
    print("all checks passed")


if __name__ == "__main__":
    main()
