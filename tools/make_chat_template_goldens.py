#!/usr/bin/env python3
"""Writes tests/data/chat_templates/goldens.json: what Python Jinja2 renders, set up as
Hugging Face transformers renders chat templates (ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and loop controls; raise_exception, strftime_now and
transformers' tojson), for

  * "conversations": each template in tests/data/chat_templates/*.jinja on a few
    conversations, with and without add_generation_prompt;
  * "snippets": small templates exercising one feature each (whitespace control, loops,
    filters, operators, undefined values, ...).

An entry whose rendering raises records "error": true and the message instead of
"expected". Needs only jinja2 (pip install jinja2). Run from anywhere:

    python3 tools/make_chat_template_goldens.py
"""
import datetime
import json
import pathlib

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "chat_templates"

# bos/eos of each model family, as its tokenizer_config.json has them (Qwen2.5 has no bos).
TOKENS = {
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama2-chat": {"bos_token": "<s>", "eos_token": "</s>"},
    "mistral-instruct": {"bos_token": "<s>", "eos_token": "</s>"},
    "qwen2.5": {"eos_token": "<|im_end|>"},
    "smollm2": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
    "gemma3": {"bos_token": "<bos>", "eos_token": "<eos>"},
}

CONVERSATIONS = {
    "system_user_assistant_user": [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3 + 3?"},
    ],
    "user_assistant_user": [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello. How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
    "single_user": [{"role": "user", "content": "Hello"}],
    "whitespace_and_unicode": [
        {"role": "system", "content": "  Be brief.\n"},
        {"role": "user", "content": "\n  Café — naïve? 日本語 \t"},
        {"role": "assistant", "content": " Sure! \n\n"},
        {"role": "user", "content": "{{ not a tag }} {% neither %}"},
    ],
    "roles_not_alternating": [
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"},
    ],
    "empty": [],
}


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' override of Jinja's tojson (which would HTML-escape)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.datetime.now().strftime(format)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source, variables):
    try:
        return {"expected": env.from_string(source).render(**variables)}
    except Exception as e:  # noqa: BLE001 - any failure is a golden "error"
        return {"error": True, "message": f"{type(e).__name__}: {e}"}


# (name, template, variables)
SNIPPETS = [
    # whitespace control, trim_blocks, lstrip_blocks, comments, newlines
    ("ws_minus", "a  {%- if true %} b {% endif -%}  c", {}),
    ("ws_output_minus", "[ {{- ' x ' -}} ]", {}),
    ("ws_lstrip_trim", "  {% if true %}\n  x\n  {% endif %}\n  y", {}),
    ("ws_for_lines", "{% for i in [1, 2] %}\n{{ i }}\n{% endfor %}\nend", {}),
    ("ws_comment", "a {#- comment -#} b|a {# c #}\nb|  {# c #}\nb", {}),
    ("ws_plus", "  {%+ if true %}x{% endif +%}\ny", {}),
    ("ws_output_no_trim", "{{ 'a' }}\n{{ 'b' }}\n", {}),
    ("ws_crlf", "line1\r\nline2\rline3{% if true %}\r\nx{% endif %}", {}),
    ("ws_trailing_newline", "text\n", {}),
    ("ws_two_trailing_newlines", "text\n\n", {}),
    ("ws_lstrip_after_text", "x  {% if true %}y{% endif %}", {}),
    ("ws_lstrip_tabs", "a\n\t \t{% if true %}b{% endif %}", {}),
    ("ws_nested_blocks", "{% for m in ['a', 'b'] %}\n    {% if m == 'a' %}\n        A\n    {% else %}\n        B\n    {% endif %}\n{% endfor %}", {}),
    # loops
    ("loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }} {% endfor %}", {}),
    ("loop_nested", "{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{{ a }}{{ b }},{% endfor %}{{ loop.index }};{% endfor %}", {}),
    ("loop_else", "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}|{% for x in none_list %}{{ x }}{% else %}undef{% endfor %}", {}),
    ("loop_filter", "{% for x in range(10) if x % 3 == 0 %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}", {}),
    ("loop_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("loop_items_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d | items %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("loop_dict_keys", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"x": 1, "y": 2}}),
    ("loop_set_scoping", "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("loop_prev_next", "{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}", {}),
    ("loop_over_messages", "{% for m in messages %}{{ m.role }}:{{ m['content'] }}|{% endfor %}", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}),
    # set and namespace
    ("namespace", "{% set ns = namespace(count=0, found=false) %}{% for x in [1, 2, 3] %}{% set ns.count = ns.count + x %}{% if x == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}", {}),
    ("namespace_new_attr", "{% set ns = namespace() %}{% set ns.a = 'x' %}{{ ns.a }}{{ ns.b is defined }}", {}),
    ("set_block", "{% set greeting %}Hello {{ name }}!{% endset %}[{{ greeting | upper }}]", {"name": "Bob"}),
    ("set_in_if", "{% if true %}{% set x = 5 %}{% endif %}{{ x }}", {}),
    # filters
    ("filter_trim", "[{{ '  a b \n' | trim }}][{{ 'xxaxx' | trim('x') }}]", {}),
    ("filter_length", "{{ 'héllo' | length }} {{ [1, 2, 3] | length }} {{ {'a': 1} | length }} {{ undefined_thing | length }} {{ 'ab' | count }}", {}),
    ("filter_case", "{{ 'hello World' | upper }} {{ 'HeLLo' | lower }} {{ 'hELLO world' | capitalize }} {{ 'hello big world' | title }}", {}),
    ("filter_tojson", "{{ d | tojson }} {{ [1, 'two', none, true, 1.5] | tojson }} {{ 'é\"\\n' | tojson }}", {"d": {"name": "f", "args": {"x": [1, 2], "y": None}}}),
    ("filter_tojson_indent", "{{ d | tojson(indent=2) }}", {"d": {"a": [1, {"b": []}], "c": {}}}),
    ("filter_default", "{{ missing | default('dflt') }} {{ '' | default('e') }} {{ '' | default('e', true) }} {{ none | d('n') }} {{ 0 | default(5, boolean=true) }}", {}),
    ("filter_join", "{{ ['a', 'b', 'c'] | join(', ') }} {{ [1, 2] | join }}", {}),
    ("filter_misc", "{{ [3, 4, 5] | first }} {{ [3, 4, 5] | last }} {{ 'abc' | list }} {{ '42' | int + 1 }} {{ 3.9 | int }} {{ 5 | string ~ 'x' }} {{ 'a-b-c' | replace('-', '+') }}", {}),
    ("filter_chain", "{{ '  Hello  ' | trim | upper | length }}", {}),
    ("filter_precedence", "{{ 'a' + '  b  ' | trim + 'c' }} {{ -3 | string }} {{ [1, 2] | length > 1 }}", {}),
    # tests
    ("tests", "{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ none is none }} {{ x is none }} {{ x is not none }} {{ 'a' is string }} {{ 1 is string }} {{ 1 is number }} {{ 1.5 is number }} {{ d is mapping }} {{ [1] is sequence }} {{ 4 is even }} {{ 4 is odd }} {{ 9 is divisibleby(3) }} {{ true is boolean }} {{ 1 is integer }}", {"x": 1, "d": {}}),
    ("test_precedence", "{{ not x is defined }} {{ x is defined and y is not defined }}", {"x": 1}),
    # operators
    ("arith", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 / 2 }} {{ 8 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1.5 + 1 }} {{ 10 - 2 - 3 }} {{ -(3) }} {{ +4 }}", {}),
    ("floats", "{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 1.5e-5 }} {{ 0.0001 }} {{ 2.5e3 }} {{ 1 / 3 }} {{ 100.0 }} {{ -0.5 }}", {}),
    ("concat", "{{ 'a' ~ 1 ~ none ~ true ~ undefined_thing ~ [1] }}", {}),
    ("string_ops", "{{ 'ab' * 3 }} {{ 2 * 'x' }} {{ [1] + [2] }} {{ [0] * 3 }} {{ 'a' + 'b' }}", {}),
    ("compare", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'abc' < 'abd' }} {{ true == 1 }} {{ none == none }} {{ [1, 2] == [1, 2] }}", {}),
    ("membership", "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in d }} {{ 'z' not in d }} {{ 3 not in [1, 2] }} {{ 'x' in undefined_thing }}", {"d": {"k": 1}}),
    ("logic", "{{ 0 or 'x' }} {{ 1 and 'y' }} {{ '' and 'z' }} {{ none or none }} {{ not 0 }} {{ not not 1 }} {{ true and false or true }}", {}),
    ("ternary", "{{ 'yes' if x else 'no' }} {{ 'yes' if y else 'no' }} [{{ 'only' if y }}] {{ 1 if false else 2 if true else 3 }}", {"x": 1}),
    # literals
    ("escapes", "{{ 'tab\\there\\nnew \\\\ \\' \\\" \\x41 \\u00e9 \\U0001F600 \\d' }}", {}),
    ("adjacent_strings", "{{ 'a' \"b\" 'c' }}", {}),
    ("print_values", "{{ none }} {{ true }} {{ False }} {{ [1, 'a', none, true, 1.5, [2]] }} {{ {'a': 1, 'b': 'x'} }} {{ \"it's\" ~ [\"it's\"] }}", {}),
    ("keywords_case", "{{ True }} {{ TRUE is defined }} {{ None is none }}", {}),
    # indexing and slicing
    ("index", "{{ l[0] }} {{ l[-1] }} {{ d['k'] }} {{ d.k }} {{ l[10] }}|{{ d.missing }}|{{ 'héllo'[1] }} {{ nested.a.b }}", {"l": [1, 2, 3], "d": {"k": "v"}, "nested": {"a": {"b": "deep"}}}),
    ("slices", "{{ l[1:] }} {{ l[:2] }} {{ l[::-1] }} {{ l[-2:] }} {{ l[1:3] }} {{ l[::2] }} {{ l[5:] }} {{ 'héllo'[1:3] }} {{ 'hello'[::-1] }} {{ l[-10:10] }} {{ l[3:0:-1] }}", {"l": [1, 2, 3, 4]}),
    # methods
    ("string_methods", "[{{ '  x  '.strip() }}][{{ '  x  '.lstrip() }}][{{ '  x  '.rstrip() }}][{{ 'xxhixx'.strip('x') }}] {{ 'hello'.startswith('he') }} {{ 'hello'.endswith('lo') }} {{ 'hello'.startswith(('x', 'h')) }} {{ 'Hi'.upper() }} {{ 'Hi'.lower() }} {{ 'a b'.replace(' ', '_') }} {{ ', '.join(['a', 'b']) }} {{ 'hi there'.title() }} {{ 'hI'.capitalize() }}", {}),
    ("split", "{{ ' a  b c '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a b c'.split(' ', 1) }} {{ '<think>x</think>answer'.split('</think>')[-1] }} {{ ''.split() }} {{ ''.split(',') }}", {}),
    ("dict_methods", "{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 0) }} {{ d.keys() | list }} {{ d.values() | list }} {% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}", {"d": {"a": 1, "b": 2}}),
    # undefined values
    ("undefined_prints_empty", "[{{ foo }}][{% if foo %}yes{% else %}no{% endif %}][{{ foo == foo }}][{{ foo | trim }}]", {}),
    ("undefined_attribute_error", "{{ foo.bar }}", {}),
    ("undefined_nested_error", "{{ d.x.y }}", {"d": {}}),
    ("undefined_arith_error", "{{ foo + 1 }}", {}),
    ("undefined_item_error", "{{ foo['x'] }}", {}),
    ("undefined_method_error", "{{ foo.strip() }}", {}),
    # runtime errors
    ("raise_exception", "{% if true %}{{ raise_exception('Bad roles!') }}{% endif %}", {}),
    ("type_error", "{{ 'a' + 1 }}", {}),
    ("zero_division", "{{ 1 / 0 }}", {}),
    ("namespace_set_error", "{% set x = 1 %}{% set x.a = 2 %}", {}),
    # built-in functions
    ("range", "{{ range(3) | list }} {{ range(1, 4) | list }} {{ range(10, 0, -3) | list }}", {}),
    ("strftime_defined", "{{ strftime_now is defined }}", {}),
    ("dict_literal", "{% set d = {'a': 1, 'b': [1, 2]} %}{{ d.a }}{{ d['b'][1] }}{{ d | tojson }}", {}),
]


def main():
    env = make_env()
    conversations = []
    for path in sorted(DATA.glob("*.jinja")):
        name = path.stem
        source = path.read_text(encoding="utf-8")
        for conv_name, messages in CONVERSATIONS.items():
            for gen in (False, True):
                variables = dict(TOKENS[name], messages=messages, add_generation_prompt=gen)
                entry = {"template": name, "conversation": conv_name, "add_generation_prompt": gen}
                entry.update(render(env, source, variables))
                conversations.append(entry)
    snippets = []
    for name, source, variables in SNIPPETS:
        entry = {"name": name, "template": source, "variables": variables}
        entry.update(render(env, source, variables))
        snippets.append(entry)
    out = {
        "generator": f"tools/make_chat_template_goldens.py (jinja2 {jinja2.__version__})",
        "tokens": TOKENS,
        "conversations_messages": CONVERSATIONS,
        "conversations": conversations,
        "snippets": snippets,
    }
    (DATA / "goldens.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(conversations)} conversation and {len(snippets)} snippet goldens to {DATA / 'goldens.json'}")


if __name__ == "__main__":
    main()
