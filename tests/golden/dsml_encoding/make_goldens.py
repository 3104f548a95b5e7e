#!/usr/bin/python3
"""Checks (or writes) the DeepSeek-V3.2 / V4 prompt goldens of this folder against
DeepSeek's own prompt encoders, run as an oracle.

Each case of cases.json is turned into the message list a server hands the encoder
the way SGLang's OpenAI chat path does (serving_chat.py, dsv32/dsv4 branch):
  - a null `content` becomes "";
  - an empty system message is inserted when the conversation does not open with one;
  - the request's `tools` (OpenAI format) are attached to that first message;
  - thinking_mode is "thinking" when the case asks for thinking, else "chat";
  - V4 only: reasoning_effort is passed when it is "max" or "high", else None.
Tool calls keep their OpenAI wire form (`function.arguments` a JSON string), which is
what DeepSeek's encoders take, and tools are passed as cases.json spells them.
Then `encode_messages(messages, thinking_mode[, reasoning_effort])` of the case's
dialect renders the prompt.

The encoders are not part of this repository. --encoders names a folder holding
encoding_dsv32.py and encoding_dsv4.py (DeepSeek's `encoding/` files, or the copies
SGLang vendors in python/sglang/srt/entrypoints/openai/); they import only the
standard library.

Some copies of encoding_dsv32.py (SGLang's, vLLM's) lost the blank lines of
TOOLS_SYSTEM_TEMPLATE; DeepSeek's own test output has them. --restore-v32-blank-lines
puts them back in the loaded module (only when the template has none).

Usage:
  /usr/bin/python3 tests/golden/dsml_encoding/make_goldens.py --encoders DIR
      [--restore-v32-blank-lines] [--write]
Without --write: prints a unified diff for each case whose golden differs and exits 1
if any does. With --write: (re)writes NAME.txt for every case.
"""
import argparse
import copy
import difflib
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MODULES = {"v3.2": "encoding_dsv32", "v4": "encoding_dsv4"}


def load_module(folder, name):
    path = os.path.join(folder, name + ".py")
    if not os.path.isfile(path):
        sys.exit("no %s in %s" % (name + ".py", folder))
    spec = importlib.util.spec_from_file_location("oracle_" + name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def with_blank_lines(template):
    """V3.2's tools template with the blank lines DeepSeek's upstream file has."""
    if "\n\n" in template:
        return template
    out = []
    lines = template.split("\n")
    for line in lines:
        out.append(line)
        if (line == "## Tools" or line.startswith("String and scalar parameters")
                or line.endswith("Here is an example:")
                or line == "</{dsml_token}function_calls>" or line == "</function_results>"
                or line.endswith("...thinking about results{thinking_end_token}")):
            out.append("")
    return "\n".join(out)


def serving_messages(case):
    """The message list SGLang's chat path hands encode_messages for this case."""
    messages = copy.deepcopy(case["messages"])
    for m in messages:
        if m.get("content") is None:
            m["content"] = ""
    if not messages or messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": ""})
    if case.get("tools"):
        messages[0]["tools"] = copy.deepcopy(case["tools"])
    return messages


def render(encoders, case):
    thinking_mode = "thinking" if case.get("thinking") else "chat"
    messages = serving_messages(case)
    if case["dialect"] == "v4":
        effort = case.get("reasoning_effort")
        return encoders["v4"].encode_messages(
            messages, thinking_mode=thinking_mode,
            reasoning_effort=effort if effort in ("max", "high") else None)
    return encoders["v3.2"].encode_messages(messages, thinking_mode=thinking_mode)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--encoders", required=True,
                        help="folder holding encoding_dsv32.py and encoding_dsv4.py")
    parser.add_argument("--restore-v32-blank-lines", action="store_true",
                        help="give V3.2's TOOLS_SYSTEM_TEMPLATE its upstream blank lines")
    parser.add_argument("--write", action="store_true", help="write NAME.txt files")
    args = parser.parse_args()

    encoders = {d: load_module(args.encoders, m) for d, m in MODULES.items()}
    if args.restore_v32_blank_lines:
        v32 = encoders["v3.2"]
        v32.TOOLS_SYSTEM_TEMPLATE = with_blank_lines(v32.TOOLS_SYSTEM_TEMPLATE)

    with open(os.path.join(HERE, "cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    differing = 0
    for case in cases:
        name = case["name"]
        got = render(encoders, case)
        path = os.path.join(HERE, name + ".txt")
        if args.write:
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(got)
            print("wrote", name + ".txt")
            continue
        want = None
        if os.path.exists(path):
            with open(path, encoding="utf-8", newline="") as f:
                want = f.read()
        if got == want:
            print("match  ", name)
            continue
        differing += 1
        print("DIFFERS", name)
        sys.stdout.writelines(difflib.unified_diff(
            (want or "").splitlines(True), got.splitlines(True),
            fromfile=name + ".txt (golden)", tofile=name + " (encoder)"))
        print()
    if not args.write:
        print("%d of %d cases differ" % (differing, len(cases)))
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
