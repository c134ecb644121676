/*
 * template_filters.c - the `|filters` and `is tests` of jinja2 that chat
 * templates use, with jinja2's argument names and defaults.
 *
 * String filters convert their input with str() first (undefined becomes
 * ""), as jinja2's soft_str does. Filters that look up attributes of items
 * (map, selectattr, sort, join, sum, unique, ...) accept dotted paths
 * ("function.name") and integer parts ("0"), item lookup first.
 *
 * tojson follows transformers, not jinja2: json.dumps with
 * ensure_ascii=False, insertion-ordered keys, no HTML escaping; its
 * positional order is (ensure_ascii, indent, separators, sort_keys).
 */
#include "model/template_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "base/ckd.h"
#include "base/err.h"

/* arg: the table entry's mode (which case mapping, which comparison, ...). */
typedef int (*filter_fn)(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                         tpl_val *out);
typedef int (*test_fn)(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                       bool *out);

/* ---- helpers ------------------------------------------------------------------ */

static bool arg_or(const tpl_args *a, size_t i, const char *name, tpl_val def, tpl_val *out)
{
    if (tpl_arg(a, i, name, out))
        return true;
    *out = def;
    return false;
}

static int64_t int_or(const tpl_args *a, size_t i, const char *name, int64_t def)
{
    tpl_val v;
    if (!tpl_arg(a, i, name, &v))
        return def;
    if (v.type == TPL_INT)
        return v.u.i;
    if (v.type == TPL_BOOL)
        return v.u.b;
    if (v.type == TPL_FLOAT)
        return (int64_t)v.u.f;
    return def;
}

static bool bool_or(const tpl_args *a, size_t i, const char *name, bool def)
{
    tpl_val v;
    return tpl_arg(a, i, name, &v) ? tpl_truthy(v) : def;
}

/* Follows a dotted attribute path ("a.b.0") through items/attributes. */
static int attr_path(tpl_ctx *c, const tpl_node *at, tpl_val v, tpl_val path, tpl_val *out)
{
    if (path.type != TPL_STR)
        return tpl_getitem(c, at, v, path, out);
    const char *p = path.u.s.p, *end = p + path.u.s.n;
    for (;;) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        size_t n = dot ? (size_t)(dot - p) : (size_t)(end - p);
        tpl_val key = tpl_str(p, n);
        bool digits = n > 0 && n < 18;
        for (size_t k = 0; k < n && digits; k++)
            digits = p[k] >= '0' && p[k] <= '9';
        if (digits)
            key = tpl_int(strtoll(p, NULL, 10));
        if (v.type == TPL_UNDEF) {
            *out = v;
            return 0;
        }
        TPL_TRY(tpl_getitem(c, at, v, key, &v));
        if (!dot)
            break;
        p = dot + 1;
    }
    *out = v;
    return 0;
}

/* Sort key: the value, or its attribute; lower-cased strings unless
 * case_sensitive. */
static int sort_key(tpl_ctx *c, const tpl_node *at, tpl_val v, tpl_val attr, bool case_sensitive,
                    tpl_val *out)
{
    if (attr.type != TPL_NONE)
        TPL_TRY(attr_path(c, at, v, attr, &v));
    if (!case_sensitive && v.type == TPL_STR)
        return tpl_str_case(c, at, v, TPL_CASE_LOWER, out);
    *out = v;
    return 0;
}

/* Stable merge sort of idx[] by keys[]; fails when two keys don't order. */
static int merge_sort(tpl_ctx *c, const tpl_node *at, const tpl_val *keys, size_t *idx, size_t *tmp,
                      size_t n, bool reverse)
{
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n,
                   hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi) {
                /* take from the right only when it sorts strictly first, so
                 * equal keys keep their order both ways (as Python) */
                tpl_val x = reverse ? keys[idx[i]] : keys[idx[j]];
                tpl_val y = reverse ? keys[idx[j]] : keys[idx[i]];
                bool lt;
                if (!tpl_less(x, y, &lt))
                    return tpl_fail(c, at, LMS_ERR_FORMAT,
                                    "'<' not supported between instances of '%s' and '%s'",
                                    tpl_type_name(x), tpl_type_name(y));
                tmp[o++] = lt ? idx[j++] : idx[i++];
            }
            while (i < mid)
                tmp[o++] = idx[i++];
            while (j < hi)
                tmp[o++] = idx[j++];
            memcpy(idx + lo, tmp + lo, (hi - lo) * sizeof *idx);
        }
        TPL_TRY(tpl_tick(c, at));
    }
    return 0;
}

/* Sorts items by their keys into a new list. */
static int sorted_list(tpl_ctx *c, const tpl_node *at, const tpl_list *items, const tpl_val *keys,
                       bool reverse, tpl_val *out)
{
    size_t n = items->n;
    size_t *idx = tpl_alloc(&c->arena, (2 * n + 1) * sizeof *idx);
    tpl_list *l = tpl_list_new(&c->arena, n);
    if (!idx || !l)
        return tpl_fail_nomem(c, at);
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    TPL_TRY(merge_sort(c, at, keys, idx, idx + n, n, reverse));
    for (size_t i = 0; i < n; i++)
        l->items[i] = items->items[idx[i]];
    l->n = n;
    *out = tpl_list_val(l);
    return 0;
}

/* ---- string filters ----------------------------------------------------------- */

static int f_trim(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                  tpl_val *out)
{
    tpl_val chars;
    arg_or(a, 0, "chars", tpl_none(), &chars);
    TPL_TRY(tpl_to_str(c, at, in, &in));
    return tpl_str_strip(c, at, in, chars, 3, out);
}

static int f_case(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int mode,
                  tpl_val *out)
{
    TPL_TRY(tpl_to_str(c, at, in, &in));
    return tpl_str_case(c, at, in, mode, out);
}

static int f_replace(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                     tpl_val *out)
{
    tpl_val from, to;
    if (!tpl_arg(a, 0, "old", &from) || !tpl_arg(a, 1, "new", &to))
        return tpl_fail(c, at, LMS_ERR_FORMAT, "replace() needs 'old' and 'new'");
    TPL_TRY(tpl_to_str(c, at, in, &in));
    TPL_TRY(tpl_to_str(c, at, from, &from));
    TPL_TRY(tpl_to_str(c, at, to, &to));
    return tpl_str_replace(c, at, in, from, to, int_or(a, 2, "count", -1), out);
}

static int f_string(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                    tpl_val *out)
{
    return tpl_to_str(c, at, in, out);
}

/* Autoescape is off, so a safe string prints as any other; the mark
 * matters only when it meets a plain string in `+` (functionary's
 * templates build text as "..."|safe + name + ...|tojson). */
static int f_safe(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                  tpl_val *out)
{
    TPL_TRY(tpl_to_str(c, at, in, out));
    out->flags |= TPL_F_SAFE;
    return 0;
}

/* escape (arg 0) leaves a safe string alone; forceescape (1) escapes it too */
static int f_escape(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                    tpl_val *out)
{
    if (arg && in.type == TPL_STR)
        in.flags &= (uint8_t)~TPL_F_SAFE;
    return tpl_escape_html(c, at, in, out);
}

int tpl_escape_html(tpl_ctx *c, const tpl_node *at, tpl_val in, tpl_val *out)
{
    if (in.type == TPL_STR && (in.flags & TPL_F_SAFE)) {
        *out = in;
        return 0;
    }
    TPL_TRY(tpl_to_str(c, at, in, &in));
    tpl_buf b = {.max_bytes = c->lim.max_output_bytes};
    int rc = 0;
    for (size_t i = 0; i < in.u.s.n && rc == 0; i++) {
        char ch = in.u.s.p[i];
        const char *e = ch == '&'    ? "&amp;"
                        : ch == '<'  ? "&lt;"
                        : ch == '>'  ? "&gt;"
                        : ch == '"'  ? "&#34;"
                        : ch == '\'' ? "&#39;"
                                     : NULL;
        rc = e ? tpl_buf_put(&b, e, strlen(e)) : tpl_buf_putc(&b, ch);
    }
    TPL_TRY(tpl_buf_finish(c, at, &b, rc, out));
    out->flags |= TPL_F_SAFE;
    return 0;
}

/* Python's str.splitlines on \n, \r\n and \r. */
static size_t next_line(const char *p, size_t n, size_t b, size_t *next)
{
    size_t e = b;
    while (e < n && p[e] != '\n' && p[e] != '\r')
        e++;
    *next = e < n ? e + 1 + (p[e] == '\r' && e + 1 < n && p[e + 1] == '\n') : n;
    return e;
}

static int f_indent(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                    tpl_val *out)
{
    tpl_val w, pad;
    if (in.type == TPL_UNDEF) /* jinja2 appends "\n" to it, which fails */
        return tpl_fail_undefined(c, at, in);
    arg_or(a, 0, "width", tpl_int(4), &w);
    bool first = bool_or(a, 1, "first", false), blank = bool_or(a, 2, "blank", false);
    if (w.type == TPL_STR) {
        pad = w;
    } else {
        int64_t n = w.type == TPL_INT ? w.u.i : 4;
        char *p = NULL;
        TPL_TRY(tpl_new_str(c, at, n > 0 && n < 1024 ? (size_t)n : 0, &p, &pad));
        memset(p, ' ', pad.u.s.n);
    }
    TPL_TRY(tpl_to_str(c, at, in, &in));
    /* jinja2 splits (s + "\n") into lines: a trailing newline leaves an
     * empty last line; lines after the first get the padding unless empty. */
    tpl_buf b = {.max_bytes = c->lim.max_output_bytes};
    int rc = first ? tpl_buf_put(&b, pad.u.s.p, pad.u.s.n) : 0;
    size_t pos = 0, next;
    for (size_t line = 0; rc == 0; line++) {
        size_t e = next_line(in.u.s.p, in.u.s.n, pos, &next);
        if (line > 0) {
            rc = tpl_buf_putc(&b, '\n');
            if (rc == 0 && (blank || e > pos))
                rc = tpl_buf_put(&b, pad.u.s.p, pad.u.s.n);
        }
        if (rc == 0)
            rc = tpl_buf_put(&b, in.u.s.p + pos, e - pos);
        if (e == in.u.s.n) /* no line break after this line */
            break;
        pos = next;
    }
    return tpl_buf_finish(c, at, &b, rc, out);
}

static int f_center(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                    tpl_val *out)
{
    int64_t width = int_or(a, 0, "width", 80);
    TPL_TRY(tpl_to_str(c, at, in, &in));
    int64_t len = (int64_t)tpl_utf8_len(in.u.s.p, in.u.s.n);
    if (width <= len || width > (int64_t)c->lim.max_output_bytes) {
        *out = in;
        return 0;
    }
    int64_t pad = width - len, left = pad / 2 + (pad & width & 1);
    char *p = NULL;
    TPL_TRY(tpl_new_str(c, at, in.u.s.n + (size_t)pad, &p, out));
    memset(p, ' ', (size_t)left);
    memcpy(p + left, in.u.s.p, in.u.s.n);
    memset(p + left + in.u.s.n, ' ', (size_t)(pad - left));
    return 0;
}

static int f_truncate(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                      tpl_val *out)
{
    int64_t length = int_or(a, 0, "length", 255), leeway = int_or(a, 3, "leeway", 5);
    bool killwords = bool_or(a, 1, "killwords", false);
    tpl_val end;
    arg_or(a, 2, "end", tpl_cstr("..."), &end);
    TPL_TRY(tpl_to_str(c, at, in, &in));
    TPL_TRY(tpl_to_str(c, at, end, &end));
    int64_t n = (int64_t)tpl_utf8_len(in.u.s.p, in.u.s.n),
            n_end = (int64_t)tpl_utf8_len(end.u.s.p, end.u.s.n);
    if (length < n_end || leeway < 0)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "expected length >= %lld and leeway >= 0",
                        (long long)n_end);
    if (n <= length + leeway) {
        *out = in;
        return 0;
    }
    size_t cut = tpl_utf8_offset(in.u.s.p, in.u.s.n, (size_t)(length - n_end));
    if (!killwords) {
        size_t sp = cut;
        while (sp > 0 && in.u.s.p[sp - 1] != ' ')
            sp--;
        if (sp > 0)
            cut = sp - 1;
    }
    tpl_buf b = {.max_bytes = c->lim.max_output_bytes};
    int rc = tpl_buf_put(&b, in.u.s.p, cut);
    if (rc == 0)
        rc = tpl_buf_put(&b, end.u.s.p, end.u.s.n);
    return tpl_buf_finish(c, at, &b, rc, out);
}

static int f_wordcount(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                       tpl_val *out)
{
    TPL_TRY(tpl_to_str(c, at, in, &in));
    int64_t words = 0;
    bool in_word = false;
    for (size_t i = 0, k; i < in.u.s.n; i += k) {
        bool w = tpl_cp_is_word(tpl_utf8_decode(in.u.s.p + i, in.u.s.n - i, &k));
        words += w && !in_word;
        in_word = w;
    }
    *out = tpl_int(words);
    return 0;
}

static int f_format(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                    tpl_val *out)
{
    tpl_val args;
    TPL_TRY(tpl_to_str(c, at, in, &in));
    if (a->n_kw == 0) {
        TPL_TRY(tpl_list_from_vals(c, at, a->pos, a->n_pos, &args));
        args.flags = TPL_F_TUPLE;
        return tpl_str_format(c, at, in, args, out);
    }
    /* keywords feed "%(name)s" (jinja2 refuses a mix of both) */
    if (a->n_pos)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "can't handle positional and keyword arguments");
    tpl_dict *d = tpl_dict_new(&c->arena, a->n_kw);
    if (!d)
        return tpl_fail_nomem(c, at);
    for (size_t k = 0; k < a->n_kw; k++)
        if (tpl_dict_set(&c->arena, d, a->kw_names[k], a->kw_vals[k]) < 0)
            return tpl_fail_nomem(c, at);
    return tpl_str_format(c, at, in, tpl_dict_val(d), out);
}

static int f_tojson(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                    tpl_val *out)
{
    tpl_json_opts o = {.indent = -1};
    tpl_val ind, seps;
    char sep[2][16], ind_str[65];
    o.ensure_ascii = bool_or(a, 0, "ensure_ascii", false);
    if (tpl_arg(a, 1, "indent", &ind) && ind.type != TPL_NONE) {
        /* json.dumps: an int is that many spaces (none when negative, yet
         * still one item a line), a str is used as it is */
        if (ind.type == TPL_STR && ind.u.s.n < sizeof ind_str) {
            snprintf(ind_str, sizeof ind_str, "%.*s", (int)ind.u.s.n, ind.u.s.p);
            o.indent = 0;
            o.indent_str = ind_str;
        } else if ((ind.type == TPL_INT && ind.u.i <= 64) || ind.type == TPL_BOOL) {
            o.indent = ind.type == TPL_BOOL ? ind.u.b : ind.u.i < 0 ? 0 : (int)ind.u.i;
        } else {
            return tpl_fail(c, at, LMS_ERR_FORMAT,
                            "tojson: indent must be an integer up to 64 or a string of up to 64 bytes");
        }
    }
    if (tpl_arg(a, 2, "separators", &seps) && seps.type == TPL_LIST && seps.u.l->n == 2) {
        for (int k = 0; k < 2; k++) {
            tpl_val s = seps.u.l->items[k];
            if (s.type != TPL_STR || s.u.s.n >= sizeof sep[k])
                return tpl_fail(c, at, LMS_ERR_FORMAT, "tojson: bad separators");
            snprintf(sep[k], sizeof sep[k], "%.*s", (int)s.u.s.n, s.u.s.p);
        }
        o.item_sep = sep[0];
        o.key_sep = sep[1];
    }
    o.sort_keys = bool_or(a, 3, "sort_keys", false);
    tpl_buf b = {.max_bytes = c->lim.max_output_bytes};
    const char *bad = NULL;
    int rc = tpl_write_json(&b, in, &o, 0, &bad);
    if (rc == LMS_ERR_FORMAT || (rc == LMS_ERR_LIMIT && bad)) {
        tpl_buf_free(&b);
        if (in.type == TPL_UNDEF)
            return tpl_fail_undefined(c, at, in);
        if (bad[0] == '\'') /* sort_keys met keys that do not order */
            return tpl_fail(c, at, LMS_ERR_FORMAT, "tojson: %s", bad);
        return tpl_fail(c, at, LMS_ERR_FORMAT, "tojson: Object of type %s is not JSON serializable",
                        bad);
    }
    return tpl_buf_finish(c, at, &b, rc, out);
}

static int f_pprint(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                    tpl_val *out)
{
    tpl_buf b = {.max_bytes = c->lim.max_output_bytes};
    return tpl_buf_finish(c, at, &b, tpl_write_repr(&b, in), out);
}

/* ---- numbers -------------------------------------------------------------------- */

static int f_abs(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                 tpl_val *out)
{
    if (in.type == TPL_FLOAT)
        *out = tpl_float(fabs(in.u.f));
    else if ((in.type == TPL_INT && in.u.i != INT64_MIN) || in.type == TPL_BOOL)
        *out = tpl_int(in.type == TPL_BOOL ? in.u.b : in.u.i < 0 ? -in.u.i : in.u.i);
    else
        return tpl_fail(c, at, LMS_ERR_FORMAT, "bad operand type for abs(): '%s'",
                        tpl_type_name(in));
    return 0;
}

/* Parses a Python int/float literal from a string (spaces around allowed). */
static bool parse_number(tpl_val s, bool want_float, int base, double *f, int64_t *i)
{
    char buf[64];
    size_t n = 0;
    for (size_t k = 0; k < s.u.s.n && n < sizeof buf - 1; k++)
        if (s.u.s.p[k] != '_')
            buf[n++] = s.u.s.p[k];
    if (n == 0 || n >= sizeof buf - 1)
        return false;
    buf[n] = 0;
    char *end, *p = buf;
    errno = 0;
    if (want_float) {
        *f = strtod(buf, &end);
        p = end;
    } else {
        /* Python's int(s, base): sign, then a 0x / 0o / 0b prefix that
         * matches the base (base 0 picks it from the prefix, and without
         * one takes decimal that has no leading zero) */
        while (*p == ' ' || *p == '\t' || *p == '\n')
            p++;
        bool neg = *p == '-';
        p += *p == '-' || *p == '+';
        int pb = 0;
        if (p[0] == '0' && p[1]) {
            char x = (char)(p[1] | 0x20);
            pb = x == 'x' ? 16 : x == 'o' ? 8 : x == 'b' ? 2 : 0;
        }
        if (pb && (base == 0 || base == pb)) {
            p += 2;
            base = pb;
        } else if (base == 0) {
            if (p[0] == '0' && p[1] >= '0' && p[1] <= '9')
                return false;
            base = 10;
        }
        if (*p == '-' || *p == '+' || *p == ' ') /* strtoll would take a second sign */
            return false;
        const char *digits = p;
        *i = strtoll(digits, &end, base);
        if (neg)
            *i = -*i;
        if (end == digits)
            return false;
        p = end;
    }
    if (p == buf)
        return false;
    while (*p == ' ' || *p == '\t' || *p == '\n')
        p++;
    return *p == 0 && errno == 0;
}

static int f_int(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                 tpl_val *out)
{
    int64_t def = int_or(a, 0, "default", 0), base = int_or(a, 1, "base", 10), i;
    double f;
    if (in.type == TPL_UNDEF) /* int(Undefined) raises rather than taking the default */
        return tpl_fail_undefined(c, at, in);
    if (base != 0 && (base < 2 || base > 36))
        base = 10;
    if (in.type == TPL_INT || in.type == TPL_BOOL)
        *out = tpl_int(in.type == TPL_BOOL ? in.u.b : in.u.i);
    else if (in.type == TPL_FLOAT && isfinite(in.u.f) && fabs(in.u.f) < 9.2e18)
        *out = tpl_int((int64_t)in.u.f);
    else if (in.type == TPL_STR && parse_number(in, false, (int)base, &f, &i))
        *out = tpl_int(i);
    else if (in.type == TPL_STR && parse_number(in, true, 10, &f, &i) && fabs(f) < 9.2e18)
        *out = tpl_int((int64_t)f);
    else
        *out = tpl_int(def);
    return 0;
}

static int f_float(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                   tpl_val *out)
{
    tpl_val def;
    double f;
    int64_t i;
    arg_or(a, 0, "default", tpl_float(0.0), &def);
    if (in.type == TPL_UNDEF) /* as for int */
        return tpl_fail_undefined(c, at, in);
    if (tpl_is_number(in))
        *out = tpl_float(tpl_as_double(in));
    else if (in.type == TPL_STR && parse_number(in, true, 10, &f, &i))
        *out = tpl_float(f);
    else
        *out = def;
    return 0;
}

/* round(): Python's round() for "common" (correctly rounded, ties to even;
 * an int stays an int), or ceil/floor at that precision. */
static int f_round(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                   tpl_val *out)
{
    int64_t prec = int_or(a, 0, "precision", 0);
    tpl_val method;
    arg_or(a, 1, "method", tpl_cstr("common"), &method);
    bool ceil_m = method.type == TPL_STR && method.u.s.n == 4 && !memcmp(method.u.s.p, "ceil", 4);
    bool floor_m = method.type == TPL_STR && method.u.s.n == 5 && !memcmp(method.u.s.p, "floor", 5);
    if (!ceil_m && !floor_m &&
        !(method.type == TPL_STR && method.u.s.n == 6 && !memcmp(method.u.s.p, "common", 6)))
        return tpl_fail(c, at, LMS_ERR_FORMAT, "method must be common, ceil or floor");
    if (!tpl_is_number(in))
        return tpl_fail(c, at, LMS_ERR_FORMAT, "round: %s is not a number", tpl_type_name(in));
    if (in.type != TPL_FLOAT && !ceil_m && !floor_m) {
        /* round(int, n) stays an int; n < 0 rounds to 10**-n, half to even */
        int64_t v = in.type == TPL_BOOL ? in.u.b : in.u.i;
        if (prec < 0) {
            __int128 p = 1, q, r;
            for (int64_t k = 0; k < -prec && p <= (__int128)INT64_MAX; k++)
                p *= 10;
            q = v / p;
            r = v % p;
            if (r < 0) { /* floor division, as Python's divmod */
                q -= 1;
                r += p;
            }
            if (2 * r > p || (2 * r == p && (q & 1)))
                q += 1;
            __int128 res = q * p;
            if (res > INT64_MAX || res < INT64_MIN)
                return tpl_fail(c, at, LMS_ERR_RANGE, "integer overflow");
            v = (int64_t)res;
        }
        *out = tpl_int(v);
        return 0;
    }
    double x = tpl_as_double(in), scale = pow(10.0, (double)(prec < -308  ? -308
                                                             : prec > 308 ? 308
                                                                          : prec));
    if (ceil_m || floor_m) {
        *out = tpl_float((ceil_m ? ceil(x * scale) : floor(x * scale)) / scale);
    } else if (prec >= 0 && prec <= 30 && isfinite(x)) {
        char buf[400]; /* printf rounds the exact binary value, as Python does */
        snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
        *out = tpl_float(strtod(buf, NULL));
    } else {
        *out = tpl_float(prec > 30 ? x : nearbyint(x * scale) / scale);
    }
    return 0;
}

/* ---- sequences ------------------------------------------------------------------ */

static int f_length(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                    tpl_val *out)
{
    switch (in.type) {
    case TPL_UNDEF: *out = tpl_int(0); return 0;
    case TPL_STR: *out = tpl_int((int64_t)tpl_utf8_len(in.u.s.p, in.u.s.n)); return 0;
    case TPL_LIST:
        if (in.flags & TPL_F_GEN)
            break;
        *out = tpl_int((int64_t)in.u.l->n);
        return 0;
    case TPL_DICT:
    case TPL_NS: *out = tpl_int((int64_t)in.u.d->n); return 0;
    case TPL_LOOP: *out = tpl_int((int64_t)in.u.loop->items->n); return 0;
    default: break;
    }
    return tpl_fail(c, at, LMS_ERR_FORMAT, "object of type '%s' has no len()", tpl_type_name(in));
}

static int f_first_last(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int last,
                        tpl_val *out)
{
    tpl_list *l = NULL;
    if (in.type == TPL_LIST && (in.flags & TPL_F_GEN)) {
        if (last)
            return tpl_fail(c, at, LMS_ERR_FORMAT, "'generator' object is not reversible");
        l = in.u.l; /* first takes one item; the rest stay for later */
        if (l->taken < l->n) {
            *out = l->items[l->taken++];
            return 0;
        }
        *out = tpl_undef("first", 5, TPL_N_TYPES);
        return 0;
    }
    TPL_TRY(tpl_iterate(c, at, in, &l));
    if (l->n == 0)
        *out = tpl_undef(last ? "last" : "first", last ? 4 : 5, TPL_N_TYPES);
    else
        *out = l->items[last ? l->n - 1 : 0];
    return 0;
}

static int f_list(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                  tpl_val *out)
{
    tpl_list *l = NULL;
    TPL_TRY(tpl_iterate(c, at, in, &l));
    return tpl_list_from_vals(c, at, l->items, l->n, out);
}

static int f_items(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                   tpl_val *out)
{
    if (in.type == TPL_UNDEF)
        return tpl_list_from_vals(c, at, NULL, 0, out);
    if (in.type != TPL_DICT && in.type != TPL_NS)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "Can only get item pairs from a mapping.");
    return tpl_dict_items(c, at, in.u.d, out);
}

static int f_reverse(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                     tpl_val *out)
{
    tpl_list *l = NULL;
    TPL_TRY(tpl_iterate(c, at, in, &l));
    tpl_list *r = tpl_list_new(&c->arena, l->n);
    if (!r)
        return tpl_fail_nomem(c, at);
    for (size_t i = 0; i < l->n; i++)
        r->items[i] = l->items[l->n - 1 - i];
    r->n = l->n;
    if (in.type != TPL_STR) {
        *out = tpl_list_val(r);
        return 0;
    }
    tpl_buf b = {.max_bytes = c->lim.max_output_bytes};
    int rc = 0;
    for (size_t i = 0; i < r->n && rc == 0; i++)
        rc = tpl_buf_put(&b, r->items[i].u.s.p, r->items[i].u.s.n);
    return tpl_buf_finish(c, at, &b, rc, out);
}

static int f_join(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                  tpl_val *out)
{
    tpl_val sep, attr;
    tpl_list *l = NULL;
    arg_or(a, 0, "d", tpl_str("", 0), &sep);
    arg_or(a, 1, "attribute", tpl_none(), &attr);
    TPL_TRY(tpl_to_str(c, at, sep, &sep));
    TPL_TRY(tpl_iterate(c, at, in, &l));
    tpl_buf b = {.max_bytes = c->lim.max_output_bytes};
    int rc = 0;
    for (size_t i = 0; i < l->n && rc == 0; i++) {
        tpl_val v = l->items[i];
        if (attr.type != TPL_NONE && (rc = attr_path(c, at, v, attr, &v)) < 0)
            break;
        if (i)
            rc = tpl_buf_put(&b, sep.u.s.p, sep.u.s.n);
        if (rc == 0)
            rc = tpl_write_str(&b, v);
    }
    if (rc < 0 && rc != LMS_ERR_LIMIT && rc != LMS_ERR_NOMEM) {
        tpl_buf_free(&b);
        return rc;
    }
    return tpl_buf_finish(c, at, &b, rc, out);
}

static int f_default(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                     tpl_val *out)
{
    tpl_val def;
    arg_or(a, 0, "default_value", tpl_str("", 0), &def);
    bool boolean = bool_or(a, 1, "boolean", false);
    *out = in.type == TPL_UNDEF || (boolean && !tpl_truthy(in)) ? def : in;
    return 0;
}

static int f_attr(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                  tpl_val *out)
{
    tpl_val name;
    if (!tpl_arg(a, 0, "name", &name) || name.type != TPL_STR)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "attr() needs an attribute name");
    if (in.type == TPL_DICT) { /* attributes of a dict are its methods, not its keys */
        int found = tpl_method_find(c, at, in, name.u.s.p, name.u.s.n, out);
        if (found == 0)
            *out = tpl_undef(name.u.s.p, name.u.s.n, TPL_DICT);
        return found < 0 ? found : 0;
    }
    return tpl_getattr(c, at, in, name.u.s.p, name.u.s.n, out);
}

/* batch(linecount, fill_with) (arg 0): runs of linecount items, the last
 * padded to that length with fill_with. slice(slices, fill_with) (arg 1):
 * that many runs, the first len % slices of them one longer, fill_with
 * padding the others by one. */
static int f_rows(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int slice,
                  tpl_val *out)
{
    const char *what = slice ? "slices" : "linecount";
    int64_t k = int_or(a, 0, what, 0);
    tpl_val fill;
    bool has_fill = arg_or(a, 1, "fill_with", tpl_none(), &fill) && fill.type != TPL_NONE;
    tpl_list *l, *r;
    if (k <= 0)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "%s: %s must be positive",
                        slice ? "slice" : "batch", what);
    if (slice && k > c->lim.max_loop_iters)
        return tpl_fail(c, at, LMS_ERR_LIMIT, "slice: more than %lld slices",
                        (long long)c->lim.max_loop_iters);
    TPL_TRY(tpl_iterate(c, at, in, &l));
    size_t n = l->n, kk = (size_t)k, rows = slice ? kk : n / kk + (n % kk != 0);
    size_t per = n / kk, extra = n % kk, start = 0;
    if (!(r = tpl_list_new(&c->arena, rows)))
        return tpl_fail_nomem(c, at);
    for (size_t s = 0; s < rows; s++) {
        size_t len = slice ? per + (s < extra) : (n - start < kk ? n - start : kk);
        size_t want = !has_fill ? 0 : slice ? (s >= extra ? per + 1 : 0) : kk;
        tpl_val row;
        TPL_TRY(tpl_list_from_vals(c, at, l->items + start, len, &row));
        while (row.u.l->n < want)
            if (tpl_list_push(&c->arena, row.u.l, fill) < 0)
                return tpl_fail_nomem(c, at);
        r->items[r->n++] = row;
        start += len;
    }
    *out = tpl_list_val(r);
    return 0;
}

static int f_sort(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                  tpl_val *out)
{
    bool reverse = bool_or(a, 0, "reverse", false), cs = bool_or(a, 1, "case_sensitive", false);
    tpl_val attr;
    tpl_list *l = NULL;
    arg_or(a, 2, "attribute", tpl_none(), &attr);
    TPL_TRY(tpl_iterate(c, at, in, &l));
    tpl_val *keys = tpl_alloc(&c->arena, (l->n + 1) * sizeof *keys);
    if (!keys)
        return tpl_fail_nomem(c, at);
    for (size_t i = 0; i < l->n; i++)
        TPL_TRY(sort_key(c, at, l->items[i], attr, cs, &keys[i]));
    return sorted_list(c, at, l, keys, reverse, out);
}

/* groupby(attribute, default=none, case_sensitive=false): items sorted by
 * the attribute, in runs of equal keys, as (grouper, list) tuples. */
static int f_groupby(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                     tpl_val *out)
{
    tpl_val attr, def = tpl_none();
    if (!tpl_arg(a, 0, "attribute", &attr))
        return tpl_fail(c, at, LMS_ERR_FORMAT, "groupby: missing argument 'attribute'");
    bool has_def = tpl_arg(a, 1, "default", &def), cs = bool_or(a, 2, "case_sensitive", false);
    tpl_list *l = NULL;
    TPL_TRY(tpl_iterate(c, at, in, &l));
    size_t n = l->n;
    tpl_val *vals = tpl_alloc(&c->arena, (2 * n + 1) * sizeof *vals), *keys = vals + n;
    size_t *idx = tpl_alloc(&c->arena, (2 * n + 1) * sizeof *idx);
    tpl_list *groups = tpl_list_new(&c->arena, 0);
    if (!vals || !idx || !groups)
        return tpl_fail_nomem(c, at);
    for (size_t i = 0; i < n; i++) {
        TPL_TRY(attr_path(c, at, l->items[i], attr, &vals[i]));
        if (vals[i].type == TPL_UNDEF && has_def)
            vals[i] = def;
        keys[i] = vals[i];
        if (!cs && vals[i].type == TPL_STR)
            TPL_TRY(tpl_str_case(c, at, vals[i], TPL_CASE_LOWER, &keys[i]));
        idx[i] = i;
    }
    TPL_TRY(merge_sort(c, at, keys, idx, idx + n, n, false));
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && tpl_equal(keys[idx[j]], keys[idx[i]]))
            j++;
        tpl_list *members = tpl_list_new(&c->arena, j - i);
        if (!members)
            return tpl_fail_nomem(c, at);
        for (size_t k = i; k < j; k++)
            members->items[members->n++] = l->items[idx[k]];
        /* the grouper is the first member's value, case kept */
        tpl_val pair[2] = {vals[idx[i]], tpl_list_val(members)}, g;
        TPL_TRY(tpl_list_from_vals(c, at, pair, 2, &g));
        g.flags = TPL_F_TUPLE | TPL_F_GROUP;
        if (tpl_list_push(&c->arena, groups, g) < 0)
            return tpl_fail_nomem(c, at);
        i = j;
    }
    *out = tpl_list_val(groups);
    return 0;
}

static int f_dictsort(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                      tpl_val *out)
{
    bool cs = bool_or(a, 0, "case_sensitive", false), reverse = bool_or(a, 2, "reverse", false);
    tpl_val by, items;
    arg_or(a, 1, "by", tpl_cstr("key"), &by);
    bool by_value = by.type == TPL_STR && by.u.s.n == 5 && memcmp(by.u.s.p, "value", 5) == 0;
    if (in.type == TPL_UNDEF) /* value.items() of Undefined */
        return tpl_fail_undefined(c, at, in);
    TPL_TRY(f_items(c, at, in, a, 0, &items));
    tpl_list *l = items.u.l;
    tpl_val *keys = tpl_alloc(&c->arena, (l->n + 1) * sizeof *keys);
    if (!keys)
        return tpl_fail_nomem(c, at);
    for (size_t i = 0; i < l->n; i++)
        TPL_TRY(sort_key(c, at, l->items[i].u.l->items[by_value], tpl_none(), cs, &keys[i]));
    return sorted_list(c, at, l, keys, reverse, out);
}

static int f_unique(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                    tpl_val *out)
{
    bool cs = bool_or(a, 0, "case_sensitive", false);
    tpl_val attr;
    tpl_list *l = NULL;
    arg_or(a, 1, "attribute", tpl_none(), &attr);
    TPL_TRY(tpl_iterate(c, at, in, &l));
    tpl_val *keys = tpl_alloc(&c->arena, (l->n + 1) * sizeof *keys);
    tpl_list *r = tpl_list_new(&c->arena, l->n);
    if (!keys || !r)
        return tpl_fail_nomem(c, at);
    size_t nk = 0;
    for (size_t i = 0; i < l->n; i++) {
        tpl_val k;
        bool seen = false;
        TPL_TRY(sort_key(c, at, l->items[i], attr, cs, &k));
        for (size_t j = 0; j < nk && !seen; j++) {
            seen = tpl_equal(keys[j], k);
            TPL_TRY(tpl_tick(c, at)); /* quadratic: keep the clock in view */
        }
        if (!seen) {
            keys[nk++] = k;
            r->items[r->n++] = l->items[i];
        }
    }
    *out = tpl_list_val(r);
    return 0;
}

static int f_minmax(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int max,
                    tpl_val *out)
{
    bool cs = bool_or(a, 0, "case_sensitive", false);
    tpl_val attr, best_key = tpl_none();
    tpl_list *l = NULL;
    arg_or(a, 1, "attribute", tpl_none(), &attr);
    TPL_TRY(tpl_iterate(c, at, in, &l));
    *out = tpl_undef(max ? "max" : "min", 3, TPL_N_TYPES);
    for (size_t i = 0; i < l->n; i++) {
        tpl_val k;
        bool lt;
        TPL_TRY(sort_key(c, at, l->items[i], attr, cs, &k));
        if (i > 0 && !tpl_less(max ? best_key : k, max ? k : best_key, &lt))
            return tpl_fail(c, at, LMS_ERR_FORMAT, "values cannot be compared");
        if (i == 0 || lt) {
            best_key = k;
            *out = l->items[i];
        }
    }
    return 0;
}

static int f_sum(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                 tpl_val *out)
{
    tpl_val attr, acc;
    tpl_list *l = NULL;
    arg_or(a, 0, "attribute", tpl_none(), &attr);
    arg_or(a, 1, "start", tpl_int(0), &acc);
    TPL_TRY(tpl_iterate(c, at, in, &l));
    for (size_t i = 0; i < l->n; i++) {
        tpl_val v = l->items[i];
        if (attr.type != TPL_NONE)
            TPL_TRY(attr_path(c, at, v, attr, &v));
        if (!tpl_is_number(v) || !tpl_is_number(acc))
            return tpl_fail(c, at, LMS_ERR_FORMAT, "sum: unsupported operand types '%s' and '%s'",
                            tpl_type_name(acc), tpl_type_name(v));
        int64_t x = acc.type == TPL_BOOL ? acc.u.b : acc.u.i,
                y = v.type == TPL_BOOL ? v.u.b : v.u.i;
        if (acc.type != TPL_FLOAT && v.type != TPL_FLOAT) {
            if (lms_ckd_add(&x, x, y))
                return tpl_fail(c, at, LMS_ERR_RANGE, "integer overflow");
            acc = tpl_int(x);
        } else
            acc = tpl_float(tpl_as_double(acc) + tpl_as_double(v));
    }
    *out = acc;
    return 0;
}

/* ---- select / reject / map --------------------------------------------------------- */

/* Runs a test named by args[first] (with the rest as its arguments) on v;
 * no test name means truthiness. */
static int run_named_test(tpl_ctx *c, const tpl_node *at, tpl_val v, const tpl_args *a,
                          size_t first, bool *out)
{
    if (a->n_pos <= first) {
        *out = tpl_truthy(v);
        return 0;
    }
    tpl_val name = a->pos[first];
    char buf[32];
    int id = -1;
    if (name.type == TPL_STR && name.u.s.n < sizeof buf) {
        snprintf(buf, sizeof buf, "%.*s", (int)name.u.s.n, name.u.s.p);
        id = tpl_test_find(buf);
    }
    if (id < 0)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "unknown test '%.*s'",
                        name.type == TPL_STR ? (int)(name.u.s.n > 40 ? 40 : name.u.s.n) : 1,
                        name.type == TPL_STR ? name.u.s.p : "?");
    tpl_args rest = {a->pos + first + 1, a->n_pos - first - 1, a->kw_names, a->kw_vals, a->n_kw};
    return tpl_test_apply(c, at, id, v, &rest, out);
}

/* The items select/reject/map go through. Like jinja2 (`if value: for
 * item in value`) a false input, none or undefined included, gives none
 * rather than an error. The result is computed at once; the filter table
 * marks it a generator (TPL_F_GEN), so that it is true, has no length and
 * cannot go through tojson, as in Python. */
static int gen_source(tpl_ctx *c, const tpl_node *at, tpl_val in, tpl_list **l)
{
    if (tpl_truthy(in) || (in.type == TPL_UNDEF && (in.flags & TPL_F_UNSAFE)))
        return tpl_iterate(c, at, in, l);
    *l = tpl_list_new(&c->arena, 0);
    return *l ? 0 : tpl_fail_nomem(c, at);
}

/* select / reject / selectattr / rejectattr; mode bits: SEL_ATTR tests an
 * attribute of each item, SEL_KEEP keeps the items that pass. */
enum { SEL_ATTR = 1, SEL_KEEP = 2 };

static int f_select(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int mode,
                    tpl_val *out)
{
    bool by_attr = mode & SEL_ATTR, keep = mode & SEL_KEEP;
    tpl_list *l = NULL;
    TPL_TRY(gen_source(c, at, in, &l));
    if (by_attr && a->n_pos == 0)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "Missing parameter for attribute name");
    tpl_list *r = tpl_list_new(&c->arena, l->n);
    if (!r)
        return tpl_fail_nomem(c, at);
    for (size_t i = 0; i < l->n; i++) {
        tpl_val v = l->items[i];
        bool ok;
        if (by_attr)
            TPL_TRY(attr_path(c, at, v, a->pos[0], &v));
        TPL_TRY(run_named_test(c, at, v, a, by_attr ? 1 : 0, &ok));
        if (ok == keep)
            r->items[r->n++] = l->items[i];
    }
    *out = tpl_list_val(r);
    return 0;
}

/* map(attribute="x", default=...) or map("filter", args...). */
static int f_map(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                 tpl_val *out)
{
    tpl_list *l = NULL;
    TPL_TRY(gen_source(c, at, in, &l));
    tpl_list *r = tpl_list_new(&c->arena, l->n);
    if (!r)
        return tpl_fail_nomem(c, at);
    tpl_val attr, def;
    bool by_attr = a->n_pos == 0 && tpl_arg(a, 99, "attribute", &attr);
    bool has_def = tpl_arg(a, 99, "default", &def);
    int id = -1;
    if (!by_attr) {
        char buf[32];
        if (a->n_pos == 0 || a->pos[0].type != TPL_STR || a->pos[0].u.s.n >= sizeof buf)
            return tpl_fail(c, at, LMS_ERR_FORMAT, "map: expected a filter name or attribute=");
        snprintf(buf, sizeof buf, "%.*s", (int)a->pos[0].u.s.n, a->pos[0].u.s.p);
        if ((id = tpl_filter_find(buf)) < 0)
            return tpl_fail(c, at, LMS_ERR_FORMAT, "unknown filter '%s'", buf);
    }
    tpl_args rest = {a->pos + 1, a->n_pos ? a->n_pos - 1 : 0, a->kw_names, a->kw_vals, a->n_kw};
    for (size_t i = 0; i < l->n; i++) {
        tpl_val v = l->items[i];
        if (by_attr) {
            TPL_TRY(attr_path(c, at, v, attr, &v));
            if (v.type == TPL_UNDEF && has_def)
                v = def;
        } else {
            TPL_TRY(tpl_filter_apply(c, at, id, v, &rest, &v));
        }
        r->items[r->n++] = v;
    }
    *out = tpl_list_val(r);
    return 0;
}

/* ---- filter table ------------------------------------------------------------------ */

/* ---- wordwrap: Python's textwrap as jinja2 calls it ---------------------------------- */

/* One line being wrapped, as code points. */
typedef struct wrap_line {
    const uint32_t *cp;
    size_t n;
} wrap_line;

typedef struct wrap_piece {
    size_t start, end; /* code point indices */
} wrap_piece;

static bool ascii_ws(uint32_t cp) { return cp == ' ' || (cp >= '\t' && cp <= '\r'); }

/* Python re's \w (str.isalnum() or "_"), its letters ([^\d\W]) and
 * textwrap's word_punct ([\w!"'&.,?]). */
static bool re_word(uint32_t cp)
{
    if (cp == '_')
        return true;
    utf8proc_category_t k = cp > 0x10FFFF ? UTF8PROC_CATEGORY_CN
                                          : utf8proc_category((utf8proc_int32_t)cp);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
           (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

static bool re_letter(uint32_t cp)
{
    return re_word(cp) && utf8proc_category((utf8proc_int32_t)cp) != UTF8PROC_CATEGORY_ND;
}

static bool word_punct(uint32_t cp) { return re_word(cp) || (cp < 0x80 && strchr("!\"'&.,?", (int)cp)); }

static bool letter_at(const wrap_line *l, size_t i) { return i < l->n && re_letter(l->cp[i]); }

/* (?<=word_punct)-{2,}(?=\w) at i: an em-dash "--" between words. */
static size_t em_dash(const wrap_line *l, size_t i)
{
    if (i == 0 || i >= l->n || !word_punct(l->cp[i - 1]))
        return 0;
    size_t e = i;
    while (e < l->n && l->cp[e] == '-')
        e++;
    return e - i >= 2 && e < l->n && re_word(l->cp[e]) ? e - i : 0;
}

/* The hyphen at i ends a chunk: letter letter "-" or letter "-" letter
 * "-" before, letter ["-"] letter after (textwrap's wordsep_re). */
static bool hyphen_breaks(const wrap_line *l, size_t i)
{
    const uint32_t *c = l->cp;
    bool before = (i >= 2 && letter_at(l, i - 2) && letter_at(l, i - 1)) ||
                  (i >= 3 && letter_at(l, i - 3) && c[i - 2] == '-' && letter_at(l, i - 1));
    return before && letter_at(l, i + 1) &&
           (letter_at(l, i + 2) || (i + 2 < l->n && c[i + 2] == '-' && letter_at(l, i + 3)));
}

/* textwrap's _split: whitespace runs, em-dashes and words (cut after
 * hyphens inside them when break_on_hyphens). Returns the chunk count. */
static size_t wrap_split(const wrap_line *l, bool hyphens, wrap_piece *out)
{
    size_t nc = 0;
    for (size_t p = 0, q; p < l->n; p = q) {
        size_t dash = hyphens ? em_dash(l, p) : 0;
        if (ascii_ws(l->cp[p])) {
            for (q = p; q < l->n && ascii_ws(l->cp[q]);)
                q++;
        } else if (dash) {
            q = p + dash;
        } else {
            for (q = p + 1; q < l->n && !ascii_ws(l->cp[q]); q++) {
                if (!hyphens)
                    continue;
                if (l->cp[q] == '-' && hyphen_breaks(l, q)) {
                    q++;
                    break;
                }
                if (em_dash(l, q))
                    break;
            }
        }
        out[nc++] = (wrap_piece){p, q};
    }
    return nc;
}

static bool piece_blank(const wrap_line *l, wrap_piece w)
{
    for (size_t i = w.start; i < w.end; i++)
        if (!tpl_cp_is_space(l->cp[i]))
            return false;
    return true;
}

typedef struct wrap_opts {
    int64_t width;
    bool break_long, hyphens;
    tpl_val sep;
} wrap_opts;

/* textwrap.wrap(line) joined by o->sep onto b (Python's _wrap_chunks with
 * drop_whitespace, no indents). offs maps code points to bytes of src. */
static int wrap_one(tpl_buf *b, const char *src, const size_t *offs, const wrap_line *l,
                    const wrap_opts *o, wrap_piece *chunks, wrap_piece *cur)
{
    size_t nc = wrap_split(l, o->hyphens, chunks), k = 0;
    size_t width = (size_t)o->width;
    bool any = false;
    int rc = 0;
    while (k < nc && rc == 0) {
        size_t ncur = 0, cur_len = 0;
        if (any && piece_blank(l, chunks[k]))
            k++;
        while (k < nc && cur_len + (chunks[k].end - chunks[k].start) <= width) {
            cur_len += chunks[k].end - chunks[k].start;
            cur[ncur++] = chunks[k++];
        }
        if (k < nc && chunks[k].end - chunks[k].start > width) {
            wrap_piece *w = &chunks[k];
            size_t space_left = width - cur_len, end = space_left;
            if (o->break_long) {
                if (o->hyphens && w->end - w->start > space_left) {
                    /* cut after the last hyphen that fits, if text precedes it */
                    size_t h = space_left;
                    while (h > 0 && l->cp[w->start + h - 1] != '-')
                        h--;
                    bool text = false;
                    for (size_t i = 0; h > 1 && i + 1 < h; i++)
                        text |= l->cp[w->start + i] != '-';
                    if (h > 1 && text)
                        end = h;
                }
                cur[ncur++] = (wrap_piece){w->start, w->start + end};
                w->start += end;
            } else if (ncur == 0) {
                cur[ncur++] = chunks[k++];
            }
        }
        if (ncur && piece_blank(l, cur[ncur - 1]))
            ncur--;
        if (ncur) {
            if (any)
                rc = tpl_buf_put(b, o->sep.u.s.p, o->sep.u.s.n);
            if (rc == 0)
                rc = tpl_buf_put(b, src + offs[cur[0].start],
                                 offs[cur[ncur - 1].end] - offs[cur[0].start]);
            any = true;
        }
    }
    return rc;
}

/* Python's str.splitlines() boundaries. */
static bool line_break(uint32_t cp)
{
    return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) ||
           cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

/* wordwrap(width=79, break_long_words=True, wrapstring=None,
 * break_on_hyphens=True): each line of s wrapped on its own, all joined by
 * wrapstring ("\n" by default). */
static int f_wordwrap(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                      tpl_val *out)
{
    if (in.type != TPL_STR)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "wordwrap: expected a string, not %s",
                        tpl_type_name(in));
    wrap_opts o = {.width = int_or(a, 0, "width", 79),
                   .break_long = bool_or(a, 1, "break_long_words", true),
                   .hyphens = bool_or(a, 3, "break_on_hyphens", true)};
    arg_or(a, 2, "wrapstring", tpl_none(), &o.sep);
    if (o.sep.type == TPL_NONE)
        o.sep = tpl_cstr("\n");
    else if (o.sep.type != TPL_STR)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "wordwrap: wrapstring must be a string, not %s",
                        tpl_type_name(o.sep));
    size_t n = in.u.s.n;
    uint32_t *cps = malloc((n + 1) * sizeof *cps);
    size_t *offs = malloc((n + 1) * sizeof *offs);
    wrap_piece *chunks = malloc((n + 1) * sizeof *chunks), *cur = malloc((n + 1) * sizeof *cur);
    tpl_buf b = {.max_bytes = c->lim.max_output_bytes};
    int rc = cps && offs && chunks && cur ? 0 : LMS_ERR_NOMEM;
    size_t m = 0;
    for (size_t i = 0, k; i < n && rc == 0; i += k) {
        offs[m] = i;
        cps[m++] = tpl_utf8_decode(in.u.s.p + i, n - i, &k);
    }
    if (rc == 0)
        offs[m] = n;
    bool first = true;
    for (size_t p = 0; p < m && rc == 0;) {
        size_t e = p;
        while (e < m && !line_break(cps[e]))
            e++;
        if (o.width <= 0) {
            rc = tpl_fail(c, at, LMS_ERR_FORMAT, "wordwrap: invalid width %lld (must be > 0)",
                          (long long)o.width);
            break;
        }
        if (!first)
            rc = tpl_buf_put(&b, o.sep.u.s.p, o.sep.u.s.n);
        first = false;
        wrap_line l = {cps + p, e - p};
        if (rc == 0)
            rc = wrap_one(&b, in.u.s.p, offs + p, &l, &o, chunks, cur);
        /* "\r\n" is one boundary */
        p = e + (e < m) + (e + 1 < m && cps[e] == '\r' && cps[e + 1] == '\n');
    }
    free(cps);
    free(offs);
    free(chunks);
    free(cur);
    return tpl_buf_finish(c, at, &b, rc, out);
}

/* ---- striptags ---------------------------------------------------------------- */

/* html.unescape of one "&..." reference at p (n bytes, p[0] == '&'): what
 * it stands for goes to b, and the bytes it used are returned. Numeric
 * references follow Python exactly; of the named ones only amp, lt, gt,
 * quot, apos and nbsp are known (others are left as written). */
static size_t put_charref(tpl_buf *b, const char *p, size_t n, int *rc)
{
    /* Windows-1252 for &#128; .. &#159;, as HTML says (0 = keep the code point) */
    static const uint16_t k_cp1252[32] = {
        0x20AC, 0,      0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160,
        0x2039, 0x0152, 0,      0x017D, 0,      0,      0x2018, 0x2019, 0x201C, 0x201D, 0x2022,
        0x2013, 0x2014, 0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0,      0x017E, 0x0178};
    static const struct {
        const char *name;
        const char *text;
        bool bare; /* also valid without ";" (HTML's legacy names) */
    } k_named[] = {{"amp", "&", true},   {"AMP", "&", true},   {"lt", "<", true},
                   {"LT", "<", true},    {"gt", ">", true},    {"GT", ">", true},
                   {"quot", "\"", true}, {"QUOT", "\"", true}, {"apos", "'", false},
                   {"nbsp", "\xc2\xa0", true}};
    char u[4];
    size_t i = 1;
    if (i < n && p[i] == '#') {
        bool hex = i + 1 < n && (p[i + 1] == 'x' || p[i + 1] == 'X');
        size_t d0 = i + 1 + hex, d = d0;
        uint32_t num = 0;
        for (; d < n; d++) {
            int v = p[d] >= '0' && p[d] <= '9'                ? p[d] - '0'
                    : hex && (p[d] | 0x20) >= 'a' && (p[d] | 0x20) <= 'f' ? (p[d] | 0x20) - 'a' + 10
                                                               : -1;
            if (v < 0)
                break;
            num = num > 0x10FFFF ? num : num * (hex ? 16 : 10) + (uint32_t)v;
        }
        if (d == d0) { /* "&#" alone is text */
            *rc = tpl_buf_putc(b, '&');
            return 1;
        }
        size_t used = d + (d < n && p[d] == ';');
        if (num == 0 || (num >= 0xD800 && num <= 0xDFFF) || num > 0x10FFFF)
            num = 0xFFFD;
        else if (num >= 0x80 && num <= 0x9F && k_cp1252[num - 0x80])
            num = k_cp1252[num - 0x80];
        else if (num != 0x0D && num != 0x81 && num != 0x8D && num != 0x8F && num != 0x90 &&
                 num != 0x9D &&
                 ((num >= 0x01 && num <= 0x08) || num == 0x0B || (num >= 0x0E && num <= 0x1F) ||
                  (num >= 0x7F && num <= 0x9F) || (num >= 0xFDD0 && num <= 0xFDEF) ||
                  (num & 0xFFFE) == 0xFFFE))
            return used; /* a code point HTML forbids: dropped */
        *rc = tpl_buf_put(b, u, tpl_utf8_put(u, num));
        return used;
    }
    /* a name: up to 32 bytes of anything but these, then maybe ";" */
    size_t e = i;
    while (e < n && e - i < 32 && !strchr("\t\n\f <&#;", p[e]))
        e++;
    bool semi = e < n && p[e] == ';' && e > i;
    for (size_t k = 0; k < sizeof k_named / sizeof k_named[0]; k++)
        if ((semi || k_named[k].bare) && strlen(k_named[k].name) == e - i &&
            !memcmp(k_named[k].name, p + i, e - i)) {
            *rc = tpl_buf_put(b, k_named[k].text, strlen(k_named[k].text));
            return e + semi;
        }
    /* the longest legacy name that starts the rest (Python's fallback) */
    size_t best = 0, best_k = 0, len = e - i + semi;
    for (size_t k = 0; k < sizeof k_named / sizeof k_named[0]; k++) {
        size_t m = strlen(k_named[k].name);
        if (k_named[k].bare && m < len && m > best && !memcmp(k_named[k].name, p + i, m)) {
            best = m;
            best_k = k;
        }
    }
    if (best) {
        *rc = tpl_buf_put(b, k_named[best_k].text, strlen(k_named[best_k].text));
        return i + best;
    }
    *rc = tpl_buf_putc(b, '&');
    return 1;
}

/* striptags: markupsafe's Markup.striptags: remove "<!--...-->" comments,
 * then "<...>" tags (each search restarting from the text's start, which
 * this does in one pass), collapse whitespace runs to one space, then
 * html.unescape. */
static int f_striptags(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                       tpl_val *out)
{
    TPL_TRY(tpl_to_str(c, at, in, &in));
    const char *s = in.u.s.p;
    size_t n = in.u.s.n, i = 0;
    tpl_buf b1 = {.max_bytes = c->lim.max_output_bytes}, b2 = b1, b3 = b1;
    int rc = 0;
    /* comments: a removal can join "<!" and "--" into a new start, so
     * look for one at the end of what is kept */
    bool no_end = false;
    while (i < n && rc == 0) {
        if (no_end) {
            rc = tpl_buf_put(&b1, s + i, n - i);
            break;
        }
        rc = tpl_buf_putc(&b1, s[i++]);
        if (rc || b1.n < 4 || memcmp(b1.p + b1.n - 4, "<!--", 4) != 0)
            continue;
        /* "-->" may overlap the start: "<!-->" and "<!--->" close at once */
        size_t after;
        if (i < n && s[i] == '>') {
            after = i + 1;
        } else if (i + 1 < n && s[i] == '-' && s[i + 1] == '>') {
            after = i + 2;
        } else {
            const char *e = memmem(s + i, n - i, "-->", 3);
            if (!e) {
                no_end = true;
                continue;
            }
            after = (size_t)(e - s) + 3;
        }
        b1.n -= 4;
        i = after;
    }
    /* tags */
    for (size_t j = 0; j < b1.n && rc == 0;) {
        const char *gt = b1.p[j] == '<' ? memchr(b1.p + j + 1, '>', b1.n - j - 1) : NULL;
        if (gt) {
            j = (size_t)(gt - b1.p) + 1;
        } else if (b1.p[j] == '<') {
            rc = tpl_buf_put(&b2, b1.p + j, b1.n - j);
            break;
        } else {
            rc = tpl_buf_putc(&b2, b1.p[j++]);
        }
    }
    /* " ".join(value.split()) */
    bool gap = false;
    for (size_t j = 0, k; j < b2.n && rc == 0; j += k) {
        uint32_t cp = tpl_utf8_decode(b2.p + j, b2.n - j, &k);
        if (tpl_cp_is_space(cp) && !(k == 1 && cp >= 0x80)) {
            gap = b3.n > 0;
            continue;
        }
        if (gap)
            rc = tpl_buf_putc(&b3, ' ');
        gap = false;
        if (rc == 0)
            rc = tpl_buf_put(&b3, b2.p + j, k);
    }
    /* html.unescape */
    tpl_buf_free(&b1);
    b1 = (tpl_buf){.max_bytes = c->lim.max_output_bytes};
    for (size_t j = 0; j < b3.n && rc == 0;) {
        if (b3.p[j] == '&')
            j += put_charref(&b1, b3.p + j, b3.n - j, &rc);
        else
            rc = tpl_buf_putc(&b1, b3.p[j++]);
    }
    tpl_buf_free(&b2);
    tpl_buf_free(&b3);
    return tpl_buf_finish(c, at, &b1, rc, out);
}

/* filesizeformat(binary): jinja2's human-readable size ("1 Byte", "12
 * Bytes", "1.5 kB" / "1.5 KiB" ... up to yottabytes). */
static int f_filesizeformat(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a,
                            int arg, tpl_val *out)
{
    static const char *const k_dec[] = {"kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
    static const char *const k_bin[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
    /* base ** (i + 2) as Python's int -> float gives it (exact decimal literals) */
    static const double k_dec_unit[] = {1e6, 1e9, 1e12, 1e15, 1e18, 1e21, 1e24, 1e27};
    bool binary = bool_or(a, 0, "binary", false);
    double bytes, base = binary ? 1024.0 : 1000.0;
    int64_t i;
    if (tpl_is_number(in))
        bytes = tpl_as_double(in);
    else if (in.type != TPL_STR || !parse_number(in, true, 10, &bytes, &i))
        return tpl_fail(c, at, LMS_ERR_FORMAT, "filesizeformat: cannot convert %s to float",
                        tpl_type_name(in));
    tpl_buf b = {.max_bytes = c->lim.max_output_bytes};
    int rc;
    if (bytes == 1) {
        rc = tpl_buf_put(&b, "1 Byte", 6);
    } else if (bytes < base) {
        if (isinf(bytes)) /* int(-inf) */
            return tpl_fail(c, at, LMS_ERR_FORMAT, "filesizeformat: cannot convert -inf to int");
        rc = fabs(bytes) < 9.2e18 ? tpl_buf_printf(&b, "%lld Bytes", (long long)bytes)
                                  : tpl_buf_printf(&b, "%.0f Bytes", trunc(bytes));
    } else {
        int k = 0;
        double unit = binary ? 1048576.0 : k_dec_unit[0];
        for (; k < 7 && !(bytes < unit); k++)
            unit = binary ? unit * 1024.0 : k_dec_unit[k + 1];
        double v = base * bytes / unit;
        const char *prefix = binary ? k_bin[k] : k_dec[k];
        rc = isnan(v) ? tpl_buf_printf(&b, "nan %s", prefix)
                      : tpl_buf_printf(&b, "%.1f %s", v, prefix);
    }
    return tpl_buf_finish(c, at, &b, rc, out);
}

/* jinja2's url_quote: UTF-8 bytes, all but A-Z a-z 0-9 _ . - ~ (and "/"
 * unless for a query string) as %XX; spaces as "+" in a query string. */
static int url_quote(tpl_ctx *c, const tpl_node *at, tpl_buf *b, tpl_val v, bool for_qs)
{
    TPL_TRY(tpl_to_str(c, at, v, &v));
    int rc = 0;
    for (size_t i = 0; i < v.u.s.n && rc == 0; i++) {
        unsigned char ch = (unsigned char)v.u.s.p[i];
        if ((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
            strchr("_.-~", ch) || (ch == '/' && !for_qs))
            rc = tpl_buf_putc(b, (char)ch);
        else if (ch == ' ' && for_qs)
            rc = tpl_buf_putc(b, '+');
        else
            rc = tpl_buf_printf(b, "%%%02X", ch);
    }
    return rc;
}

/* A string of exactly two code points as a (key, value) pair. */
static bool str_pair(tpl_val s, tpl_val *k, tpl_val *v)
{
    size_t k1 = 0, k2 = 0;
    if (s.u.s.n == 0)
        return false;
    tpl_utf8_decode(s.u.s.p, s.u.s.n, &k1);
    if (k1 >= s.u.s.n)
        return false;
    tpl_utf8_decode(s.u.s.p + k1, s.u.s.n - k1, &k2);
    if (k1 + k2 != s.u.s.n)
        return false;
    *k = tpl_str(s.u.s.p, k1);
    *v = tpl_str(s.u.s.p + k1, k2);
    return true;
}

/* urlencode: a string (or any non-iterable) quoted for a URL path; a dict,
 * or an iterable of (key, value) pairs, as a query string "k=v&k2=v2". */
static int f_urlencode(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                       tpl_val *out)
{
    tpl_buf b = {.max_bytes = c->lim.max_output_bytes};
    int rc = 0;
    if (in.type != TPL_DICT && in.type != TPL_NS && in.type != TPL_LIST && in.type != TPL_UNDEF) {
        rc = url_quote(c, at, &b, in, false);
        return tpl_buf_finish(c, at, &b, rc, out);
    }
    tpl_list *items = NULL;
    if (in.type == TPL_LIST || in.type == TPL_UNDEF)
        rc = tpl_iterate(c, at, in, &items);
    for (size_t i = 0, n = in.type == TPL_DICT || in.type == TPL_NS ? in.u.d->n : items ? items->n : 0;
         i < n && rc == 0; i++) {
        tpl_val k, v;
        if (!items) {
            k = in.u.d->keys[i];
            v = in.u.d->vals[i];
        } else if (items->items[i].type == TPL_LIST && items->items[i].u.l->n == 2) {
            k = items->items[i].u.l->items[0];
            v = items->items[i].u.l->items[1];
        } else if (items->items[i].type == TPL_STR && str_pair(items->items[i], &k, &v)) {
            /* Python unpacks a two-character string too */
        } else {
            rc = tpl_fail(c, at, LMS_ERR_FORMAT, "urlencode: item %zu is not a (key, value) pair",
                          i);
            break;
        }
        if (i)
            rc = tpl_buf_putc(&b, '&');
        if (rc == 0)
            rc = url_quote(c, at, &b, k, true);
        if (rc == 0)
            rc = tpl_buf_putc(&b, '=');
        if (rc == 0)
            rc = url_quote(c, at, &b, v, true);
    }
    return tpl_buf_finish(c, at, &b, rc, out);
}

typedef struct filter_def {
    const char *name;
    filter_fn fn;
    const char *params; /* accepted names, comma-separated; NULL = any */
    int arg;            /* passed to fn */
} filter_def;

static const filter_def k_filters[] = {
    {"abs", f_abs, "", 0},
    {"attr", f_attr, "name", 0},
    {"batch", f_rows, "linecount,fill_with", 0},
    {"capitalize", f_case, "", TPL_CASE_CAPITALIZE},
    {"center", f_center, "width", 0},
    {"count", f_length, "", 0},
    {"d", f_default, "default_value,boolean", 0},
    {"default", f_default, "default_value,boolean", 0},
    {"dictsort", f_dictsort, "case_sensitive,by,reverse", 0},
    {"groupby", f_groupby, "attribute,default,case_sensitive", 0},
    {"e", f_escape, "", 0},
    {"escape", f_escape, "", 0},
    {"forceescape", f_escape, "", 1},
    {"first", f_first_last, "", false},
    {"filesizeformat", f_filesizeformat, "binary", 0},
    {"float", f_float, "default", 0},
    {"format", f_format, NULL, 0},
    {"indent", f_indent, "width,first,blank", 0},
    {"int", f_int, "default,base", 0},
    {"items", f_items, "", 0},
    {"join", f_join, "d,attribute", 0},
    {"last", f_first_last, "", true},
    {"length", f_length, "", 0},
    {"list", f_list, "", 0},
    {"lower", f_case, "", TPL_CASE_LOWER},
    {"map", f_map, NULL, 0},
    {"max", f_minmax, "case_sensitive,attribute", true},
    {"min", f_minmax, "case_sensitive,attribute", false},
    {"pprint", f_pprint, "", 0},
    {"reject", f_select, NULL, 0},
    {"rejectattr", f_select, NULL, SEL_ATTR},
    {"replace", f_replace, "old,new,count", 0},
    {"reverse", f_reverse, "", 0},
    {"round", f_round, "precision,method", 0},
    {"safe", f_safe, "", 0},
    {"select", f_select, NULL, SEL_KEEP},
    {"selectattr", f_select, NULL, SEL_ATTR | SEL_KEEP},
    {"slice", f_rows, "slices,fill_with", 1},
    {"sort", f_sort, "reverse,case_sensitive,attribute", 0},
    {"string", f_string, "", 0},
    {"striptags", f_striptags, "", 0},
    {"sum", f_sum, "attribute,start", 0},
    {"title", f_case, "", TPL_CASE_JTITLE},
    {"tojson", f_tojson, "ensure_ascii,indent,separators,sort_keys", 0},
    {"trim", f_trim, "chars", 0},
    {"truncate", f_truncate, "length,killwords,end,leeway", 0},
    {"unique", f_unique, "case_sensitive,attribute", 0},
    {"upper", f_case, "", TPL_CASE_UPPER},
    {"urlencode", f_urlencode, "", 0},
    {"wordcount", f_wordcount, "", 0},
    {"wordwrap", f_wordwrap, "width,break_long_words,wrapstring,break_on_hyphens", 0},
};

#define N_FILTERS (int)(sizeof k_filters / sizeof k_filters[0])

int tpl_filter_find(const char *name)
{
    for (int k = 0; k < N_FILTERS; k++)
        if (strcmp(k_filters[k].name, name) == 0)
            return k;
    return -1;
}

int tpl_filter_apply(tpl_ctx *c, const tpl_node *at, int id, tpl_val in, const tpl_args *a,
                     tpl_val *out)
{
    const filter_def *f = &k_filters[id];
    if (f->params) {
        char what[48];
        snprintf(what, sizeof what, "filter '%s'", f->name);
        TPL_TRY(tpl_args_check(c, at, a, what, f->params));
    }
    TPL_TRY(tpl_tick(c, at));
    TPL_TRY(f->fn(c, at, in, a, f->arg, out));
    /* these give a generator or iterator in jinja2: mark a list result so */
    bool gen = f->fn == f_select || f->fn == f_map || f->fn == f_rows || f->fn == f_items ||
               f->fn == f_reverse || f->fn == f_unique;
    if (gen && out->type == TPL_LIST)
        out->flags = TPL_F_GEN;
    return 0;
}

/* ---- tests ------------------------------------------------------------------------ */

static int t_arg(tpl_ctx *c, const tpl_node *at, const tpl_args *a, const char *test, tpl_val *v)
{
    if (!tpl_arg(a, 0, "other", v) && !tpl_arg(a, 0, "value", v) && !tpl_arg(a, 0, "num", v))
        return tpl_fail(c, at, LMS_ERR_FORMAT, "test '%s' needs an argument", test);
    return 0;
}

/* op: 0 ==, 1 !=, 2 <, 3 <=, 4 >, 5 >= */
static int t_compare(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int op,
                     bool *out)
{
    tpl_val other;
    bool lt;
    TPL_TRY(t_arg(c, at, a, "comparison", &other));
    if (op == 0 || op == 1) {
        *out = tpl_equal(in, other) == (op == 0);
        return 0;
    }
    /* 2: <, 3: <=, 4: >, 5: >= */
    tpl_val x = op == 2 || op == 5 ? in : other, y = op == 2 || op == 5 ? other : in;
    if (!tpl_less(x, y, &lt))
        return tpl_fail(c, at, LMS_ERR_FORMAT, "values of types '%s' and '%s' cannot be compared",
                        tpl_type_name(in), tpl_type_name(other));
    *out = op == 2 || op == 4 ? lt : !lt;
    return 0;
}

/* Type tests that need no arguments, by a bit per enum tpl_type. */
static bool type_in(tpl_val v, unsigned mask) { return (mask >> v.type) & 1u; }

#define B(t) (1u << (t))
enum {
    TT_DEFINED,
    TT_UNDEFINED,
    TT_NONE,
    TT_BOOLEAN,
    TT_FALSE,
    TT_TRUE,
    TT_INTEGER,
    TT_FLOAT,
    TT_NUMBER,
    TT_STRING,
    TT_MAPPING,
    TT_ITERABLE,
    TT_SEQUENCE,
    TT_CALLABLE
};
static const unsigned k_type_masks[] = {
    [TT_INTEGER] = B(TPL_INT),
    [TT_FLOAT] = B(TPL_FLOAT),
    [TT_NUMBER] = B(TPL_INT) | B(TPL_FLOAT) | B(TPL_BOOL),
    [TT_STRING] = B(TPL_STR),
    [TT_MAPPING] = B(TPL_DICT),
    /* jinja2's Undefined iterates (empty) and has __len__/__getitem__ */
    [TT_ITERABLE] = B(TPL_LIST) | B(TPL_DICT) | B(TPL_STR) | B(TPL_UNDEF) | B(TPL_LOOP),
    [TT_SEQUENCE] = B(TPL_LIST) | B(TPL_DICT) | B(TPL_STR) | B(TPL_UNDEF),
    [TT_CALLABLE] = B(TPL_MACRO) | B(TPL_FUNC) | B(TPL_METHOD),
};

static bool type_test(int which, tpl_val v)
{
    switch (which) {
    case TT_DEFINED: return v.type != TPL_UNDEF;
    case TT_UNDEFINED: return v.type == TPL_UNDEF;
    case TT_NONE: return v.type == TPL_NONE;
    case TT_BOOLEAN: return v.type == TPL_BOOL;
    case TT_FALSE: return v.type == TPL_BOOL && !v.u.b;
    case TT_TRUE: return v.type == TPL_BOOL && v.u.b;
    case TT_SEQUENCE: return type_in(v, k_type_masks[which]) && !(v.flags & TPL_F_GEN);
    default: return type_in(v, k_type_masks[which]);
    }
}

static int t_type(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int which,
                  bool *out)
{
    *out = type_test(which, in);
    return 0;
}

static int parity(tpl_ctx *c, const tpl_node *at, tpl_val in, int64_t mod, int64_t want, bool *out)
{
    if (in.type != TPL_INT && in.type != TPL_BOOL)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "divisibility test on a %s", tpl_type_name(in));
    if (mod == 0)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "integer division or modulo by zero");
    int64_t v = in.type == TPL_BOOL ? in.u.b : in.u.i;
    int64_t r = mod == -1 ? 0 : v % mod;
    *out = (r < 0 ? -r : r) == want;
    return 0;
}

/* even (arg 0) and odd (arg 1) */
static int t_parity(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int odd,
                    bool *out)
{
    return parity(c, at, in, 2, odd, out);
}

static int t_divisibleby(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                         bool *out)
{
    tpl_val n;
    TPL_TRY(t_arg(c, at, a, "divisibleby", &n));
    if (n.type != TPL_INT)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "divisibleby needs an integer");
    return parity(c, at, in, n.u.i, 0, out);
}

static int t_in(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg, bool *out)
{
    tpl_val seq;
    tpl_list *l = NULL;
    TPL_TRY(t_arg(c, at, a, "in", &seq));
    if (seq.type == TPL_STR && in.type == TPL_STR) {
        *out = in.u.s.n == 0 || memmem(seq.u.s.p, seq.u.s.n, in.u.s.p, in.u.s.n);
        return 0;
    }
    if (seq.type == TPL_DICT || seq.type == TPL_NS) {
        *out = tpl_dict_find(seq.u.d, in) >= 0;
        return 0;
    }
    TPL_TRY(tpl_iterate(c, at, seq, &l));
    *out = false;
    for (size_t i = 0; i < l->n && !*out; i++)
        *out = tpl_equal(l->items[i], in);
    return 0;
}

static int t_sameas(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                    bool *out)
{
    tpl_val other;
    TPL_TRY(t_arg(c, at, a, "sameas", &other));
    /* Identity: containers by pointer, scalars by value and type. */
    *out = in.type == other.type &&
           (in.type == TPL_LIST  ? in.u.l == other.u.l
            : in.type == TPL_STR ? in.u.s.p == other.u.s.p && in.u.s.n == other.u.s.n
                                 : tpl_equal(in, other));
    return 0;
}

static int t_case(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int mode,
                  bool *out)
{
    tpl_val s;
    TPL_TRY(tpl_to_str(c, at, in, &s));
    *out = tpl_str_is_case(s, mode == TPL_CASE_UPPER);
    return 0;
}

static int t_escaped(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int arg,
                     bool *out)
{
    *out = in.type == TPL_STR && (in.flags & TPL_F_SAFE);
    return 0;
}

/* `is filter` (arg 1) / `is test` (arg 0): does a filter or test have that name? */
static int t_name_exists(tpl_ctx *c, const tpl_node *at, tpl_val in, const tpl_args *a, int filter,
                         bool *out)
{
    char buf[32];
    *out = false;
    if (in.type == TPL_STR && in.u.s.n < sizeof buf) {
        snprintf(buf, sizeof buf, "%.*s", (int)in.u.s.n, in.u.s.p);
        *out = (filter ? tpl_filter_find(buf) : tpl_test_find(buf)) >= 0;
    }
    return 0;
}

typedef struct test_def {
    const char *name;
    test_fn fn;
    int arg; /* passed to fn */
} test_def;

static const test_def k_tests[] = {
    {"boolean", t_type, TT_BOOLEAN},
    {"callable", t_type, TT_CALLABLE},
    {"defined", t_type, TT_DEFINED},
    {"divisibleby", t_divisibleby, 0},
    {"eq", t_compare, 0},
    {"equalto", t_compare, 0},
    {"==", t_compare, 0},
    {"escaped", t_escaped, 0},
    {"even", t_parity, 0},
    {"false", t_type, TT_FALSE},
    {"filter", t_name_exists, true},
    {"float", t_type, TT_FLOAT},
    {"ge", t_compare, 5},
    {">=", t_compare, 5},
    {"gt", t_compare, 4},
    {"greaterthan", t_compare, 4},
    {">", t_compare, 4},
    {"in", t_in, 0},
    {"integer", t_type, TT_INTEGER},
    {"iterable", t_type, TT_ITERABLE},
    {"le", t_compare, 3},
    {"<=", t_compare, 3},
    {"lower", t_case, TPL_CASE_LOWER},
    {"lt", t_compare, 2},
    {"lessthan", t_compare, 2},
    {"<", t_compare, 2},
    {"mapping", t_type, TT_MAPPING},
    {"ne", t_compare, 1},
    {"!=", t_compare, 1},
    {"none", t_type, TT_NONE},
    {"number", t_type, TT_NUMBER},
    {"odd", t_parity, 1},
    {"sameas", t_sameas, 0},
    {"sequence", t_type, TT_SEQUENCE},
    {"string", t_type, TT_STRING},
    {"test", t_name_exists, false},
    {"true", t_type, TT_TRUE},
    {"undefined", t_type, TT_UNDEFINED},
    {"upper", t_case, TPL_CASE_UPPER},
};

int tpl_test_find(const char *name)
{
    for (size_t k = 0; k < sizeof k_tests / sizeof k_tests[0]; k++)
        if (strcmp(k_tests[k].name, name) == 0)
            return (int)k;
    return -1;
}

int tpl_test_apply(tpl_ctx *c, const tpl_node *at, int id, tpl_val in, const tpl_args *a, bool *out)
{
    return k_tests[id].fn(c, at, in, a, k_tests[id].arg, out);
}
