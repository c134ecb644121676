/*
 * toolcall.c - the function calls in a model's reply (see toolcall.h for
 * the forms read). Parsing is all or nothing per form: a block that is not
 * a complete call leaves the whole reply as content.
 */
#include "serve/toolcall.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/textscan.h"
#include "model/markers.h"

static const char TAG_OPEN[] = LMS_MARK_TOOL_OPEN;
static const char TAG_CLOSE[] = LMS_MARK_TOOL_CLOSE;
static const char MISTRAL_MARK[] = LMS_MARK_MISTRAL_CALLS;
static const char DS_CALLS_BEGIN[] = LMS_MARK_DS_CALLS_BEGIN;
static const char DS_CALLS_END[] = LMS_MARK_DS_CALLS_END;
static const char DS_CALL_BEGIN[] = LMS_MARK_DS_CALL_BEGIN;
static const char DS_CALL_END[] = LMS_MARK_DS_CALL_END;
static const char DS_SEP[] = LMS_MARK_DS_SEP;
static const char FN_OPEN[] = LMS_MARK_FUNCTION_OPEN;
static const char FN_CLOSE[] = LMS_MARK_FUNCTION_CLOSE;
static const char FY_BLOCK[] = LMS_MARK_FUNCTIONARY_BLOCK;
static const char FY_ALL[] = "all\n"; /* Functionary v3.2's content block */
static const char CO_ACTION_OPEN[] = LMS_MARK_COHERE_ACTION_OPEN;
static const char CO_ACTION_CLOSE[] = LMS_MARK_COHERE_ACTION_CLOSE;
static const char CO_RESP_OPEN[] = LMS_MARK_COHERE_RESPONSE_OPEN;
static const char CO_RESP_CLOSE[] = LMS_MARK_COHERE_RESPONSE_CLOSE;

static bool starts_with(const char *s, size_t n, const char *lit, size_t lit_len)
{
    return n >= lit_len && memcmp(s, lit, lit_len) == 0;
}

/* Offset of the first lit in s[0..n), or n. */
static size_t find(const char *s, size_t n, const char *lit, size_t lit_len)
{
    const char *p = memmem(s, n, lit, lit_len);
    return p ? (size_t)(p - s) : n;
}

/* Whether s[0, n) is where lit starts (all of s, and not all of lit). */
static bool is_prefix_of(const char *s, size_t n, const char *lit, size_t lit_len)
{
    return n < lit_len && memcmp(s, lit, n) == 0;
}

/* Function names as OpenAI allows them (letters, digits, '_', '-'), and '.'. */
static bool is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-' || c == '.';
}

/* The first i' >= i with s[i'] not a name byte, or n. */
static size_t name_end(const char *s, size_t i, size_t n)
{
    while (i < n && is_name_char(s[i]))
        i++;
    return i;
}

/* n less the whitespace that ends text[0, n). */
static size_t trim_end(const char *text, size_t n)
{
    while (n > 0 && text_is_space(text[n - 1]))
        n--;
    return n;
}

void toolcalls_free(toolcalls *tc)
{
    for (int i = 0; i < tc->n; i++) {
        free(tc->v[i].name);
        free(tc->v[i].arguments);
    }
    free(tc->v);
    tc->v = NULL;
    tc->n = 0;
}

/* Adds the call that o describes: {"name", "arguments"|"parameters"}, or
 * OpenAI's own {"type":"function","function":{...}}. Returns 1 added, 0 o
 * is not a call, < 0 out of memory. */
static int add_call(toolcalls *tc, const json_t *o)
{
    if (json_is_object(json_object_get(o, "function")))
        o = json_object_get(o, "function");
    const json_t *name = json_object_get(o, "name");
    if (!json_is_object(o) || !json_is_string(name) || json_string_length(name) == 0)
        return 0;
    const json_t *args = json_object_get(o, "arguments");
    if (!args)
        args = json_object_get(o, "parameters");
    char *a;
    if (!args || json_is_null(args))
        a = strdup("{}");
    else if (json_is_object(args))
        a = json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER);
    else if (json_is_string(args))
        a = strdup(json_string_value(args));
    else
        return 0;
    char *nm = strdup(json_string_value(name));
    toolcall *v = realloc(tc->v, (size_t)(tc->n + 1) * sizeof *v);
    if (!a || !nm || !v) {
        free(a);
        free(nm);
        if (v)
            tc->v = v;
        return -1;
    }
    tc->v = v;
    v[tc->n++] = (toolcall){nm, a};
    return 1;
}

/* One JSON value at s[0..n); *used gets the bytes it took (trailing text
 * allowed when used is not NULL). */
static json_t *load(const char *s, size_t n, size_t *used)
{
    json_error_t err;
    json_t *j = json_loadb(s, n, used ? JSON_DISABLE_EOF_CHECK : 0, &err);
    if (j && used)
        *used = (size_t)err.position;
    return j;
}

/* Adds the call named name[0, name_len) whose arguments are the JSON
 * object at args[0, n): with used, text may follow it and *used gets the
 * bytes it took; without, only whitespace may. Returns 1 added, 0 not an
 * object (or a name that is not UTF-8), < 0 out of memory. */
static int add_named_call(toolcalls *tc, const char *name, size_t name_len, const char *args,
                          size_t n, size_t *used)
{
    json_t *a = load(args, n, used);
    json_t *call = json_is_object(a) ? json_pack("{s:s%, s:O}", "name", name, name_len,
                                                 "arguments", a)
                                     : NULL;
    const int rc = call ? add_call(tc, call) : 0;
    json_decref(call);
    json_decref(a);
    return rc;
}

/* A parameter's text as a JSON value: itself where it reads as JSON (an
 * object, array, number, true, false, null), else the string. */
static json_t *xml_value(const char *s, size_t n)
{
    json_t *v = json_loadb(s, n, JSON_DECODE_ANY, NULL);
    return v && !json_is_string(v) ? v : (json_decref(v), json_stringn(s, n));
}

/* The XML form inside a <tool_call> block (Qwen3-Coder, Qwen3.5):
 *   <function=NAME>
 *   <parameter=KEY>
 *   VALUE (any text, several lines)
 *   </parameter>
 *   ...
 *   </function>
 * Returns 1 added, 0 not this form (or incomplete), < 0 out of memory. */
static int add_xml_call(toolcalls *tc, const char *s, size_t n)
{
    static const char PAR[] = "<parameter=", PAR_END[] = "</parameter>";
    size_t i = text_skip_space(s, 0, n);
    if (!starts_with(s + i, n - i, FN_OPEN, LIT_LEN(FN_OPEN)))
        return 0;
    i += LIT_LEN(FN_OPEN);
    size_t e = find(s + i, n - i, ">", 1);
    if (e == 0 || i + e >= n)
        return 0;
    json_t *call = json_pack("{s:s%, s:{}}", "name", s + i, e, "arguments");
    json_t *args = json_object_get(call, "arguments");
    int rc = 1;
    for (i += e + 1; rc == 1;) {
        i = text_skip_space(s, i, n);
        if (i == n || starts_with(s + i, n - i, FN_CLOSE, LIT_LEN(FN_CLOSE)))
            break;
        if (!starts_with(s + i, n - i, PAR, LIT_LEN(PAR))) {
            rc = 0;
            break;
        }
        i += LIT_LEN(PAR);
        const size_t k = find(s + i, n - i, ">", 1);
        if (i + k >= n) {
            rc = 0;
            break;
        }
        char *key = strndup(s + i, k);
        i += k + 1;
        size_t v = i, ve = i + find(s + i, n - i, PAR_END, LIT_LEN(PAR_END));
        if (ve >= n || !key) { /* a parameter still being written */
            free(key);
            rc = key ? 0 : -1;
            break;
        }
        i = ve + LIT_LEN(PAR_END);
        if (v < ve && s[v] == '\n') /* the template's line breaks around the value */
            v++;
        if (ve > v && s[ve - 1] == '\n')
            ve--;
        json_object_set_new(args, key, xml_value(s + v, ve - v));
        free(key);
    }
    if (rc == 1)
        rc = add_call(tc, call);
    json_decref(call);
    return rc;
}

/* `<tool_call>` blocks from offset i on; text after the last block is
 * dropped. Returns > 0 calls read, 0 not this form, < 0 out of memory. */
static int parse_tags(const char *s, size_t n, size_t i, toolcalls *tc)
{
    while ((i = text_skip_space(s, i, n)) < n && starts_with(s + i, n - i, TAG_OPEN,
                                                         LIT_LEN(TAG_OPEN))) {
        i += LIT_LEN(TAG_OPEN);
        size_t body = find(s + i, n - i, TAG_CLOSE, LIT_LEN(TAG_CLOSE));
        json_t *o = load(s + i, body, NULL);
        int rc = o ? add_call(tc, o) : add_xml_call(tc, s + i, body);
        json_decref(o);
        if (rc <= 0)
            return rc;
        i += body + (i + body < n ? LIT_LEN(TAG_CLOSE) : 0);
    }
    return tc->n;
}

/* The whole reply as a JSON array of calls, or as objects separated by
 * `;` or space. Returns > 0 calls read, 0 not this form, < 0 out of memory. */
static int parse_bare(const char *s, size_t n, size_t i, toolcalls *tc)
{
    if (starts_with(s + i, n - i, MISTRAL_MARK, LIT_LEN(MISTRAL_MARK)))
        i = text_skip_space(s, i + LIT_LEN(MISTRAL_MARK), n);
    if (i < n && s[i] == '[') {
        json_t *a = load(s + i, n - i, NULL);
        size_t k;
        const json_t *o;
        int rc = json_is_array(a) && json_array_size(a) > 0;
        json_array_foreach(a, k, o)
        {
            if ((rc = add_call(tc, o)) <= 0)
                break;
        }
        json_decref(a);
        return rc <= 0 ? rc : tc->n;
    }
    while (i < n && s[i] == '{') {
        size_t used = 0;
        json_t *o = load(s + i, n - i, &used);
        int rc = add_call(tc, o);
        json_decref(o);
        if (rc <= 0)
            return rc;
        i = text_skip_space(s, i + used, n);
        if (i < n && s[i] == ';')
            i = text_skip_space(s, i + 1, n);
    }
    return i == n ? tc->n : 0;
}

/* Mistral's newer form after [TOOL_CALLS] (at i): NAME[ARGS]{...}, with
 * [CALL_ID]ID before [ARGS] in some replies, again after each further
 * [TOOL_CALLS]. Returns > 0 calls read, 0 not this form, < 0 out of memory. */
static int parse_mistral_args(const char *s, size_t n, size_t i, toolcalls *tc)
{
    static const char ARGS[] = LMS_MARK_MISTRAL_ARGS, CALL_ID[] = LMS_MARK_MISTRAL_CALL_ID;
    while (i < n) {
        const size_t a = find(s + i, n - i, ARGS, LIT_LEN(ARGS));
        const size_t id = find(s + i, a, CALL_ID, LIT_LEN(CALL_ID));
        const size_t name_len = id < a ? id : a;
        if (i + a >= n || name_len == 0)
            return 0;
        size_t used = 0;
        const int rc = add_named_call(tc, s + i, name_len, s + i + a + LIT_LEN(ARGS),
                                      n - i - a - LIT_LEN(ARGS), &used);
        if (rc <= 0)
            return rc;
        i = text_skip_space(s, i + a + LIT_LEN(ARGS) + used, n);
        if (starts_with(s + i, n - i, MISTRAL_MARK, LIT_LEN(MISTRAL_MARK)))
            i = text_skip_space(s, i + LIT_LEN(MISTRAL_MARK), n);
        else if (i < n)
            return 0;
    }
    return tc->n;
}

/* One DeepSeek call, the text between <｜tool▁call▁begin｜> and
 * <｜tool▁call▁end｜> (s[0, n)), in either of its forms:
 *   V3, R1:  [function]<｜tool▁sep｜>NAME\n```json\n{...}\n```
 *   V3.1:    NAME<｜tool▁sep｜>{...}
 * told apart by what follows the separator (a '{' or not). The fence is
 * optional, but one opened must be closed; nothing else may follow.
 * Returns 1 added, 0 not a call, < 0 out of memory. */
static int add_deepseek_call(toolcalls *tc, const char *s, size_t n)
{
    static const char FENCE[] = "```", JSON_TAG[] = "json", FUNCTION[] = "function";
    const size_t sep = find(s, n, DS_SEP, LIT_LEN(DS_SEP));
    if (sep == n)
        return 0;
    size_t i = text_skip_space(s, sep + LIT_LEN(DS_SEP), n);
    size_t a = text_skip_space(s, 0, sep), b = trim_end(s, sep); /* the text before it */
    if (i < n && s[i] == '{') { /* V3.1: the name before the separator */
        if (a >= b)
            return 0;
    } else { /* V3: "function" or nothing before it, the name on its line after it */
        if (b > a && !(b - a == LIT_LEN(FUNCTION) && memcmp(s + a, FUNCTION, b - a) == 0))
            return 0;
        a = i;
        b = trim_end(s, a + find(s + a, n - a, "\n", 1));
        if (a >= b)
            return 0;
        i = text_skip_space(s, b, n);
    }
    size_t end = trim_end(s, n);
    if (starts_with(s + i, n - i, FENCE, LIT_LEN(FENCE))) { /* the closing fence ends the call */
        i += LIT_LEN(FENCE);
        if (starts_with(s + i, n - i, JSON_TAG, LIT_LEN(JSON_TAG)))
            i += LIT_LEN(JSON_TAG);
        if (end < i + LIT_LEN(FENCE) || memcmp(s + end - LIT_LEN(FENCE), FENCE, LIT_LEN(FENCE)))
            return 0;
        end -= LIT_LEN(FENCE);
    }
    if (end <= i)
        return 0; /* no arguments */
    return add_named_call(tc, s + a, b - a, s + i, end - i, NULL);
}

/* DeepSeek's calls after <｜tool▁calls▁begin｜> (i just past it): blocks
 * <｜tool▁call▁begin｜>...<｜tool▁call▁end｜>, whitespace between them, then
 * <｜tool▁calls▁end｜>; text after that is dropped. A reply that ends
 * without <｜tool▁calls▁end｜> still counts when every call in it is
 * complete (the closing marker is all that is missing). Returns > 0 calls
 * read, 0 not this form, < 0 out of memory. */
static int parse_deepseek(const char *s, size_t n, size_t i, toolcalls *tc)
{
    while ((i = text_skip_space(s, i, n)) < n &&
           !starts_with(s + i, n - i, DS_CALLS_END, LIT_LEN(DS_CALLS_END))) {
        if (!starts_with(s + i, n - i, DS_CALL_BEGIN, LIT_LEN(DS_CALL_BEGIN)))
            return 0;
        i += LIT_LEN(DS_CALL_BEGIN);
        const size_t body = find(s + i, n - i, DS_CALL_END, LIT_LEN(DS_CALL_END));
        if (i + body >= n)
            return 0; /* a call still being written, or never closed */
        const int rc = add_deepseek_call(tc, s + i, body);
        if (rc <= 0)
            return rc;
        i += body + LIT_LEN(DS_CALL_END);
    }
    return tc->n;
}

/* Functionary v3.1, Llama 3.1's custom form, from the first
 * <function=NAME> (at i) on: blocks <function=NAME>{...}</function>,
 * whitespace between them (the last one's closing tag may be missing at
 * the end of the reply); text after the last block is dropped. Returns > 0
 * calls read, 0 not this form, < 0 out of memory. */
static int parse_function_tags(const char *s, size_t n, size_t i, toolcalls *tc)
{
    while (i < n && starts_with(s + i, n - i, FN_OPEN, LIT_LEN(FN_OPEN))) {
        const size_t a = i + LIT_LEN(FN_OPEN), b = name_end(s, a, n);
        if (b == a || b == n || s[b] != '>')
            return 0;
        size_t used = 0;
        const int rc = add_named_call(tc, s + a, b - a, s + b + 1, n - b - 1, &used);
        if (rc <= 0)
            return rc;
        i = text_skip_space(s, b + 1 + used, n);
        if (starts_with(s + i, n - i, FN_CLOSE, LIT_LEN(FN_CLOSE)))
            i = text_skip_space(s, i + LIT_LEN(FN_CLOSE), n);
        else if (i < n)
            return 0; /* text inside the block after its arguments */
    }
    return tc->n;
}

/* Functionary v3.2's block header at s[i]: ">>>" (none when bare), a
 * name, a newline. */
typedef enum fy_head { FY_NO, FY_PARTIAL, FY_YES } fy_head;

/* Whether s[i, n) opens with a header (then the name is s[*name, *body -
 * 1) and its block's text starts at *body), does not, or ends where one
 * may still be written. */
static fy_head fy_header(const char *s, size_t n, size_t i, bool bare, size_t *name, size_t *body)
{
    if (!bare) {
        if (!starts_with(s + i, n - i, FY_BLOCK, LIT_LEN(FY_BLOCK)))
            return is_prefix_of(s + i, n - i, FY_BLOCK, LIT_LEN(FY_BLOCK)) ? FY_PARTIAL : FY_NO;
        i += LIT_LEN(FY_BLOCK);
    }
    const size_t e = name_end(s, i, n);
    if (e == n)
        return FY_PARTIAL;
    if (e == i || s[e] != '\n')
        return FY_NO;
    *name = i;
    *body = e + 1;
    return FY_YES;
}

/* Whether s[0, n) may name a request's function: any name where the list
 * is not known (names NULL), else one in it (partial: the start of one,
 * the rest still to be written). */
static bool fy_listed(const char *const *names, const char *s, size_t n, bool partial)
{
    if (!names)
        return true;
    for (size_t k = 0; names[k]; k++) {
        const size_t l = strlen(names[k]);
        if ((l == n || (partial && l > n)) && memcmp(names[k], s, n) == 0)
            return true;
    }
    return false;
}

/* Whether the header's name is "all": Functionary's content block. */
static bool fy_is_all(const char *s, size_t name, size_t body)
{
    return body - name == LIT_LEN(FY_ALL) && memcmp(s + name, FY_ALL, LIT_LEN(FY_ALL)) == 0;
}

/* Functionary v3.2's calls from the first header ">>>NAME\n" (at i) on,
 * each followed by the arguments as a JSON object; whitespace may follow
 * them, then the next header. Parsing ends at an "all" block or any other
 * text, which are dropped (the content before the calls is what the reply
 * can carry). Returns > 0 calls read, 0 not this form, < 0 out of memory. */
static int parse_functionary(const char *s, size_t n, size_t i, toolcalls *tc)
{
    size_t name = 0, body = 0;
    while (i < n && fy_header(s, n, i, false, &name, &body) == FY_YES &&
           !fy_is_all(s, name, body)) {
        size_t used = 0;
        const int rc = add_named_call(tc, s + name, body - 1 - name, s + body, n - body, &used);
        if (rc <= 0)
            return rc;
        i = text_skip_space(s, body + used, n);
    }
    return tc->n;
}

/* The first call of a Functionary v3.2 reply is written without ">>>"
 * (the template's generation prompt ends with it): s[i, mark) is
 * "NAME\n{...}", whitespace after it allowed, NAME one of names where
 * they are known (toolcall_parse says where it is looked for).
 * Returns 1 added, 0 not this form, < 0 out of memory. */
static int fy_first_call(const char *s, size_t i, size_t mark, const char *const *names,
                         toolcalls *tc)
{
    size_t name = 0, body = 0;
    if (fy_header(s, mark, i, true, &name, &body) != FY_YES || fy_is_all(s, name, body) ||
        body == mark || s[body] != '{' || !fy_listed(names, s + name, body - 1 - name, false))
        return 0;
    return add_named_call(tc, s + name, body - 1 - name, s + body, mark - body, NULL);
}

/* Adds Cohere's call o: {"tool_call_id": ..., "tool_name": NAME,
 * "parameters": {...}} (the id is not kept: calls get the server's ids).
 * Returns 1 added, 0 not a call, < 0 out of memory. */
static int add_cohere_call(toolcalls *tc, const json_t *o)
{
    const json_t *name = json_object_get(o, "tool_name");
    const json_t *params = json_object_get(o, "parameters");
    if (!json_is_string(name) || (params && !json_is_object(params)))
        return 0;
    json_t *call = params ? json_pack("{s:O, s:O}", "name", name, "arguments", params)
                          : json_pack("{s:O}", "name", name);
    const int rc = call ? add_call(tc, call) : -1;
    json_decref(call);
    return rc;
}

/* Cohere's calls after <|START_ACTION|> (i just past it): a JSON array of
 * calls, then <|END_ACTION|> (missing at the very end of a reply is fine);
 * more such blocks may follow, whitespace between them; text after the
 * last is dropped. Returns > 0 calls read, 0 not this form, < 0 out of
 * memory. */
static int parse_cohere(const char *s, size_t n, size_t i, toolcalls *tc)
{
    for (;;) {
        size_t used = 0;
        json_t *a = load(s + i, n - i, &used);
        int rc = json_is_array(a) && json_array_size(a) > 0;
        size_t k;
        const json_t *o;
        json_array_foreach(a, k, o)
        {
            if ((rc = add_cohere_call(tc, o)) <= 0)
                break;
        }
        json_decref(a);
        if (rc <= 0)
            return rc;
        i = text_skip_space(s, i + used, n);
        if (!starts_with(s + i, n - i, CO_ACTION_CLOSE, LIT_LEN(CO_ACTION_CLOSE)))
            return i == n ? tc->n : 0;
        i = text_skip_space(s, i + LIT_LEN(CO_ACTION_CLOSE), n);
        if (!starts_with(s + i, n - i, CO_ACTION_OPEN, LIT_LEN(CO_ACTION_OPEN)))
            return tc->n;
        i += LIT_LEN(CO_ACTION_OPEN);
    }
}

/* ---- where the content is ---------------------------------------------------- */

/* Some forms wrap the content:
 *   Cohere:       <|START_RESPONSE|>content<|END_RESPONSE|> (text after
 *                 it dropped; the closing marker may be missing)
 *   Functionary:  all\n or >>>all\n (v3.2's content block) at the start
 * Cohere's plan before either, <|START_THINKING|>...<|END_THINKING|>, is
 * thoughts (serve/reasoning), taken apart before the text comes here;
 * where it is not (reasoning_format "none") it is content as written, as
 * <think>...</think> is, and the wrappers after it are text. */
typedef struct span {
    size_t from;   /* where the content starts */
    size_t end;    /* where what may hold content and calls ends: len unless a response closed */
    bool response; /* inside <|START_RESPONSE|> */
    bool open;     /* streaming: the text so far cannot tell yet (from: no later than the final) */
} span;

static span content_span(const char *text, size_t len, bool partial)
{
    static const char FY_ALL_BLOCK[] = LMS_MARK_FUNCTIONARY_BLOCK "all\n";
    static const char *const heads[] = {CO_RESP_OPEN, FY_ALL, FY_ALL_BLOCK};
    span sp = {.end = len};
    const size_t i = text_skip_space(text, 0, len);
    for (size_t k = 0; k < sizeof heads / sizeof heads[0]; k++) {
        const size_t hl = strlen(heads[k]);
        if (partial && is_prefix_of(text + i, len - i, heads[k], hl)) {
            sp.open = true;
            break;
        }
        if (starts_with(text + i, len - i, heads[k], hl)) {
            sp.from = i + hl;
            sp.response = k == 0;
            if (sp.response)
                sp.end = sp.from + find(text + sp.from, len - sp.from, CO_RESP_CLOSE,
                                        LIT_LEN(CO_RESP_CLOSE));
            break;
        }
    }
    return sp;
}

/* The markers a reply's calls may start with: the text before the first
 * is content. */
enum {
    MARK_TAG,
    MARK_MISTRAL,
    MARK_PYTHON,
    MARK_GRANITE,
    MARK_DEEPSEEK,
    MARK_FUNCTION,
    MARK_FUNCTIONARY,
    MARK_COHERE
};
static const char *const MARKS[] = {TAG_OPEN, MISTRAL_MARK,   LMS_MARK_PYTHON_TAG,
                                    LMS_MARK_GRANITE_CALL, DS_CALLS_BEGIN, FN_OPEN,
                                    FY_BLOCK, CO_ACTION_OPEN};
#define N_MARKS (sizeof MARKS / sizeof MARKS[0])
_Static_assert(MARK_COHERE + 1 == N_MARKS, "one name per marker");

/* The first marker in text[0, len): its offset (len: none) and index.
 * ">>>" counts only as a whole block header, or (partial: streaming) one
 * that the text's end may still make whole. */
static size_t first_mark(const char *text, size_t len, bool partial, int *which)
{
    size_t at = len;
    for (int k = 0; k < (int)N_MARKS; k++) {
        const size_t ml = strlen(MARKS[k]);
        for (size_t from = 0; from < at;) {
            const size_t m = from + find(text + from, at - from, MARKS[k], ml);
            size_t name, body;
            const fy_head h = k == MARK_FUNCTIONARY && m < at
                                  ? fy_header(text, len, m, false, &name, &body)
                                  : FY_YES;
            if (m < at && (h == FY_YES || (partial && h == FY_PARTIAL))) {
                at = m, *which = k;
                break;
            }
            from = m + 1;
        }
    }
    return at;
}

int toolcall_parse(const char *text, size_t len, const char *const *names, toolcalls *out)
{
    *out = (toolcalls){0};
    if (!text)
        return 0;
    const span sp = content_span(text, len, false);
    const char *s = text + sp.from; /* content and calls are in s[0, n) */
    const size_t n = sp.end - sp.from;
    int which = -1;
    size_t mark = first_mark(s, n, false, &which);
    int rc;
    if (mark == n) { /* no marker: the whole reply may be a bare call */
        const size_t i = text_skip_space(s, 0, n);
        /* or Functionary's lone first call, where the names tell it from text */
        rc = names && sp.from == 0 ? fy_first_call(s, i, n, names, out) : 0;
        if (rc == 0)
            rc = parse_bare(s, n, i, out);
        mark = 0;
    } else if (which == MARK_TAG) {
        rc = parse_tags(s, n, mark, out);
    } else if (which == MARK_DEEPSEEK) {
        rc = parse_deepseek(s, n, mark + LIT_LEN(DS_CALLS_BEGIN), out);
    } else if (which == MARK_FUNCTION) {
        rc = parse_function_tags(s, n, mark, out);
    } else if (which == MARK_FUNCTIONARY) {
        /* the first call may come without ">>>", where no "all" block came first */
        const int first =
            sp.from == 0 ? fy_first_call(s, text_skip_space(s, 0, mark), mark, names, out) : 0;
        rc = first < 0 ? first : parse_functionary(s, n, mark, out);
        if (first > 0)
            mark = 0; /* no content before it */
    } else if (which == MARK_COHERE) {
        rc = parse_cohere(s, n, mark + LIT_LEN(CO_ACTION_OPEN), out);
    } else {
        const size_t i = text_skip_space(s, mark + strlen(MARKS[which]), n);
        rc = which == MARK_MISTRAL && i < n && s[i] != '[' ? parse_mistral_args(s, n, i, out)
                                                           : parse_bare(s, n, i, out);
    }
    if (rc < 0) {
        toolcalls_free(out);
        return -1;
    }
    if (rc == 0) /* no call: all content */
        toolcalls_free(out);
    out->content_from = sp.from;
    out->content_len = rc == 0 ? n : trim_end(s, mark);
    return 0;
}

/* safe less a tail of text[0, len) that may grow into lit. */
static size_t hold_partial(const char *text, size_t len, size_t safe, const char *lit)
{
    const size_t ml = strlen(lit);
    for (size_t t = ml - 1 < len ? ml - 1 : len; t > 0; t--)
        if (len - t < safe && memcmp(text + len - t, lit, t) == 0)
            return len - t;
    return safe;
}

size_t toolcall_safe_len(const char *text, size_t len, const char *const *names, size_t *from)
{
    const span sp = content_span(text, len, true);
    const char *s = text + sp.from;
    const size_t n = sp.end - sp.from;
    const size_t i = text_skip_space(s, 0, n);
    *from = sp.from;
    if (sp.open || i == n || s[i] == '{' || s[i] == '[')
        return sp.from; /* nothing yet, or perhaps a bare call: hold it all */
    size_t name, body;
    const fy_head h = sp.from == 0 ? fy_header(s, n, i, true, &name, &body) : FY_NO;
    if ((h == FY_PARTIAL && fy_listed(names, s + i, n - i, true)) ||
        (h == FY_YES && (body == n || s[body] == '{') &&
         fy_listed(names, s + name, body - 1 - name, false)))
        return sp.from; /* perhaps Functionary's first call, "NAME\n{": hold it all */
    int which = -1;
    size_t safe = first_mark(s, n, true, &which);
    if (sp.end == len) { /* hold a tail that may grow into a marker */
        for (size_t k = 0; k < N_MARKS; k++)
            safe = hold_partial(s, n, safe, MARKS[k]);
        if (sp.response)
            safe = hold_partial(s, n, safe, CO_RESP_CLOSE);
    }
    /* nor the whitespace before it: a call after it would trim that from
     * the content (content_len) */
    return sp.from + trim_end(s, safe);
}

/* The name of one entry of a tools array, or NULL. */
static const char *tool_name(const json_t *t)
{
    const json_t *f = json_object_get(t, "function");
    const json_t *name = json_object_get(json_is_object(f) ? f : t, "name");
    return json_is_string(name) && json_string_length(name) > 0 ? json_string_value(name) : NULL;
}

char **toolcall_names(const json_t *tools)
{
    if (!json_is_array(tools))
        return NULL;
    /* the pointers, then the strings they point to */
    size_t n = 0, bytes = sizeof(char *), k;
    const json_t *t;
    json_array_foreach(tools, k, t)
    {
        const char *nm = tool_name(t);
        if (nm)
            n++, bytes += sizeof(char *) + strlen(nm) + 1;
    }
    char **v = malloc(bytes);
    if (!v)
        return NULL;
    char *p = (char *)(v + n + 1);
    n = 0;
    json_array_foreach(tools, k, t)
    {
        const char *nm = tool_name(t);
        if (nm) {
            const size_t l = strlen(nm) + 1;
            v[n++] = memcpy(p, nm, l);
            p += l;
        }
    }
    v[n] = NULL;
    return v;
}
