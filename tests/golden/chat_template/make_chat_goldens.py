#!/usr/bin/python3
"""Renders goldens.json: DeepSeek chat templates rendered by jinja2 as
transformers' apply_chat_template renders them (an immutable sandboxed
environment with trim_blocks and lstrip_blocks, raise_exception, tojson), for
chat_template_test to compare the built-in renderers against.

Templates (the `chat_template` of each checkpoint's tokenizer_config.json,
stored verbatim beside this script):
  deepseek_v3.jinja  deepseek-ai/DeepSeek-V3 (the first release's template)
  deepseek_r1.jinja  deepseek-ai/DeepSeek-R1
  deepseek_v2.jinja  deepseek-ai/DeepSeek-V2-Chat (and V2-Lite-Chat)
  chatml_tools.jinja a ChatML template with tools, macros and tojson, of the shape
                     other families ship (written for these tests)
A rendering that raises (V2's template on a tool-call turn) is recorded as
{"error": TYPE}.

Run: /usr/bin/python3 tests/golden/chat_template/make_chat_goldens.py
(needs python3-jinja2; writes goldens.json beside this script).
With --check-transformers (on a machine with transformers, e.g. the GPU
machine): renders every case through transformers' own
chat_template_utils.render_jinja_template (what apply_chat_template calls)
and compares with goldens.json, case by case; exits 1 on any difference (a
rendering that raises must raise in both).
"""
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
TEMPLATES = {"v3": "deepseek_v3.jinja", "r1": "deepseek_r1.jinja", "v2": "deepseek_v2.jinja",
             "chatml": "chatml_tools.jinja"}


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def call(id_, name, arguments):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}

CASES = [
    {"name": "single_user", "add_generation_prompt": True,
     "messages": [{"role": "user", "content": "Hi"}]},
    {"name": "system_multi_turn", "add_generation_prompt": True,
     "messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello!"},
                  {"role": "user", "content": "2+2?"}]},
    {"name": "two_systems_no_generation_prompt", "add_generation_prompt": False,
     "messages": [{"role": "system", "content": "A"}, {"role": "user", "content": "u"},
                  {"role": "system", "content": "B"}]},
    {"name": "reasoning_in_history", "add_generation_prompt": True,
     "messages": [{"role": "user", "content": "q"},
                  {"role": "assistant", "content": "<think>x</think>y"},
                  {"role": "user", "content": "r"}]},
    {"name": "tool_definitions", "add_generation_prompt": True, "tools": [WEATHER],
     "messages": [{"role": "system", "content": "You can call tools."},
                  {"role": "user", "content": "Weather in Paris?"}]},
    {"name": "tool_round_trip", "add_generation_prompt": True, "tools": [WEATHER],
     "messages": [{"role": "user", "content": "Weather in Paris and Rome?"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      call("call_1", "get_weather", "{\"city\": \"Paris\"}"),
                      call("call_2", "get_weather", "{\"city\": \"Rome\"}")]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "{\"c\": 21}"},
                  {"role": "tool", "tool_call_id": "call_2", "content": "{\"c\": 25}"},
                  {"role": "assistant", "content": "Paris 21, Rome 25."},
                  {"role": "user", "content": "Thanks"}]},
    {"name": "single_tool_call_then_result", "add_generation_prompt": True,
     "messages": [{"role": "user", "content": "Weather in Oslo?"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      call("call_9", "get_weather", "{\"city\":\"Oslo\"}")]},
                  {"role": "tool", "tool_call_id": "call_9", "content": "cold"}]},
    {"name": "two_tool_turns", "add_generation_prompt": False,
     "messages": [{"role": "user", "content": "a"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      call("c1", "f", "{}"), call("c2", "g", "{\"x\":1}")]},
                  {"role": "tool", "content": "1"},
                  {"role": "assistant", "content": "ok"},
                  {"role": "user", "content": "b"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      call("c3", "h", "[]"), call("c4", "f", "{}")]},
                  {"role": "tool", "content": "2"},
                  {"role": "tool", "content": "3"},
                  {"role": "assistant", "content": "done"}]},
    {"name": "content_with_tool_calls", "add_generation_prompt": True,
     "messages": [{"role": "system", "content": "S1"}, {"role": "system", "content": "S2"},
                  {"role": "user", "content": "Weather?"},
                  {"role": "assistant", "content": "<think>t</think>Checking.", "tool_calls": [
                      call("c1", "get_weather", "{\"city\": \"Nice\"}")]},
                  {"role": "tool", "content": "sunny"},
                  {"role": "user", "content": "And?"}]},
]


def main():
    env = environment()
    out = []
    for case in CASES:
        rendered = dict(case)
        for family, path in TEMPLATES.items():
            with open(os.path.join(HERE, path), encoding="utf-8") as f:
                template = env.from_string(f.read())
            # As apply_chat_template calls it: tools and documents None when absent.
            kwargs = {"messages": case["messages"], "tools": case.get("tools"), "documents": None,
                      "add_generation_prompt": case["add_generation_prompt"],
                      "bos_token": BOS, "eos_token": EOS}
            try:
                rendered[family] = template.render(**kwargs)
            except (jinja2.exceptions.TemplateError, TypeError) as e:
                rendered[family] = {"error": type(e).__name__}
        out.append(rendered)
    with open(os.path.join(HERE, "goldens.json"), "w", encoding="utf-8") as f:
        json.dump({"jinja2_version": jinja2.__version__, "cases": out}, f, ensure_ascii=False,
                  indent=1)
        f.write("\n")


def check_transformers():
    import transformers
    from transformers.utils.chat_template_utils import render_jinja_template
    with open(os.path.join(HERE, "goldens.json"), encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    differ = 0
    for case in cases:
        for family, path in TEMPLATES.items():
            with open(os.path.join(HERE, path), encoding="utf-8") as f:
                template = f.read()
            want = case[family]
            try:
                rendered, _ = render_jinja_template(
                    conversations=[case["messages"]], tools=case.get("tools"), documents=None,
                    chat_template=template, add_generation_prompt=case["add_generation_prompt"],
                    bos_token=BOS, eos_token=EOS)
                got = rendered[0]
            except Exception as e:  # compared as "raises" only: the types may differ
                got = {"error": type(e).__name__}
            same = (isinstance(got, dict) and isinstance(want, dict)) or got == want
            differ += not same
            print(f"{'same' if same else 'DIFFERS'}  {case['name']} / {family}")
            if not same:
                print(f"  goldens.json: {want!r}\n  transformers: {got!r}")
    print(f"transformers {transformers.__version__}: {differ} of "
          f"{len(cases) * len(TEMPLATES)} renderings differ from goldens.json")
    return 1 if differ else 0


if __name__ == "__main__":
    if "--check-transformers" in sys.argv[1:]:
        sys.exit(check_transformers())
    main()
