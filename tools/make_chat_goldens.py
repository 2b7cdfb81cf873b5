#!/usr/bin/env python3
"""Chat-format golden fixtures for core/text (run by hand, never in CI).

Renders conversations with GLM-4.5's published chat template (tests/golden/chat/
glm45_chat_template.jinja) exactly as Transformers' apply_chat_template does: through
transformers.utils.chat_template_utils.render_jinja_template (jinja2 sandbox, trim_blocks,
lstrip_blocks, Transformers' tojson). core/text/chat_format.cc renders natively and
tests/core/text/chat_format_test.cc compares byte for byte.

    /tmp/gvenv/bin/pip install -r tools/requirements-goldens.txt
    /tmp/gvenv/bin/python tools/make_chat_goldens.py
Writes tests/golden/chat/conversations.jsonl: one case a line, {"messages", "tools",
"add_generation_prompt", "enable_thinking" (absent: not passed), "rendered"}.
"""
import json
import os
import random

from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "tests", "golden", "chat")

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city. 天气预报。",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "城市名，例如：上海"},
            "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web; quotes \"and\" backslashes \\ and tabs\t.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "top_k": {"type": "integer", "default": 5, "minimum": 1},
            "threshold": {"type": "number", "default": 0.25, "maximum": 1e-05},
            "big": {"type": "number", "default": 1e16}, "ratio": {"type": "number", "default": 100.0},
            "strict": {"type": "boolean", "default": False}, "nothing": None}}}},
    {"name": "bare_tool", "description": "A tool without the function wrapper 😀", "parameters": {}},
]

TEXTS = ["Hello", "What's the weather in 北京 today?", "", "  padded with spaces  ",
         "\n\nleading newlines\n", "ends with /nothink", "multi\nline\n\ntext", "emoji 👨‍👩‍👧 ok",
         "\u3000full-width space\u3000", "\x1ccontrol separators\x1f", "tabs\tinside\t",
         "<think>not really</think>", "日本語のテキストです。", "code: `int main() { return 0; }`"]

ARGS = [{"city": "北京"}, {"city": "Paris", "unit": "c"},
        {"query": "glm \"4.5\"", "top_k": 3, "threshold": 0.5, "strict": True},
        {"list": [1, 2.5, "x", None, False], "nested": {"a": {"b": [{}]}}}, {},
        {"empty": "", "spaces": "  keep  ", "newline": "a\nb", "unicode": "字😀\u00a0"},
        {"float": 1e-07, "big": 12345678901234567, "neg": -0.0, "e": 2.5e+20}]


def assistant(rng, tool_calls):
    m = {"role": "assistant"}
    r = rng.random()
    if r < 0.25:
        m["content"] = rng.choice(TEXTS)
    elif r < 0.5:
        m["content"] = ("\n<think>\n" + rng.choice(TEXTS) + "\n</think>\n\n" + rng.choice(TEXTS))
    elif r < 0.65:
        m["content"] = rng.choice(TEXTS) + "</think>" + rng.choice(TEXTS) + "</think>tail"
    elif r < 0.85:
        m["content"] = rng.choice(TEXTS)
        m["reasoning_content"] = rng.choice(TEXTS)
    else:
        m["content"] = ""
    if tool_calls:
        calls = []
        for _ in range(rng.randrange(1, 3)):
            call = {"name": rng.choice(["get_weather", "search", "bare_tool"]),
                    "arguments": rng.choice(ARGS)}
            calls.append({"type": "function", "function": call} if rng.random() < 0.7 else call)
        m["tool_calls"] = calls
    return m


def conversation(rng):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": rng.choice(TEXTS + ["You are a helpful assistant."])})
    for _ in range(rng.randrange(1, 5)):
        r = rng.random()
        if r < 0.45:
            msgs.append({"role": "user", "content": rng.choice(TEXTS)})
        elif r < 0.8:
            msgs.append(assistant(rng, tool_calls=rng.random() < 0.4))
        else:
            for _ in range(rng.randrange(1, 3)):
                msgs.append({"role": "tool", "content": rng.choice(TEXTS + ['{"temp": 21}'])})
    return msgs


def main():
    rng = random.Random(45)
    with open(os.path.join(GOLDEN, "glm45_chat_template.jinja")) as f:
        template = f.read()
    cases = [
        ({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True}),
        ({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True,
          "enable_thinking": False}),
        ({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True,
          "enable_thinking": True}),
        ({"messages": [], "add_generation_prompt": True}),
        ({"messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS,
          "add_generation_prompt": True}),
    ]
    for k in range(80):
        case = {"messages": conversation(rng), "add_generation_prompt": rng.random() < 0.7}
        if rng.random() < 0.4:
            case["tools"] = rng.sample(TOOLS, rng.randrange(1, len(TOOLS) + 1))
        r = rng.random()
        if r < 0.35:
            case["enable_thinking"] = False
        elif r < 0.6:
            case["enable_thinking"] = True
        cases.append(case)
    with open(os.path.join(GOLDEN, "conversations.jsonl"), "w", encoding="utf-8") as f:
        for case in cases:
            kwargs = {}
            if "enable_thinking" in case:
                kwargs["enable_thinking"] = case["enable_thinking"]
            out = render_jinja_template(conversations=[case["messages"]], tools=case.get("tools"),
                                        chat_template=template,
                                        add_generation_prompt=case["add_generation_prompt"],
                                        **kwargs)
            rendered = out[0][0] if isinstance(out, tuple) else out[0]
            rec = dict(case)
            rec["tools"] = case.get("tools")
            rec["rendered"] = rendered
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"{len(cases)} conversations")


if __name__ == "__main__":
    main()
