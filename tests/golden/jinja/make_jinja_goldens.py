#!/usr/bin/python3
"""Renders goldens.json: templates that exercise the Jinja subset moesh's
engine implements (common/tokenizer/jinja.h), rendered by jinja2 in the
environment transformers' apply_chat_template makes (an immutable sandbox
with trim_blocks, lstrip_blocks and loop controls; tojson and
raise_exception as transformers defines them), for jinja_test to compare
against. A case whose rendering raises records the error's type instead.

Run: /usr/bin/python3 tests/golden/jinja/make_jinja_goldens.py
(needs python3-jinja2; writes goldens.json beside this script).
"""
import json
import os

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class Generation(jinja2.ext.Extension):
    """transformers' {% generation %} block (its AssistantTracker), rendering its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


MESSAGES = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Weather in Paris?"},
]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
TOOL_TURN = MESSAGES[1:] + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"c\": 21}"},
]

# (name, template, context). The context is JSON (messages, tools, flags).
CASES = [
    # Whitespace: trim_blocks, lstrip_blocks, - and + controls, comments.
    ("text_only", "Hello, world!\n", {}),
    ("trailing_newlines", "a\n\n", {}),
    ("trim_and_lstrip", "a\n  {% if true %}\n  x\n  {% endif %}\nb\n", {}),
    ("dash_controls", "a  {%- if true -%}  x  {%- endif -%}  b {{- ' c ' -}} d", {}),
    ("plus_keeps_space", "a\n  {%+ if true %}x{% endif +%}\nb", {}),
    ("comments", "a {# note #}b\n  {# own line #}\nc{#- strip -#}  d", {}),
    ("raw_block", "{% raw %}{{ not evaluated }}{% endraw %}!", {}),
    ("crlf_source", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n", {}),
    # Expressions.
    ("literals", "{{ 1 }} {{ -2 }} {{ 1.5 }} {{ 1e3 }} {{ 'x' }} {{ \"y\" }} {{ true }} {{ none }} "
     "{{ [1, 'a', none, false, 2.0] }} {{ {'k': 'v', 'n': [1]} }} {{ (1, 2) }}", {}),
    ("arithmetic", "{{ 7 + 2 }} {{ 7 - 9 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} "
     "{{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1.5 * 2 }} {{ 0.1 + 0.2 }} {{ 1 / 3 }}", {}),
    ("strings", "{{ 'a' + 'b' }} {{ 'a' ~ 1 ~ none }} {{ 'ab' * 3 }} {{ 'x' in 'xyz' }} "
     "{{ 'q' not in 'xyz' }} {{ 'it\\'s' }} {{ \"tab\\tnew\\nline\" }} {{ 'é✓' }} {{ '\\u00e9' }}", {}),
    ("comparisons", "{{ 1 < 2 }} {{ 2 <= 1 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ 1 != 2 }} "
     "{{ [1] == [1] }} {{ none == none }} {{ 3 > 2 and 2 > 3 }} {{ 0 or 'x' }} {{ '' and 1 }} "
     "{{ not 0 }} {{ true == 1 }}", {}),
    ("conditional_expr", "{{ 'yes' if flag else 'no' }}{{ 'x' if not flag }}|{{ 1 if 0 else 2 if 0 else 3 }}",
     {"flag": True}),
    ("subscripts_and_slices", "{{ s[0] }}{{ s[-1] }}{{ s[1:3] }}{{ s[::-1] }}{{ s[:-1] }}{{ l[1:] }}"
     "{{ l[::2] }}{{ l[-2] }}{{ l[10] }}|{{ d['a'] }}{{ d.a }}{{ d['zz'] }}{{ s[5:1:-2] }}",
     {"s": "héllo✓", "l": [1, 2, 3, 4], "d": {"a": 1}}),
    ("undefined", "[{{ nothing }}]{{ nothing is defined }}{{ nothing is undefined }}"
     "{{ d.missing is defined }}{{ nothing|default('dflt') }}{{ ''|default('e', true) }}"
     "{{ nothing|length }}{% for x in nothing %}never{% endfor %}", {"d": {}}),
    ("tests", "{{ none is none }}{{ 1 is number }}{{ 1 is integer }}{{ 1.0 is float }}{{ 's' is string }}"
     "{{ {} is mapping }}{{ [] is iterable }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}"
     "{{ 2 is divisibleby(4) }}{{ 'a' is eq 'a' }}{{ 1 is sameas 1 }}{{ true is true }}{{ 'ab' is lower }}"
     "{{ 'AB' is upper }}{{ x is not none }}{{ 5 is gt 3 }}{{ 'a' is in 'cab' }}{{ range is callable }}",
     {"x": 1}),
    # Filters.
    ("filters_text", "{{ '  pad  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'Hello'|upper }}{{ 'Hello'|lower }}"
     "|{{ 'hello world'|title }}|{{ 'hELLO'|capitalize }}|{{ 'a-b-c'|replace('-', '+') }}"
     "|{{ 'aaa'|replace('a', 'b', 2) }}|{{ 'abc'|reverse }}|{{ 'é✓x'|length }}|{{ '<a & b>'|e }}"
     "|{{ 'x'|safe }}|{{ 3|string }}{{ '42'|int + 1 }}{{ 'x'|int }}{{ '2.5'|float }}{{ 2.567|round(1) }}"
     "{{ -3|abs }}{{ 'one two  three'|wordcount }}", {}),
    ("filters_lists", "{{ l|first }}{{ l|last }}{{ l|length }}{{ l|join(', ') }}|{{ l|reverse|list }}"
     "|{{ l|sort }}|{{ l|sort(reverse=true) }}|{{ l|unique|list }}|{{ l|max }}{{ l|min }}{{ l|sum }}"
     "|{{ 'abc'|list }}|{{ words|map('upper')|join }}|{{ l|select('odd')|list }}|{{ l|reject('odd')|list }}",
     {"l": [3, 1, 2, 3], "words": ["a", "b"]}),
    ("filters_attrs", "{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|join('/') }}"
     "|{{ msgs|rejectattr('role', 'eq', 'user')|list|length }}|{{ msgs|map(attribute='role')|unique|list }}"
     "|{{ msgs|selectattr('name')|list|length }}|{{ d|items|list }}|{{ d|dictsort }}"
     "|{{ msgs|sort(attribute='content')|map(attribute='role')|join(',') }}|{{ msgs|join(',', attribute='role') }}",
     {"msgs": MESSAGES, "d": {"b": 2, "a": 1}}),
    ("tojson", "{{ tools|tojson }}\n{{ tools[0]|tojson(indent=2) }}\n{{ {'b': 1, 'a': [1.5, none, true, 'é\\n\"']}|tojson }}"
     "\n{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}\n{{ []|tojson(indent=4) }}{{ 'x'|tojson }}",
     {"tools": TOOLS}),
    ("indent", "{{ 'a\nb\n\nc'|indent }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent(width='> ', blank=true) }}", {}),
    # Methods of str and dict.
    ("str_methods", "{{ '  x  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  x'.lstrip() }}|{{ 'x  '.rstrip() }}"
     "|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}"
     "|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}|{{ 'aB'.upper() }}{{ 'aB'.lower() }}"
     "|{{ 'a.b'.replace('.', '::') }}|{{ 'hello'.find('l') }}{{ 'hello'.count('l') }}|{{ '-'.join(['a', 'b']) }}"
     "|{{ 'x<think>y</think>z'.split('</think>')[-1] }}|{{ 'l1\nl2'.splitlines() }}|{{ 'hi there'.title() }}", {}),
    ("dict_methods", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{{ d.keys()|list }}|{{ d.values()|list }}"
     "|{{ d.get('a') }}{{ d.get('zz') }}{{ d.get('zz', 'dflt') }}|{{ 'a' in d }}{{ 'zz' in d }}", {"d": {"a": 1, "b": [2]}}),
    # Statements.
    ("for_loop_vars", "{% for m in msgs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.length }}"
     "{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %}{{ loop.cycle('x', 'y') }}"
     "{% if not loop.first %}<{{ loop.previtem.role }}{% endif %};{% endfor %}", {"msgs": MESSAGES}),
    ("for_filter_else_break", "{% for m in msgs if m.role == 'user' %}{{ loop.index }}:{{ m.content }}{{ loop.length }};{% endfor %}"
     "|{% for x in [] %}x{% else %}empty{% endfor %}|{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}"
     "{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %}|{% for i in range(1, 10, 3) %}{{ i }}{% endfor %}"
     "|{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}|{% for c in 'hé' %}[{{ c }}]{% endfor %}",
     {"msgs": MESSAGES}),
    ("scoping", "{% set x = 1 %}{% for i in [1, 2, 3] %}{% set x = x + i %}{{ x }},{% endfor %}{{ x }}"
     "|{% set ns = namespace(total=0, seen=[]) %}{% for i in [1, 2, 3] %}{% set ns.total = ns.total + i %}{% endfor %}{{ ns.total }}"
     "|{% if true %}{% set y = 'in-if' %}{% endif %}{{ y }}|{% set a, b = 1, 2 %}{{ a }}{{ b }}"
     "|{% set block %}A{{ x }}B{% endset %}{{ block }}", {}),
    ("if_elif_else", "{% for n in [1, 2, 3, 4] %}{% if n == 1 %}one{% elif n == 2 %}two{% elif n == 3 %}three{% else %}many{% endif %} {% endfor %}", {}),
    ("macros", "{% macro render(m, prefix='> ') %}{{ prefix }}{{ m.role }}: {{ m.content }}{% endmacro %}"
     "{% for m in msgs %}{{ render(m) }}\n{% endfor %}{{ render(msgs[0], prefix='# ') }}|{{ render(msgs[1], '* ') }}",
     {"msgs": MESSAGES}),
    ("namespace_from_dict", "{% set ns = namespace(a=1) %}{% set ns.b = 'x' %}{{ ns.a }}{{ ns.b }}{{ ns.zz is defined }}"
     "{% set d = dict(k=1, j='two') %}{{ d }}", {}),
    ("generation_block", "{% for m in msgs %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
     "{% else %}{{ m.content }}{% endif %}|{% endfor %}", {"msgs": MESSAGES}),
    ("printing_values", "{{ [1, 'two', {'three': 3.0}] }}|{{ {'q': \"it's\"} }}|{{ 1e20 }}|{{ 1.0e-5 }}|{{ 123456789.0 }}"
     "|{{ 1e16 }}|{{ 0.1 }}|{{ -0.0 }}|{{ 10 / 4 }}|{{ [none, true] }}", {}),
    # A chat template of the common shape, with tools.
    ("chat_with_tools",
     "{{- bos_token }}\n"
     "{%- if tools %}\n"
     "{{- '<|system|>\\n' }}{% if messages[0].role == 'system' %}{{ messages[0].content + '\\n\\n' }}{% endif %}"
     "{{- 'Tools:\\n' }}{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
     "{%- elif messages[0].role == 'system' %}\n"
     "{{- '<|system|>\\n' + messages[0].content + '\\n' }}\n"
     "{%- endif %}\n"
     "{%- for message in messages %}\n"
     "    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}\n"
     "        {{- '<|' + message.role + '|>\\n' + message.content + '\\n' }}\n"
     "    {%- elif message.role == 'assistant' %}\n"
     "        {{- '<|assistant|>\\n' }}\n"
     "        {%- if message.content %}{{ message.content }}{% endif %}\n"
     "        {%- if message.tool_calls %}\n"
     "            {%- for tool_call in message.tool_calls %}\n"
     "                {%- if tool_call.function is defined %}{% set tool_call = tool_call.function %}{% endif %}\n"
     "                {{- '<tool_call>' + {'name': tool_call.name, 'arguments': tool_call.arguments}|tojson + '</tool_call>' }}\n"
     "            {%- endfor %}\n"
     "        {%- endif %}\n"
     "        {{- eos_token + '\\n' }}\n"
     "    {%- elif message.role == 'tool' %}\n"
     "        {%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|tool|>' }}{% endif %}\n"
     "        {{- '\\n<tool_response>' + message.content + '</tool_response>' }}\n"
     "        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '\\n' }}{% endif %}\n"
     "    {%- endif %}\n"
     "{%- endfor %}\n"
     "{%- if add_generation_prompt %}\n"
     "    {{- '<|assistant|>\\n' }}\n"
     "{%- endif %}\n",
     {"messages": TOOL_TURN, "tools": TOOLS, "bos_token": "<s>", "eos_token": "</s>",
      "add_generation_prompt": True}),
    ("chat_roles_checked",
     "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
     "{{ '[' + message['role'] + '] ' + message['content'] | trim }}\n{% endfor %}",
     {"messages": MESSAGES[1:]}),
    # Errors: jinja2 raises, the engine answers a Status.
    ("error_raise_exception", "{{ raise_exception('Only user and assistant roles are supported!') }}", {}),
    ("error_undefined_attribute", "{{ nothing.attr }}", {}),
    ("error_concat_int", "{{ 'a' + 1 }}", {}),
    ("error_unknown_filter", "{{ 1|no_such_filter }}", {}),
    ("error_list_append", "{% set l = [1] %}{{ l.append(2) }}", {}),
    ("error_syntax", "{% if true %}never closed", {}),
    ("error_unknown_tag", "{% frobnicate %}", {}),
    ("error_set_attr_non_namespace", "{% set d = {} %}{% set d.x = 1 %}", {}),
]


def main():
    env = environment()
    out = []
    for name, template, context in CASES:
        case = {"name": name, "template": template, "context": context}
        try:
            case["output"] = env.from_string(template).render(**context)
        except jinja2.exceptions.TemplateError as e:
            case["error"] = type(e).__name__
            case["message"] = str(e)
        except (TypeError, ValueError, OverflowError) as e:
            case["error"] = type(e).__name__
            case["message"] = str(e)
        out.append(case)
    with open(os.path.join(HERE, "goldens.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
