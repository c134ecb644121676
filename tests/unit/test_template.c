/*
 * test_template.c - the chat-template engine (src/model/template*.c).
 *
 *   golden      every case of $LMS_TESTDATA/templates (13 real templates x 4
 *               conversations), byte-compared with what transformers made
 *   extra       tests/data/templates/expected.json: the same 13 templates on
 *               conversations with tools, tool calls, reasoning, content
 *               parts, assistant-last turns and extra variables, rendered by
 *               jinja2 as transformers configures it
 *   features    small templates, one language feature each (table k_cases;
 *               every expected string was checked against jinja2 3.1)
 *   errors      malformed templates and runtime errors, with line:col
 *   limits      loops, recursion, output, memory and time bounds
 *   fuzz        mutated real templates never crash
 */
#include "testutil.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "model/template.h"

/* Variables of the feature table. */
static const char k_ctx_json[] =
    "{\"xs\": [3, 1, 2], \"d\": {\"b\": 1, \"a\": 2}, \"s\": \"Hello World\","
    " \"u\": \"h\\u00e9llo w\\u00f6rld\", \"f\": 2.5, \"z\": null, \"t\": true, \"e\": \"\","
    " \"people\": [{\"name\": \"Ann\", \"age\": 30}, {\"name\": \"bob\", \"age\": 25},"
    " {\"name\": \"Cid\", \"age\": 35, \"tags\": [\"x\"]}],"
    " \"nested\": {\"a\": {\"b\": [10, 20]}}, \"items\": {\"items\": 1}}";

static const char k_msgs_json[] =
    "[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Hi\"}]";

/* Renders src with k_msgs_json, k_ctx_json, bos "<s>", eos "</s>". */
static int render_ctx(const char *src, const lms_template_limits *lim, char **out, char *err,
                      size_t errsz)
{
    json_t *msgs = json_loads(k_msgs_json, 0, NULL), *ctx = json_loads(k_ctx_json, 0, NULL);
    assert_non_null(msgs);
    assert_non_null(ctx);
    lms_template_vars v = {.messages = msgs, .add_generation_prompt = true, .bos_token = "<s>",
                           .eos_token = "</s>", .extra = ctx, .now_text = "26 Nov 2026",
                           .limits = lim};
    size_t n;
    err[0] = 0;
    int rc = lms_template_render(src, strlen(src), &v, out, &n, err, errsz);
    if (rc == 0)
        assert_int_equal(strlen(*out), n);
    json_decref(msgs);
    json_decref(ctx);
    return rc;
}

typedef struct tcase {
    const char *src;
    const char *want;
} tcase;

/* One line per case (tools/check_template_table.py-style checks read it). */
static const tcase k_cases[] = {
    /* whitespace control, trim_blocks, lstrip_blocks */
    {"a  {%- if true %} b {% endif -%}  c", "a b c"},
    {"a\n  {% if true %}\n  b\n  {% endif %}\nc", "a\n  b\nc"},
    {"a\n  {%+ if true %}\nb{% endif %}", "a\n  b"},
    {"{% if true +%}\nx{% endif %}", "\nx"},
    {"a {{- ' b ' -}} c", "a b c"},
    {"a\n  {{ 'b' }}\nc", "a\n  b\nc"},
    {"a  {#- comment -#}  b", "ab"},
    {"a\n  {# comment #}\nb", "a\nb"},
    {"line\r\nnext\r\n", "line\nnext"},
    {"x\n\n", "x\n"},
    {"{% raw %}{{ not evaluated }}{% endraw %}", "{{ not evaluated }}"},
    {"{{ {'a': {'b': 1}}['a']['b'] }}", "1"},
    /* literals */
    {"{{ 'it\\'s' }}|{{ \"q\\\"q\" }}|{{ 'a\\nb' }}|{{ '\\u00e9\\x41' }}", "it's|q\"q|a\nb|\xc3\xa9" "A"},
    {"{{ 'a' 'b' \"c\" }}", "abc"},
    {"{{ 42 }} {{ 1_000 }} {{ 2.50 }} {{ 1e3 }} {{ -0.0001 }} {{ 1e-05 }} {{ 1e16 }}",
     "42 1000 2.5 1000.0 -0.0001 1e-05 1e+16"},
    {"{{ none }} {{ None }} {{ true }} {{ False }}", "None None True False"},
    {"{{ [1, 'a', none, true] }} {{ (1, 2) }} {{ (1,) }} {{ {'k': 'v'} }}",
     "[1, 'a', None, True] (1, 2) (1,) {'k': 'v'}"},
    {"{{ [\"it's\", 'a\"b', 'x\\ny'] }}", "[\"it's\", 'a\"b', 'x\\ny']"},
    /* operators and precedence */
    {"{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }}",
     "7 9 3 -4 2 -2"},
    {"{{ 1 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ 7.5 % 2 }}",
     "0.5 2.0 1024 0.5 3.0 1.5"},
    {"{{ 'ab' * 3 }} {{ 2 * 'xy' }} {{ [1] * 2 }} {{ [1] + [2] }} {{ 'a' ~ 1 ~ none }}",
     "ababab xyxy [1, 1] [1, 2] a1None"},
    {"{{ 'x' + s|lower + '!' }} {{ xs|length - 1 }} {{ -(xs|length) }}", "xhello world! 2 -3"},
    {"{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 2 == 2.0 }} {{ 'a' != 'b' }} {{ 'b' >= 'a' }}",
     "True False True True True"},
    {"{{ 2 in xs }} {{ 5 not in xs }} {{ 'ell' in s }} {{ 'a' in d }} {{ 'q' in undefined_var }}",
     "True True True True False"},
    {"{{ 0 or 'x' }} {{ 'y' and 0 }} {{ none or [] }} {{ 1 and 2 }} {{ not 0 }} {{ not xs }}",
     "x 0 [] 2 True False"},
    {"{{ 'yes' if t else 'no' }} {{ 'yes' if z else 'no' }} {{ 'a' if false }}|", "yes no |"},
    {"{{ not z is none }} {{ not undefined_var is defined }}", "False True"},
    {"{{ true == 1 }} {{ true + 1 }} {{ (1 == 1) != (2 == 3) }}", "True 2 True"},
    {"{{ '%s-%d' % ('a', 3) }} {{ '%.2f' % f }} {{ '100%%' % () }}", "a-3 2.50 100%"},
    /* truthiness */
    {"{% for v in [0, 1, '', 'a', [], [0], {}, none, 0.0] %}{{ 'T' if v else 'F' }}{% endfor %}",
     "FTFTFTFFF"},
    /* attribute and item access */
    {"{{ d.a }} {{ d['b'] }} {{ nested.a.b[1] }} {{ nested['a']['b'][-1] }} {{ xs.0 }}",
     "2 1 20 20 3"},
    {"{{ items['items'] }} {{ d.missing is defined }} {{ xs[10] is defined }}", "1 False False"},
    {"{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 5) }} {{ d.keys()|list }}",
     "2 None 5 ['b', 'a']"},
    {"{{ d.items()|list }} {{ d.values()|list }}", "[('b', 1), ('a', 2)] [1, 2]"},
    /* slicing */
    {"{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ xs[5:] }} {{ xs[-10:1] }}",
     "[1, 2] [3, 1] [2, 1, 3] [3, 2] [] [3]"},
    {"{{ s[:5] }} {{ s[-5:] }} {{ s[::-1] }} {{ u[1:4] }} {{ u[::-1] }} {{ u[1] }}",
     "Hello World dlroW olleH \xc3\xa9ll dlr\xc3\xb6w oll\xc3\xa9h \xc3\xa9"},
    /* string methods */
    {"{{ s.upper() }} {{ s.lower() }} {{ 'hello wORLD'.title() }} {{ 'hELLO'.capitalize() }}",
     "HELLO WORLD hello world Hello World Hello"},
    {"{{ '  x  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n\\nt\\n'.lstrip('\\n') }}|{{ 'ab  '.rstrip() }}|",
     "x|a|t\n|ab|"},
    {"{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }}",
     "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c']"},
    {"{{ 'a,b,c'.rsplit(',', 1) }} {{ 'x</think>y'.split('</think>')[-1] }}", "['a,b', 'c'] y"},
    {"{{ s.startswith('Hell') }} {{ s.endswith('x') }} {{ s.startswith(('x', 'H')) }}",
     "True False True"},
    {"{{ s.replace('o', '0') }} {{ s.replace('o', '', 1) }} {{ s.find('o') }} {{ s.count('o') }}",
     "Hell0 W0rld Hell World 4 2"},
    {"{{ '-'.join(['a', 'b']) }} {{ '{} and {}'.format(1, 'x') }} {{ '{a}!'.format(a=2) }}",
     "a-b 1 and x 2!"},
    {"{{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ ' '.isspace() }} {{ 'AB'.isupper() }}",
     "True True True True"},
    /* filters */
    {"{{ '  x \\n'|trim }}|{{ 'xax'|trim('x') }}|{{ s|upper }}|{{ s|lower }}|{{ 'ab cd'|title }}|{{ 'aB'|capitalize }}",
     "x|a|HELLO WORLD|hello world|Ab Cd|Ab"},
    {"{{ xs|length }} {{ s|length }} {{ u|length }} {{ d|length }} {{ undefined_var|length }} {{ xs|count }}",
     "3 11 11 2 0 3"},
    {"{{ xs|first }} {{ xs|last }} {{ s|first }} {{ xs|join(', ') }} {{ xs|join }} {{ xs|sum }}",
     "3 2 H 3, 1, 2 312 6"},
    {"{{ xs|sort }} {{ xs|sort(reverse=true) }} {{ ['b', 'A', 'c']|sort }} {{ xs|reverse|list }}",
     "[1, 2, 3] [3, 2, 1] ['A', 'b', 'c'] [2, 1, 3]"},
    {"{{ people|map(attribute='name')|join(',') }} {{ people|sort(attribute='age')|map(attribute='name')|list }}",
     "Ann,bob,Cid ['bob', 'Ann', 'Cid']"},
    {"{{ people|selectattr('age', 'gt', 28)|map(attribute='name')|list }} {{ people|rejectattr('tags')|list|length }}",
     "['Ann', 'Cid'] 2"},
    {"{{ people|selectattr('name', 'equalto', 'bob')|list|length }} {{ xs|select('odd')|list }} {{ xs|reject('odd')|list }}",
     "1 [3, 1] [2]"},
    /* select/reject/map give generators: true even when empty, used up by one pass,
     * none as input gives nothing */
    {"{% if xs|select('gt', 5) %}T{% endif %} {{ z|selectattr('a')|list }}{{ z|map(attribute='a')|list }}{{ undefined_var|reject|list }}",
     "T [][][]"},
    {"{% set g = xs|map('string') %}{{ g|join }}/{{ g|join }}/{{ (xs|select) is sequence }}",
     "312//False"},
    {"{% set g = xs|select %}{{ g|first }}{{ g|list }} {{ 1 in xs|select }} {{ (xs|select) == (xs|select) }}",
     "3[1, 2] True False"},
    {"{{ ('<'|safe + '<&\"' + 2|string) }} {{ '<' + '>'|safe }} {{ ('<'|safe ~ '<') }} {{ '<b>'|escape|escape }}",
     "<&lt;&amp;&#34;2 &lt;> << &lt;b&gt;"},
    {"{% if {}|items %}T{% endif %}{% if []|unique %}U{% endif %}{{ (d|items)[0] }}|{{ xs|reverse|first }}{{ xs|reverse|list }} {{ [1, 2, 3, 4, 5]|slice(3, 0)|list }}",
     "TU|2[2, 1, 3] [[1, 2], [3, 4], [5, 0]]"},
    {"{{ '<'|safe is escaped }} {{ '<' is escaped }} {{ ('a'|safe + '<')|length }} {{ 5|safe + '<' }}",
     "True False 5 5&lt;"},
    {"{% for g in people|groupby('age') %}{{ g.grouper }}:{{ g.list|map(attribute='name')|join }};{% endfor %}",
     "25:bob;30:Ann;35:Cid;"},
    {"{% for k, v in [{'a': 'X'}, {'a': 'y'}, {'a': 'x'}, {}]|groupby('a', default='-') %}{{ k }}{{ v|length }}{% endfor %} {{ [{'a': 'X'}, {'a': 'x'}]|groupby('a', case_sensitive=true)|first }}",
     "-1X2y1 ('X', [{'a': 'X'}])"},
    {"{{ ['a', 'b', 'a', 'A']|unique|list }} {{ xs|min }} {{ xs|max }} {{ people|max(attribute='age')|attr('get') is defined }}",
     "['a', 'b'] 1 3 True"},
    {"{{ undefined_var|default('dflt') }} {{ e|default('dflt') }} {{ e|default('dflt', true) }} {{ z|d('n') }}",
     "dflt  dflt None"},
    {"{{ '3'|int + 1 }} {{ '3.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 2.9|int }} {{ '2.5'|float }} {{ 3|float }}",
     "4 3 0 7 2 2.5 3.0"},
    {"{{ 15|round(-1) }} {{ 25|round(-1) }} {{ -15|round(-1) }} {{ 149|round(-2) }} {{ 7|round(-30) }} {{ 7|round(1) }}",
     "20 20 -20 100 0 7"},
    {"{{ '0b11'|int(0, 0) }} {{ '0x1F'|int(0, 0) }} {{ '0o17'|int(0, 0) }} {{ '017'|int(7, 0) }} {{ '0x1F'|int(0, 16) }} {{ '-0o17'|int(0, 8) }} {{ '--1'|int(4) }}",
     "3 31 15 17 31 -15 4"},
    {"{{ 3|string + 'x' }} {{ none|string }} {{ xs|string }} {{ -3|abs }} {{ 2.567|round(2) }} {{ 2.5|round }}",
     "3x None [3, 1, 2] 3 2.57 2.0"},
    {"{{ s|replace('World', 'There') }} {{ '<a & b>'|escape }} {{ s|wordcount }} {{ 'ab'|center(6) }}|",
     "Hello There &lt;a &amp; b&gt; 2   ab  |"},
    {"{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}", "a\n  b\n\n  c|  a\n  b"},
    {"{{ d|items|list }} {{ d|dictsort }} {{ d|dictsort(by='value', reverse=true) }}",
     "[('b', 1), ('a', 2)] [('a', 2), ('b', 1)] [('a', 2), ('b', 1)]"},
    {"{{ 'abc'|list }} {{ xs|batch(2)|list }} {{ 'hello world foo'|truncate(9, leeway=0) }}",
     "['a', 'b', 'c'] [[3, 1], [2]] hello..."},
    {"{{ xs|map('string')|join('-') }} {{ people|map(attribute='nope', default='?')|join }}",
     "3-1-2 ???"},
    {"{{ '%s=%s'|format('k', 2) }} {{ s|safe }} {{ people[0]|attr('name') is defined }}",
     "k=2 Hello World False"},
    /* printf-style str % args and |format: flags, width, precision, %(name)s */
    {"{{ '%-4d|%03d|%+d|%5.1f|%x|%#x|%#o|%e|%g' % (7, 5, 2, f, 255, 255, 8, 1234.5, 0.00001) }}",
     "7   |005|+2|  2.5|ff|0xff|0o10|1.234500e+03|1e-05"},
    {"{{ '%5s|%-5s|%.2s|%3s|%r' % ('ab', 'ab', s, 'h\\u00e9', 'x') }} {{ '%c%c' % (233, 'z') }}",
     "   ab|ab   |He| h\xc3\xa9|'x' \xc3\xa9z"},
    {"{{ '%(a)s-%(b)03d' % {'a': xs, 'b': 4} }} {{ '%(n)s!'|format(n=s) }} {{ '%s' % d }} {{ 'x' % d }}",
     "[3, 1, 2]-004 Hello World! {'b': 1, 'a': 2} x"},
    {"{{ '%d%%|%i|%d' % (50, t, -2.7) }} {{ '%s' % (z,) }} {{ '%.3s'|format(s) }}", "50%|1|-2 None Hel"},
    /* str methods with start/end windows, partition, padding, affix removal */
    {"{{ s.startswith('W', 6) }} {{ s.startswith('W', -5) }} {{ s.endswith('Hell', 0, 4) }} {{ s.startswith('', 20) }} {{ u.startswith('\u00e9', 1) }}",
     "True True True False True"},
    {"{{ s.find('o', 5) }} {{ s.find('o', 5, 7) }} {{ s.count('l', 3) }} {{ s.rindex('l') }} {{ u.find('l', 3) }} {{ s.find('', 20) }} {{ s.find('o', -4) }}",
     "7 -1 2 9 3 -1 7"},
    {"{{ 'a,b,c'.partition(',') }} {{ 'a,b,c'.rpartition(',') }} {{ 'abc'.partition(',') }} {{ 'abc'.rpartition(',') }}",
     "('a', ',', 'b,c') ('a,b', ',', 'c') ('abc', '', '') ('', '', 'abc')"},
    {"{{ 'x'.zfill(3) }} {{ '-5'.zfill(4) }} {{ 'x'.ljust(3) }}|{{ 'x'.rjust(3, '\u00e9') }} {{ 'ab'.center(5, '*') }} {{ 'abc'.center(6, '-') }}",
     "00x -005 x  |\xc3\xa9\xc3\xa9x **ab* -abc--"},
    {"{{ s.removeprefix('Hello ') }} {{ s.removesuffix('World') }}| {{ s.removeprefix('x') }} {{ '12'.isdecimal() }} {{ '1a'.isnumeric() }}",
     "World Hello | Hello World True False"},
    {"{{ 'a\\tb'.expandtabs(4) }}|{{ 'ab\\tc\\n\\td'.expandtabs() }}|{{ '\\u00e9\\tx'.expandtabs(3) }}|{{ 'a\\tb'.expandtabs(0) }}",
     "a   b|ab      c\n        d|\xc3\xa9  x|ab"},
    {"{{ 'abc'.replace('', '-') }} {{ ''.replace('', '-') }} {{ 'ab'.replace('', '-', 1) }} {{ 'aB1 \\u00e9'.swapcase() }} {{ '<'|safe|forceescape }}",
     "-a-b-c- - -ab Ab1 \xc3\x89 &lt;"},
    /* case over all of Unicode (utf8proc), Python's multi-code-point and final-sigma rules */
    {"{{ '\\u00df \\ufb01 \\u01c6'.upper() }}|{{ '\\u01c6a \\u00f1-x\\u4e00y'.title() }}|{{ '\\u039f\\u0394\\u039f\\u03a3 \\u03a3 \\u03a3\\u0391'.lower() }}|{{ '\\u0130'.lower()|length }}|{{ '\\u0250\\u0434'.upper() }}|{{ 'A\\u03a3\\u00ad'.swapcase() }}",
     "SS FI \xc7\x84|\xc7\x85" "a \xc3\x91-X\xe4\xb8\x80Y|\xce\xbf\xce\xb4\xce\xbf\xcf\x82 \xcf\x83 \xcf\x83\xce\xb1|2|\xe2\xb1\xaf\xd0\x94|a\xcf\x82\xc2\xad"},
    {"{{ '\\u01c5' is upper }} {{ '\\u00aa' is lower }} {{ '\\u2168'.isupper() }} {{ 'a\\u01c5'.islower() }} {{ '\\u0561\\u0562'.islower() }} {{ '\\u00dfa \\u01c6b'|title }}|{{ '\\u01c6X'|capitalize }}|{{ 'A\\u03a3'|title }}",
     "False True True False True SSa \xc7\x84" "b|\xc7\x85x|A\xcf\x83"},
    /* number attributes: float.is_integer(), .real / .imag */
    {"{{ (2.0).is_integer() }} {{ 2.5.is_integer() }} {{ (1e300).is_integer() }} {{ (-0.0).is_integer() }}|{{ 3.real }} {{ 3.imag }} {{ 2.5.real }} {{ 2.5.imag }} {{ true.real }} {{ true.imag }} {{ (-4).real }}|{{ 3.is_integer is defined }} {{ 'a'.real is defined }}",
     "True False True True|3 0 2.5 0.0 1 0 -4|False False"},
    /* striptags, filesizeformat, urlencode (jinja2 3.1.6 / markupsafe 3.0.3) */
    {"{{ '  a <b>bold</b>\\n text <!-- c <x> --> end ' | striptags }}|{{ '<!<!-- x -->-- y -->z<!-- open'|striptags }}|{{ 'a < b > c < d'|striptags }}|{{ '&amp;&lt;&#x41;&#65&nbsp;&ampy &#128; &#1;. &apos; &unknown;'|striptags }}",
     "a bold text end|z<!-- open|a c < d|&<AA\xc2\xa0&y \xe2\x82\xac . ' &unknown;"},
    {"{{ 1|filesizeformat }} {{ 999|filesizeformat }} {{ 1500|filesizeformat }} {{ 1234567890|filesizeformat }} {{ 1e30|filesizeformat }} {{ '2048'|filesizeformat(true) }} {{ -5.7|filesizeformat }}",
     "1 Byte 999 Bytes 1.5 kB 1.2 GB 1000000.0 YB 2.0 KiB -5 Bytes"},
    {"{{ 'a b/c?d=\\u00e9&x~_.-'|urlencode }}|{{ {'a b': 'c/d', 'x': none}|urlencode }}|{{ [('x', 1), ['y', 'z+w'], 'kv']|urlencode }}|{{ 42|urlencode }}|{{ undefined_thing|urlencode }}",
     "a%20b/c%3Fd%3D%C3%A9%26x~_.-|a+b=c%2Fd&x=None|x=1&y=z%2Bw&k=v|42|"},
    /* wordwrap (Python's textwrap: hyphens, em-dashes, long words) */
    {"{{ 'The quick brown fox jumps over the lazy dog'|wordwrap(10) }}|{{ 'a well-known e-mail x--y'|wordwrap(7) }}|{{ 'abcdefghij-klm'|wordwrap(6) }}|{{ 'abcdefghij-klm'|wordwrap(6, false) }}|{{ 'one two\n\nthree'|wordwrap(3, wrapstring='/') }}|{{ 'abc-def ghi'|wordwrap(5, break_on_hyphens=false) }}",
     "The quick\nbrown fox\njumps over\nthe lazy\ndog|a well-\nknown\ne-mail\nx--y|abcdef\nghij-\nklm|abcdefghij-\nklm|one/two//thr/ee|abc-d\nef\nghi"},
    /* tojson (transformers' json.dumps) */
    {"{{ d|tojson }} {{ xs|tojson }} {{ 'h\\u00e9 \"q\" <&>\\n'|tojson }} {{ [none, true, 1.5]|tojson }}",
     "{\"b\": 1, \"a\": 2} [3, 1, 2] \"h\xc3\xa9 \\\"q\\\" <&>\\n\" [null, true, 1.5]"},
    {"{{ nested|tojson(indent=2) }}", "{\n  \"a\": {\n    \"b\": [\n      10,\n      20\n    ]\n  }\n}"},
    {"{{ {'b': [], 'a': {}}|tojson(indent=4) }} {{ d|tojson(sort_keys=true) }}",
     "{\n    \"b\": [],\n    \"a\": {}\n} {\"a\": 2, \"b\": 1}"},
    {"{{ d|tojson(separators=(',', ':')) }} {{ 'h\\u00e9'|tojson(ensure_ascii=true) }}",
     "{\"b\":1,\"a\":2} \"h\\u00e9\""},
    {"{{ 1e16|tojson }} {{ 0.1|tojson }} {{ 100.0|tojson }}", "1e+16 0.1 100.0"},
    {"{{ {'a': [1]}|tojson(indent='->') }}|{{ xs|tojson(indent=-2) }}|{{ [1]|tojson(indent=true) }}",
     "{\n->\"a\": [\n->->1\n->]\n}|[\n3,\n1,\n2\n]|[\n 1\n]"},
    /* tests */
    {"{{ xs is iterable }} {{ d is mapping }} {{ s is string }} {{ 1 is number }} {{ z is none }} {{ f is float }}",
     "True True True True True True"},
    {"{{ xs is sequence }} {{ d is sequence }} {{ 1 is sequence }} {{ undefined_var is iterable }}",
     "True True False True"},
    {"{{ t is true }} {{ 0 is false }} {{ false is false }} {{ t is boolean }} {{ 3 is integer }} {{ t is integer }}",
     "True False True True True False"},
    {"{{ '' is lower }} {{ '12' is lower }} {{ 'a1' is lower }} {{ 'A1' is upper }} {{ 'Ab' is upper }}",
     "False False True True False"},
    {"{{ (1, 2) + (3,) }} {{ (1,) * 2 }} {{ [1] * 2 }} {{ [1] + [2] }}", "(1, 2, 3) (1, 1) [1, 1] [1, 2]"},
    {"{{ (1, 2) == [1, 2] }} {{ (1, 2) == (1, 2) }} {{ [1, 2] in [(1, 2)] }} {{ d.items()|list == [('b', 1), ('a', 2)] }}",
     "False True False True"},
    {"{{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 2 is in xs }} {{ 'a' is lower }}",
     "True True True True True"},
    {"{{ 3 is eq 3 }} {{ 3 is ne 3 }} {{ 3 is gt 2 }} {{ 3 is lt(2) }} {{ 3 is ge 3 }} {{ s is not defined }}",
     "True False True False True False"},
    {"{{ d.get is callable }} {{ 'length' is filter }} {{ 'odd' is test }} {{ xs is sameas xs }}",
     "True True True True"},
    /* loops */
    {"{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
     "103TrueFalse3;212FalseFalse3;321FalseTrue3;"},
    {"{% for x in xs %}{{ loop.previtem }}|{{ loop.nextitem }};{% endfor %}", "|1;3|2;1|;"},
    {"{% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}", "3222"},
    {"{% for x in [] %}x{% else %}empty{% endfor %}", "empty"},
    {"{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}", "b=1,a=2,"},
    {"{% for k in d %}{{ k }}{% endfor %} {% for c in 'h\\u00e9' %}[{{ c }}]{% endfor %}",
     "ba [h][\xc3\xa9]"},
    {"{% for x in xs %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
     "3"},
    {"{% for x in xs %}{{ loop.cycle('a', 'b') }}{% endfor %}", "aba"},
    {"{% for a in [1, 2] %}{% for b in [3] %}{{ loop.depth }}{{ a }}{{ b }}{% endfor %}{% endfor %}",
     "113123"},
    {"{% for x in [1, [2, [3]]] recursive %}{% if x is iterable %}[{{ loop(x) }}]{% else %}{{ x }}{{ loop.depth }}{{ loop.depth0 }}{% endif %}{% endfor %}",
     "110[221[332]]"},
    {"{% set v = 9 %}{% for x in [[2], [], [1]] if x != [1] recursive %}{% set v = x %}({% if x is iterable %}{{ loop(x) }}{% endif %}){{ v }}{% else %}E{% endfor %}{{ v }}",
     "(()2)[2](E)[]9"},
    {"{% for x in range(3) %}{{ x }}{% endfor %}{% for x in range(1, 7, 2) %}{{ x }}{% endfor %}",
     "012135"},
    {"{% for x in undefined_var %}x{% endfor %}ok", "ok"},
    {"{{ [undefined_var, 1] }} {{ {'a': d.nope} }} {{ '%r' % undefined_var }}", "[Undefined, 1] {'a': Undefined} Undefined"},
    /* scoping */
    {"{% set x = 0 %}{% for i in xs %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}", "0301020"},
    {"{% set ns = namespace(x=0) %}{% for i in xs %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}",
     "6"},
    {"{% set ns = namespace() %}{% set ns.a = 'A' %}{{ ns.a }}{{ ns.b is defined }}", "AFalse"},
    {"{% if true %}{% set y = 5 %}{% endif %}{{ y }}", "5"},
    {"{% set a, b = 1, 2 %}{{ b }}{{ a }} {% set messages = messages[1:] %}{{ messages|length }}",
     "21 1"},
    {"{% with a = 1 %}{{ a }}{% endwith %}{{ a is defined }}", "1False"},
    {"{% set ns = namespace() %}{% set ns.a, b = 1, 2 %}{{ ns.a }}{{ b }} {% set (p, q), r = [3, 4], 5 %}{{ p }}{{ q }}{{ r }} {% set (v,) = [6] %}{{ v }}",
     "12 345 6"},
    {"{% for a, (b, c) in [[1, [2, 3]], [4, 'xy']] %}{{ a }}{{ b }}{{ c }};{% endfor %}", "123;4xy;"},
    {"{% set t %}[{{ 1 + 1 }}]{% endset %}{{ t }}{% set u2 | upper %}x{% endset %}{{ u2 }}",
     "[2]X"},
    {"{% filter upper %}abc{{ 'd' }}{% endfilter %}", "ABCD"},
    /* macros */
    {"{% macro m(a, b=2, c='x') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 3) }}|{{ m(1, c='y') }}",
     "12x|13x|12y"},
    {"{% macro m(a) %}{{ a is defined }}{% endmacro %}{{ m() }}", "False"},
    /* a body that reads varargs / kwargs takes extra arguments there */
    {"{% macro m(a, b=2) %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1) }} {{ m(1, 3, 4, 5) }} {{ m(0, x=6, b=7) }}",
     "12(){} 13(4, 5){} 07(){'x': 6}"},
    {"{% macro m() %}{% for k, v in kwargs.items() %}{{ k }}={{ v }};{% endfor %}{{ varargs is defined }}{% endmacro %}{{ m(p=1, q=2) }}",
     "p=1;q=2;True"},
    {"{% set g = 'G' %}{% macro m() %}{{ g }}{{ bos_token }}{% endmacro %}{{ m() }}", "G<s>"},
    {"{% macro m() %}  x  {% endmacro %}[{{ m()|trim }}]", "[x]"},
    {"{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}",
     "321"},
    {"{% set ns = namespace(v=0) %}{% macro inc() %}{% set ns.v = ns.v + 1 %}{% endmacro %}{{ inc() }}{{ inc() }}{{ ns.v }}",
     "2"},
    {"{% macro m() %}{% set x = 1 %}{{ x }}{% endmacro %}{{ m() }}{{ x is defined }}", "1False"},
    /* {% call %}: the body is the macro's caller(), with parameters if given */
    {"{% macro m(a) %}[{{ caller() }}{{ a }}]{% endmacro %}{% call m(1) %}body{{ s[0] }}{% endcall %}",
     "[bodyH1]"},
    {"{% macro each(items) %}{% for i in items %}<{{ caller(i) }}>{% endfor %}{% endmacro %}{% call(x) each(xs) %}{{ x * 2 }}{% endcall %}",
     "<6><2><4>"},
    {"{% macro m(a, b=2) %}{{ a }}{{ b }}{{ caller()|upper }}{{ kwargs }}{% endmacro %}\n  {% call m(1, z=3) %}\n  c\n  {% endcall %}\nend",
     "12  C\n{'z': 3}end"},
    /* globals */
    {"{{ strftime_now('%Y') }} {{ strftime_now is defined }} {{ range(3)|list }}",
     "26 Nov 2026 True [0, 1, 2]"},
    {"{{ dict(a=1) }} {{ namespace(a=1).a }} {{ messages[0].role }} {{ add_generation_prompt }}",
     "{'a': 1} 1 system True"},
    {"{{ bos_token }}{{ eos_token }}{{ tools is defined }}", "<s></s>False"},
    /* an empty generator (items of undefined) drained by sum: fuzz_template */
    {"{% set t = nothing|items|sum %}[{{ t }}]", "[0]"},
    /* {% generation %} (transformers' AssistantTracker) renders its body */
    {"{% generation %}gen{% endgeneration %}", "gen"},
};

static void test_features(void **state)
{
    (void)state;
    int failed = 0;
    for (size_t k = 0; k < sizeof k_cases / sizeof k_cases[0]; k++) {
        char *out = NULL, err[512];
        int rc = render_ctx(k_cases[k].src, NULL, &out, err, sizeof err);
        if (rc < 0 || strcmp(out, k_cases[k].want) != 0) {
            fprintf(stderr, "case %zu: %s\n  want: %s\n  got:  %s\n", k, k_cases[k].src,
                    k_cases[k].want, rc < 0 ? err : out);
            failed++;
        }
        free(out);
    }
    assert_int_equal(failed, 0);
}

/* ---- golden: the shared test data ------------------------------------------------ */

static json_t *load_json(const char *path)
{
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (!j)
        fprintf(stderr, "%s:%d: %s\n", path, e.line, e.text);
    return j;
}

/* Renders one template file; returns rc, output or error in *got. */
static int render_file(const char *dir, const char *file, const json_t *conv, const json_t *extra,
                       const char *bos, const char *eos, bool gen, char **got)
{
    char path[4096];
    int len = snprintf(path, sizeof path, "%s/%s", dir, file);
    assert_true(len > 0 && (size_t)len < sizeof path);
    size_t n;
    char *src = tu_read_file(path, &n);
    assert_non_null(src);
    const json_t *msgs = json_is_object(conv) ? json_object_get(conv, "messages") : conv;
    lms_template_vars v = {.messages = msgs,
                           .tools = json_is_object(conv) ? json_object_get(conv, "tools") : NULL,
                           .add_generation_prompt = gen, .bos_token = bos, .eos_token = eos,
                           .extra = extra, .now_text = "26 Nov 2026"};
    char err[1024];
    size_t out_len;
    int rc = lms_template_render(src, n, &v, got, &out_len, err, sizeof err);
    if (rc < 0)
        *got = strdup(err);
    free(src);
    return rc;
}

static const char *opt_str(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key)); /* NULL for null or absent */
}

static void test_golden(void **state)
{
    (void)state;
    char dir[4096]; /* tu_data_path's buffers rotate */
    snprintf(dir, sizeof dir, "%s", tu_data_path("templates"));
    json_t *vars = load_json(tu_data_path("templates/variables.json"));
    json_t *cases = load_json(tu_data_path("templates/cases.json"));
    assert_non_null(vars);
    assert_non_null(cases);
    const char *now = opt_str(vars, "strftime_now");
    assert_string_equal(now, "26 Nov 2026");
    int total = 0, passed = 0;
    const char *name, *cid;
    json_t *t, *cs;
    json_object_foreach(json_object_get(vars, "templates"), name, t)
    {
        int ok = 0, n = 0;
        json_object_foreach(json_object_get(cases, "cases"), cid, cs)
        {
            char path[512], *got;
            int rc = render_file(dir, opt_str(t, "file"), json_object_get(cs, "messages"), NULL,
                                 opt_str(t, "bos_token"), opt_str(t, "eos_token"), true, &got);
            snprintf(path, sizeof path, "templates/%s.%s.txt", name, cid);
            size_t wn;
            char *want = tu_read_file(tu_data_path(path), &wn);
            bool good;
            if (want) {
                good = rc == 0 && strlen(got) == wn && memcmp(got, want, wn) == 0;
            } else { /* NAME.CASE.error: must raise with that message */
                snprintf(path, sizeof path, "templates/%s.%s.error", name, cid);
                want = tu_read_file(tu_data_path(path), &wn);
                assert_non_null(want);
                good = rc == LMS_ERR_INVAL && strcmp(got, want) == 0;
            }
            if (!good)
                fprintf(stderr, "golden %s.%s: rc %d\n--- got\n%s\n--- want\n%s\n", name, cid, rc,
                        got, want);
            ok += good;
            n++;
            free(got);
            free(want);
        }
        print_message("golden %-45s %d/%d\n", name, ok, n);
        passed += ok;
        total += n;
    }
    print_message("golden total %d/%d\n", passed, total);
    assert_int_equal(total, 52);
    assert_int_equal(passed, total);
    json_decref(vars);
    json_decref(cases);
}

/* tests/data/templates, found from this source file's path. */
static const char *extra_data_path(void)
{
    static char buf[4096];
    const char *slash = strrchr(__FILE__, '/');
    int dir_len = slash ? (int)(slash - __FILE__) : 1;
    snprintf(buf, sizeof buf, "%.*s/../data/templates/expected.json", dir_len,
             slash ? __FILE__ : ".");
    return buf;
}

static void test_extra_conversations(void **state)
{
    (void)state;
    json_t *data = load_json(extra_data_path());
    json_t *vars = load_json(tu_data_path("templates/variables.json"));
    assert_non_null(data);
    assert_non_null(vars);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", tu_data_path("templates"));
    json_t *tmpls = json_object_get(vars, "templates"), *r;
    size_t i;
    int passed = 0, total = 0;
    json_array_foreach(json_object_get(data, "renders"), i, r)
    {
        const json_t *t = json_object_get(tmpls, opt_str(r, "template"));
        const json_t *conv = json_object_get(json_object_get(data, "conversations"),
                                             opt_str(r, "conversation"));
        const char *ename = opt_str(r, "extra");
        const json_t *extra = ename ? json_object_get(json_object_get(data, "extras"), ename) : NULL;
        char *got;
        int rc = render_file(dir, opt_str(t, "file"), conv, extra, opt_str(t, "bos_token"),
                             opt_str(t, "eos_token"),
                             json_is_true(json_object_get(r, "add_generation_prompt")), &got);
        const char *out = opt_str(r, "output"), *raises = opt_str(r, "raises");
        bool good = out      ? rc == 0 && strcmp(got, out) == 0
                    : raises ? rc == LMS_ERR_INVAL && strcmp(got, raises) == 0
                             : rc < 0 && rc != LMS_ERR_INVAL && strncmp(got, "template:", 9) == 0;
        if (!good)
            fprintf(stderr, "extra %s / %s / %s: rc %d\n--- got\n%s\n--- want\n%s\n",
                    opt_str(r, "template"), opt_str(r, "conversation"), ename ? ename : "-", rc,
                    got, out ? out : raises ? raises : "(an error)");
        passed += good;
        total++;
        free(got);
    }
    print_message("extra conversations %d/%d\n", passed, total);
    assert_true(total > 200);
    assert_int_equal(passed, total);
    json_decref(data);
    json_decref(vars);
}

/* ---- errors ------------------------------------------------------------------------ */

typedef struct ecase {
    const char *src;
    int code;
    const char *msg; /* substring of the error */
} ecase;

static const ecase k_errors[] = {
    {"{% if x %}", LMS_ERR_FORMAT,
     "template:1:11: unexpected end of template: 'if' opened at line 1 was never closed (expected 'endif')"},
    {"{% for x in xs %}\n{% endif %}", LMS_ERR_FORMAT,
     "template:2:4: unexpected 'endif': the innermost open block is 'for' opened at line 1"},
    {"{% endfor %}", LMS_ERR_FORMAT, "template:1:4: unexpected 'endfor': no block is open"},
    {"line1\n{{ foo|nosuchfilter }}", LMS_ERR_FORMAT, "template:2:8: unknown filter 'nosuchfilter'"},
    {"{{ 1 is nosuchtest }}", LMS_ERR_FORMAT, "template:1:9: unknown test 'nosuchtest'"},
    {"{% frobnicate %}", LMS_ERR_FORMAT, "template:1:4: unknown tag 'frobnicate'"},
    {"{% include 'x.j2' %}", LMS_ERR_FORMAT, "template:1:4: '{% include %}' is not supported"},
    {"{% macro m() %}x{% endmacro %}{% call m() %}b{% endcall %}", LMS_ERR_FORMAT,
     "macro 'm' takes no keyword argument 'caller'"},
    {"{% call xs %}b{% endcall %}", LMS_ERR_FORMAT, "'{% call %}' wants a macro call"},
    {"{% call nope() %}b{% endcall %}", LMS_ERR_FORMAT, "'nope' is undefined"},
    {"{{ 'abc }}", LMS_ERR_FORMAT, "template:1:4: unterminated string literal"},
    {"{{ 1 + }}", LMS_ERR_FORMAT, "template:1:8: expected an expression, got '}}'"},
    {"{{ (1 }}", LMS_ERR_FORMAT, "template:1:7: unexpected '}', expected ')'"},
    {"{{ [1) }}", LMS_ERR_FORMAT, "template:1:6: unexpected ')', expected ']'"},
    {"{{ 1 ", LMS_ERR_FORMAT, "template:1:1: unexpected end of template: tag not closed"},
    {"{{ 1 ) }}", LMS_ERR_FORMAT, "template:1:6: unexpected ')'"},
    {"{{ 1 $ 2 }}", LMS_ERR_FORMAT, "template:1:6: unexpected character '$'"},
    {"{# unterminated", LMS_ERR_FORMAT, "template:1:1: unterminated comment"},
    {"{% break %}", LMS_ERR_FORMAT, "template:1:4: 'break' outside of a for loop"},
    {"{% for x in xs %}{{ loop(xs) }}{% endfor %}", LMS_ERR_FORMAT, "loop() needs a loop marked recursive"},
    {"{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}", LMS_ERR_LIMIT, "recursive loop nested deeper than"},
    {"{% set %}", LMS_ERR_FORMAT, "template:1:8: expected a variable name, got '%}'"},
    {"{{ x.y }}", LMS_ERR_FORMAT, "template:1:6: 'x' is undefined"},
    {"{{ d.nope.x }}", LMS_ERR_FORMAT, "template:1:11: 'dict object' has no attribute 'nope'"},
    {"{{ xs[7].a }}", LMS_ERR_FORMAT, "list object has no element 7"},
    {"{{ 1 + 'a' }}", LMS_ERR_FORMAT, "template:1:6: unsupported operand type(s) for +: 'int' and 'str'"},
    {"{{ 'a' + 1 }}", LMS_ERR_FORMAT, "can only concatenate str (not \"int\") to str"},
    {"{{ 1 < 'a' }}", LMS_ERR_FORMAT, "'<' not supported between instances of 'int' and 'str'"},
    {"{{ xs.append(4) }}", LMS_ERR_FORMAT, "access to attribute 'append' of 'list' object is unsafe"},
    {"{{ d.pop('a') }}", LMS_ERR_FORMAT, "access to attribute 'pop' of 'dict' object is unsafe"},
    {"{{ 1 // 0 }}", LMS_ERR_FORMAT, "integer division or modulo by zero"},
    {"{{ 1 / 0 }}", LMS_ERR_FORMAT, "float division by zero"},
    {"{{ 2 ** 64 }}", LMS_ERR_RANGE, "integer overflow"},
    {"{% for a, b in xs %}{% endfor %}", LMS_ERR_FORMAT, "'int' object is not iterable"},
    {"{% for x in none %}{% endfor %}", LMS_ERR_FORMAT, "'NoneType' object is not iterable"},
    {"{% set a, b = [1] %}", LMS_ERR_FORMAT, "not enough values to unpack (expected 2, got 1)"},
    {"{% set d.x = 1 %}", LMS_ERR_FORMAT, "cannot assign attribute on non-namespace object"},
    {"{% for x.y in xs %}{% endfor %}", LMS_ERR_FORMAT, "expected 'in'"},
    {"{% for a, (b, c) in [[1, [2]]] %}{% endfor %}", LMS_ERR_FORMAT, "not enough values to unpack"},
    {"{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", LMS_ERR_FORMAT,
     "macro 'm' takes not more than 1 argument(s)"},
    {"{% macro m(a) %}{% endmacro %}{{ m(b=2) }}", LMS_ERR_FORMAT,
     "macro 'm' takes no keyword argument 'b'"},
    {"{% macro m() %}{{ kwargs }}{% endmacro %}{{ m(1) }}", LMS_ERR_FORMAT,
     "macro 'm' takes not more than 0 argument(s)"},
    {"{% macro m() %}{{ varargs }}{% endmacro %}{{ m(a=1) }}", LMS_ERR_FORMAT,
     "macro 'm' takes no keyword argument 'a'"},
    {"{{ xs|join(1, 2, 3) }}", LMS_ERR_FORMAT, "filter 'join' takes at most 2 arguments"},
    {"{{ s.split(nope=1) }}", LMS_ERR_FORMAT, "unexpected keyword argument 'nope'"},
    {"{{ 5() }}", LMS_ERR_FORMAT, "'int' object is not callable"},
    {"{{ range(200000)|length }}", LMS_ERR_LIMIT, "Range too big"},
    {"{{ xs|tojson(indent=1.5) }}", LMS_ERR_FORMAT, "indent must be an integer"},
    {"{{ undefined_var|tojson }}", LMS_ERR_FORMAT, "'undefined_var' is undefined"},
    {"{{ undefined_var|int(5) }}", LMS_ERR_FORMAT, "'undefined_var' is undefined"},
    {"{{ d.nope|float }}", LMS_ERR_FORMAT, "'dict object' has no attribute 'nope'"},
    {"{{ undefined_var|indent }}", LMS_ERR_FORMAT, "'undefined_var' is undefined"},
    {"{{ undefined_var|dictsort }}", LMS_ERR_FORMAT, "'undefined_var' is undefined"},
    {"{{ {1: 'a', 'b': 2}|tojson(sort_keys=true) }}", LMS_ERR_FORMAT,
     "'<' not supported between keys of different types"},
    {"{{ xs|map('string')|tojson }}", LMS_ERR_FORMAT,
     "Object of type generator is not JSON serializable"},
    {"{{ xs|select|length }}", LMS_ERR_FORMAT, "object of type 'generator' has no len()"},
    {"{{ xs|select|last }}", LMS_ERR_FORMAT, "'generator' object is not reversible"},
    {"{{ d|items|length }}", LMS_ERR_FORMAT, "has no len()"},
    {"{{ xs|reverse|tojson }}", LMS_ERR_FORMAT, "is not JSON serializable"},
    {"{{ xs|batch(2)|length }}", LMS_ERR_FORMAT, "has no len()"},
    {"{{ xs|select + [1] }}", LMS_ERR_FORMAT, "'generator' and 'list'"},
    {"{{ 'a'|safe + 1 }}", LMS_ERR_FORMAT, "can only concatenate str"},
    {"{{ [1] + (2,) }}", LMS_ERR_FORMAT, "unsupported operand type(s) for +: 'list' and 'tuple'"},
    {"{{ 'a' % 1 }}", LMS_ERR_FORMAT, "not all arguments converted during string formatting"},
    {"{{ '%s %s' % (1,) }}", LMS_ERR_FORMAT, "not enough arguments for format string"},
    {"{{ '%x' % 1.5 }}", LMS_ERR_FORMAT, "%x format: an integer is required, not float"},
    {"{{ '%d' % 'x' }}", LMS_ERR_FORMAT, "%d format: a real number is required, not str"},
    {"{{ '%(a)s' % (1,) }}", LMS_ERR_FORMAT, "format requires a mapping"},
    {"{{ '%(zz)s' % d }}", LMS_ERR_FORMAT, "format key 'zz' not found"},
    {"{{ '%s %(a)s'|format(1, a=2) }}", LMS_ERR_FORMAT, "positional and keyword"},
    {"{{ s.rindex('zz') }}", LMS_ERR_FORMAT, "substring not found"},
    {"{{ [{'a': 1}, {'a': 'x'}]|groupby('a') }}", LMS_ERR_FORMAT, "'<' not supported"},
    {"{{ s.partition('') }}", LMS_ERR_FORMAT, "empty separator"},
    {"{{ s.ljust(3, 'ab') }}", LMS_ERR_FORMAT, "exactly one character"},
    {"{{ d.get }}{{ dict(a=xs)|tojson }}{{ namespace()|tojson }}", LMS_ERR_FORMAT,
     "Object of type Namespace is not JSON serializable"},
    {"{{ raise_exception('Roles must alternate: ' ~ 3) }}", LMS_ERR_INVAL, "Roles must alternate: 3"},
};

static void test_errors(void **state)
{
    (void)state;
    int failed = 0;
    for (size_t k = 0; k < sizeof k_errors / sizeof k_errors[0]; k++) {
        char *out = NULL, err[512];
        int rc = render_ctx(k_errors[k].src, NULL, &out, err, sizeof err);
        if (rc != k_errors[k].code || !strstr(err, k_errors[k].msg)) {
            fprintf(stderr, "error case %zu: %s\n  want %d: %s\n  got %d: %s\n", k,
                    k_errors[k].src, k_errors[k].code, k_errors[k].msg, rc,
                    rc == 0 ? out : err);
            failed++;
        }
        free(out);
    }
    assert_int_equal(failed, 0);
}

/* raise_exception(): LMS_ERR_INVAL and the message alone, no location. */
static void test_raise(void **state)
{
    (void)state;
    char *out = NULL, err[256];
    assert_int_equal(render_ctx("a{{ raise_exception('No system role') }}b", NULL, &out, err,
                                sizeof err),
                     LMS_ERR_INVAL);
    assert_string_equal(err, "No system role");
    assert_null(out);
}

/* ---- limits ------------------------------------------------------------------------ */

static void expect_limit(const char *src, const lms_template_limits *lim, int code,
                         const char *msg)
{
    char *out = NULL, err[512];
    int rc = render_ctx(src, lim, &out, err, sizeof err);
    if (rc != code || !strstr(err, msg))
        fprintf(stderr, "limit case: %.80s\n  want %d %s\n  got %d %s\n", src, code, msg, rc, err);
    assert_int_equal(rc, code);
    assert_non_null(strstr(err, msg));
    assert_null(out);
}

static char *repeat(const char *a, int n, const char *mid, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), lm = strlen(mid);
    char *s = malloc((la + lb) * (size_t)n + lm + 1), *p = s;
    for (int i = 0; i < n; i++, p += la)
        memcpy(p, a, la);
    memcpy(p, mid, lm);
    p += lm;
    for (int i = 0; i < n; i++, p += lb)
        memcpy(p, b, lb);
    *p = 0;
    return s;
}

static void test_limits(void **state)
{
    (void)state;
    const char *nested_loops =
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    expect_limit(nested_loops, NULL, LMS_ERR_LIMIT, "more than 1000000 loop iterations");
    lms_template_limits slow = {.max_loop_iters = INT64_MAX, .max_time_ms = 100};
    expect_limit("{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}",
                 &slow, LMS_ERR_LIMIT, "render took longer than 100 ms");
    expect_limit("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", NULL, LMS_ERR_LIMIT,
                 "template:1:20: macro calls nested deeper than 64");
    expect_limit("{{ 'x' * 100000000 }}", NULL, LMS_ERR_LIMIT, "string longer than 16777216 bytes");
    lms_template_limits small = {.max_output_bytes = 1 << 20, .max_memory_bytes = 8 << 20};
    expect_limit("{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}", &small, LMS_ERR_LIMIT,
                 "output larger than 1048576 bytes");
    expect_limit("{% set ns = namespace(s='') %}{% for i in range(100000) %}"
                 "{% set ns.s = ns.s ~ 'abcdefghij' %}{% endfor %}",
                 &small, LMS_ERR_LIMIT, "memory limit of 8388608 bytes exceeded");
    /* the parser's nesting bound keeps the C stack small */
    char *deep = repeat("(", 200, "1", ")");
    char *src = malloc(strlen(deep) + 8);
    sprintf(src, "{{ %s }}", deep);
    expect_limit(src, NULL, LMS_ERR_FORMAT, "nesting deeper than 128 levels");
    free(src);
    free(deep);
    deep = repeat("[", 1000, "", "]");
    src = malloc(strlen(deep) + 8);
    sprintf(src, "{{ %s }}", deep);
    expect_limit(src, NULL, LMS_ERR_FORMAT, "template:1:260: brackets nested too deeply");
    free(src);
    free(deep);
    /* nested expressions inside a recursive macro: bounded at render time */
    deep = repeat("[", 40, "f(n - 1)", "]");
    src = malloc(strlen(deep) + 128);
    sprintf(src, "{%% macro f(n) %%}{%% if n > 0 %%}{{ %s }}{%% endif %%}{%% endmacro %%}{{ f(60) }}",
            deep);
    expect_limit(src, NULL, LMS_ERR_LIMIT, "expressions and blocks nested deeper than 1000");
    free(src);
    free(deep);
    deep = repeat("{% if true %}", 300, "x", "{% endif %}");
    expect_limit(deep, NULL, LMS_ERR_FORMAT, "nesting deeper than 128 levels");
    free(deep);
    deep = repeat("not ", 1000, "1", "");
    src = malloc(strlen(deep) + 8);
    sprintf(src, "{{ %s }}", deep);
    expect_limit(src, NULL, LMS_ERR_FORMAT, "nesting deeper than 128 levels");
    free(src);
    free(deep);
}

/* ---- built-in templates and the API -------------------------------------------------- */

static const char k_conv_json[] =
    "[{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Hi\"},"
    " {\"role\": \"assistant\", \"content\": [{\"type\": \"text\", \"text\": \"Hello\"}]},"
    " {\"role\": \"user\", \"content\": \"Bye\"}]";

static char *render_builtin(const char *name, const char *msgs_json)
{
    json_t *msgs = json_loads(msgs_json, 0, NULL);
    assert_non_null(msgs);
    lms_template_vars v = {.messages = msgs, .add_generation_prompt = true};
    const char *src = lms_template_builtin(name);
    assert_non_null(src);
    char *out = NULL, err[512];
    size_t n;
    int rc = lms_template_render(src, strlen(src), &v, &out, &n, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "built-in %s: %s\n", name, err);
    assert_int_equal(rc, 0);
    json_decref(msgs);
    return out;
}

static void test_builtins(void **state)
{
    (void)state;
    char *out = render_builtin("chatml", k_conv_json);
    assert_string_equal(out, "<|im_start|>system\nBe brief.<|im_end|>\n"
                             "<|im_start|>user\nHi<|im_end|>\n"
                             "<|im_start|>assistant\nHello<|im_end|>\n"
                             "<|im_start|>user\nBye<|im_end|>\n"
                             "<|im_start|>assistant\n");
    free(out);
    out = render_builtin("llama3", "[{\"role\": \"user\", \"content\": \" Hi \"}]");
    assert_string_equal(out, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi"
                             "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    free(out);
    out = render_builtin("mistral", k_conv_json);
    assert_string_equal(out, "<s>[INST] Be brief.\n\nHi [/INST]Hello</s>[INST] Bye [/INST]");
    free(out);
    int n = 0;
    for (const char *const *name = lms_template_builtin_names(); *name; name++, n++) {
        free(render_builtin(*name, k_conv_json));
        free(render_builtin(*name, "[]"));
    }
    assert_int_equal(n, 8);
    assert_non_null(lms_template_builtin(LMS_TEMPLATE_DEFAULT));
    assert_null(lms_template_builtin("no-such-template"));
    assert_null(lms_template_builtin(NULL));
}

static void test_api(void **state)
{
    (void)state;
    const char *src = "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
                      "{{ enable_thinking }}";
    lms_template *t = NULL;
    char err[256], *a, *b;
    size_t na, nb;
    assert_int_equal(lms_template_parse(src, strlen(src), &t, err, sizeof err), 0);
    json_t *msgs = json_loads(k_msgs_json, 0, NULL), *extra = json_loads(
                                                         "{\"enable_thinking\": false}", 0, NULL);
    lms_template_vars v = {.messages = msgs, .extra = extra};
    assert_int_equal(lms_template_apply(t, &v, &a, &na, err, sizeof err), 0);
    assert_int_equal(lms_template_apply(t, &v, &b, &nb, err, sizeof err), 0);
    assert_string_equal(a, "system:S;user:Hi;False");
    assert_string_equal(a, b);
    free(a);
    free(b);
    v.messages = NULL; /* no messages: an empty list */
    assert_int_equal(lms_template_apply(t, &v, &a, &na, err, sizeof err), 0);
    assert_string_equal(a, "False");
    assert_int_equal(na, 5);
    free(a);
    v.messages = extra; /* not an array */
    a = NULL;
    assert_int_equal(lms_template_apply(t, &v, &a, &na, err, sizeof err), LMS_ERR_INVAL);
    assert_null(a);
    lms_template_destroy(t);
    lms_template_destroy(NULL);
    t = NULL;
    assert_int_equal(lms_template_parse("{% if %}", 8, &t, err, sizeof err), LMS_ERR_FORMAT);
    assert_null(t);
    /* the empty template renders the empty string; length excludes NUL bytes' meaning */
    assert_int_equal(lms_template_render("", 0, &v, &a, &na, err, sizeof err), LMS_ERR_INVAL);
    v.messages = msgs;
    assert_int_equal(lms_template_render("", 0, &v, &a, &na, err, sizeof err), 0);
    assert_string_equal(a, "");
    free(a);
    json_decref(msgs);
    json_decref(extra);
}

/* strftime_now with a fixed clock and the real strftime. */
static void test_strftime(void **state)
{
    (void)state;
    const char *src = "{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %b %Y') }}";
    json_t *msgs = json_array();
    lms_template_vars v = {.messages = msgs, .now = 1795694400}; /* 2026-11-26 noon UTC */
    char *out, err[256];
    size_t n;
    assert_int_equal(lms_template_render(src, strlen(src), &v, &out, &n, err, sizeof err), 0);
    assert_non_null(strstr(out, "2026-11-2"));
    assert_non_null(strstr(out, "Nov 2026"));
    free(out);
    json_decref(msgs);
}

/* ---- fuzz: mutated real templates ---------------------------------------------------- */

static const char *const k_snippets[] = {"{%", "%}", "{{", "}}", "{#", "#}", "(", ")", "[", "]",
                                         "'", "\"", "-", "|", " endfor ", " if ", " else ",
                                         "loop.", "ns.", ",", "=", "\\", "\n", "macro "};

static void mutate(char *buf, size_t *n, size_t cap, uint64_t *rng)
{
    int edits = 1 + (int)(tu_rand_u64(rng) % 6);
    for (int e = 0; e < edits && *n > 2; e++) {
        size_t at = (size_t)(tu_rand_u64(rng) % *n);
        switch (tu_rand_u64(rng) % 4) {
        case 0: buf[at] = (char)(tu_rand_u64(rng) & 0xFF); break;
        case 1: { /* delete a span */
            size_t len = 1 + (size_t)(tu_rand_u64(rng) % 40);
            if (at + len > *n)
                len = *n - at;
            memmove(buf + at, buf + at + len, *n - at - len);
            *n -= len;
            break;
        }
        default: { /* insert a snippet */
            const char *s = k_snippets[tu_rand_u64(rng) % (sizeof k_snippets / sizeof *k_snippets)];
            size_t len = strlen(s);
            if (*n + len >= cap)
                break;
            memmove(buf + at + len, buf + at, *n - at);
            memcpy(buf + at, s, len);
            *n += len;
        }
        }
    }
}

static void test_fuzz(void **state)
{
    (void)state;
    json_t *vars = load_json(tu_data_path("templates/variables.json"));
    json_t *data = load_json(extra_data_path());
    assert_non_null(vars);
    assert_non_null(data);
    const json_t *conv = json_object_get(json_object_get(data, "conversations"), "tool_call");
    lms_template_limits lim = {.max_loop_iters = 20000, .max_time_ms = 200,
                               .max_output_bytes = 1 << 20, .max_memory_bytes = 32 << 20};
    lms_template_vars v = {.messages = json_object_get(conv, "messages"),
                           .tools = json_object_get(conv, "tools"), .add_generation_prompt = true,
                           .bos_token = "<s>", .now_text = "x", .limits = &lim};
    uint64_t rng = 12345;
    const char *name;
    json_t *t;
    int n_ok = 0, n_err = 0;
    json_object_foreach(json_object_get(vars, "templates"), name, t)
    {
        char path[512];
        snprintf(path, sizeof path, "templates/%s", opt_str(t, "file"));
        size_t n;
        char *src = tu_read_file(tu_data_path(path), &n);
        assert_non_null(src);
        size_t cap = n + 4096;
        char *buf = malloc(cap);
        for (int iter = 0; iter < 150; iter++) {
            size_t m = n;
            memcpy(buf, src, n);
            mutate(buf, &m, cap, &rng);
            char *out = NULL, err[512] = "";
            size_t len;
            int rc = lms_template_render(buf, m, &v, &out, &len, err, sizeof err);
            assert_true(rc <= 0);
            if (rc < 0) {
                assert_true(err[0] != 0);
                assert_null(out);
                n_err++;
            } else {
                n_ok++;
            }
            free(out);
        }
        free(buf);
        free(src);
    }
    print_message("fuzz: %d rendered, %d rejected with an error\n", n_ok, n_err);
    json_decref(vars);
    json_decref(data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),   cmocka_unit_test(test_extra_conversations),
        cmocka_unit_test(test_features), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_raise),    cmocka_unit_test(test_limits),
        cmocka_unit_test(test_builtins), cmocka_unit_test(test_api),
        cmocka_unit_test(test_strftime), cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
