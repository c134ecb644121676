/*
 * template_value.c - the value model of the template engine: an arena,
 * growable buffers, Python-like values (none, bool, int, float, str, list,
 * dict, ...), their equality and ordering, and their text forms: str(),
 * repr() and json.dumps().
 *
 * Also the UTF-8 helpers and the Python character classes (isspace,
 * isprintable, \w) that str methods and repr() need.
 *
 * Values are small structs passed by value; strings, lists and dicts point
 * into the render arena. Text forms follow CPython exactly where templates
 * can observe them (e.g. `{{ [1, 'a'] }}` prints "[1, 'a']", floats print
 * their shortest round-trip form, tojson separators are ", " and ": ").
 */
#include "model/template_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/ckd.h"
#include "base/err.h"

/* ---- arena ---------------------------------------------------------------- */

struct tpl_chunk {
    tpl_chunk *next;
    size_t used, cap;
    max_align_t data[];
};

#define TPL_CHUNK_BYTES (64 * 1024)

void tpl_arena_init(tpl_arena *a, size_t cap_bytes)
{
    a->head = NULL;
    a->used_bytes = 0;
    a->cap_bytes = cap_bytes;
    a->hit_cap = false;
}

void tpl_arena_deinit(tpl_arena *a)
{
    tpl_chunk *c = a->head;
    while (c) {
        tpl_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used_bytes = 0;
}

void *tpl_alloc(tpl_arena *a, size_t n)
{
    const size_t align = sizeof(max_align_t);
    size_t need = (n + align - 1) / align * align;
    if (need < n)
        return NULL;
    tpl_chunk *c = a->head;
    if (!c || c->cap - c->used < need) {
        size_t cap = need > TPL_CHUNK_BYTES ? need : TPL_CHUNK_BYTES;
        size_t total;
        if (lms_ckd_add(&total, cap, sizeof(tpl_chunk)) ||
            (a->cap_bytes && (total > a->cap_bytes || a->used_bytes > a->cap_bytes - total))) {
            a->hit_cap = true;
            return NULL;
        }
        c = malloc(total);
        if (!c)
            return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = a->head;
        a->head = c;
        a->used_bytes += total;
    }
    void *p = (char *)c->data + c->used;
    c->used += need;
    memset(p, 0, n);
    return p;
}

char *tpl_strdup(tpl_arena *a, const char *p, size_t n)
{
    if (n == SIZE_MAX)
        return NULL;
    char *s = tpl_alloc(a, n + 1);
    if (s && n)
        memcpy(s, p, n);
    return s;
}

/* ---- buffers -------------------------------------------------------------- */

static int buf_reserve(tpl_buf *b, size_t extra)
{
    size_t need;
    if (lms_ckd_add(&need, b->n, extra) || need == SIZE_MAX)
        return LMS_ERR_LIMIT;
    if (b->max_bytes && need > b->max_bytes)
        return LMS_ERR_LIMIT;
    if (need + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need + 1)
        cap = cap > SIZE_MAX / 2 ? need + 1 : cap * 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return LMS_ERR_NOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

int tpl_buf_put(tpl_buf *b, const char *p, size_t n)
{
    int rc = buf_reserve(b, n);
    if (rc < 0)
        return rc;
    if (n)
        memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int tpl_buf_putc(tpl_buf *b, char c) { return tpl_buf_put(b, &c, 1); }

int tpl_buf_printf(tpl_buf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp)
        return LMS_ERR_INVAL; /* only used for short numeric text */
    return tpl_buf_put(b, tmp, (size_t)n);
}

void tpl_buf_free(tpl_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ---- constructors --------------------------------------------------------- */

tpl_val tpl_undef(const char *name, size_t n, int owner)
{
    tpl_val v = {.type = TPL_UNDEF, .owner = (uint8_t)owner};
    v.u.s.p = name;
    v.u.s.n = n;
    return v;
}

tpl_val tpl_none(void) { return (tpl_val){.type = TPL_NONE}; }

tpl_val tpl_bool(bool b)
{
    tpl_val v = {.type = TPL_BOOL};
    v.u.b = b;
    return v;
}

tpl_val tpl_int(int64_t i)
{
    tpl_val v = {.type = TPL_INT};
    v.u.i = i;
    return v;
}

tpl_val tpl_float(double f)
{
    tpl_val v = {.type = TPL_FLOAT};
    v.u.f = f;
    return v;
}

tpl_val tpl_str(const char *p, size_t n)
{
    tpl_val v = {.type = TPL_STR};
    v.u.s.p = p ? p : "";
    v.u.s.n = n;
    return v;
}

tpl_val tpl_cstr(const char *p) { return tpl_str(p, strlen(p)); }

tpl_val tpl_list_val(tpl_list *l)
{
    tpl_val v = {.type = TPL_LIST};
    v.u.l = l;
    return v;
}

tpl_val tpl_dict_val(tpl_dict *d)
{
    tpl_val v = {.type = TPL_DICT};
    v.u.d = d;
    return v;
}

/* ---- lists and dicts ------------------------------------------------------- */

tpl_list *tpl_list_new(tpl_arena *a, size_t cap)
{
    tpl_list *l = tpl_alloc(a, sizeof *l);
    if (!l)
        return NULL;
    if (cap) {
        if (cap > SIZE_MAX / sizeof(tpl_val))
            return NULL;
        l->items = tpl_alloc(a, cap * sizeof(tpl_val));
        if (!l->items)
            return NULL;
        l->cap = cap;
    }
    return l;
}

/* Grows an arena array of tpl_val (old storage stays in the arena). */
static int grow_vals(tpl_arena *a, tpl_val **v, size_t n, size_t *cap)
{
    size_t ncap = *cap ? *cap * 2 : 4;
    if (ncap < *cap || ncap > SIZE_MAX / sizeof(tpl_val))
        return LMS_ERR_NOMEM;
    tpl_val *nv = tpl_alloc(a, ncap * sizeof(tpl_val));
    if (!nv)
        return LMS_ERR_NOMEM;
    if (n)
        memcpy(nv, *v, n * sizeof(tpl_val));
    *v = nv;
    *cap = ncap;
    return 0;
}

int tpl_list_push(tpl_arena *a, tpl_list *l, tpl_val v)
{
    if (l->n == l->cap) {
        int rc = grow_vals(a, &l->items, l->n, &l->cap);
        if (rc < 0)
            return rc;
    }
    l->items[l->n++] = v;
    return 0;
}

tpl_dict *tpl_dict_new(tpl_arena *a, size_t cap)
{
    tpl_dict *d = tpl_alloc(a, sizeof *d);
    if (!d)
        return NULL;
    if (cap) {
        if (cap > SIZE_MAX / sizeof(tpl_val))
            return NULL;
        d->keys = tpl_alloc(a, cap * sizeof(tpl_val));
        d->vals = tpl_alloc(a, cap * sizeof(tpl_val));
        if (!d->keys || !d->vals)
            return NULL;
        d->cap = cap;
    }
    return d;
}

long tpl_dict_find_str(const tpl_dict *d, const char *p, size_t n)
{
    for (size_t i = 0; i < d->n; i++) {
        const tpl_val *k = &d->keys[i];
        if (k->type == TPL_STR && k->u.s.n == n && memcmp(k->u.s.p, p, n) == 0)
            return (long)i;
    }
    return -1;
}

long tpl_dict_find(const tpl_dict *d, tpl_val key)
{
    if (key.type == TPL_STR)
        return tpl_dict_find_str(d, key.u.s.p, key.u.s.n);
    for (size_t i = 0; i < d->n; i++)
        if (tpl_equal(d->keys[i], key))
            return (long)i;
    return -1;
}

int tpl_dict_set(tpl_arena *a, tpl_dict *d, tpl_val key, tpl_val v)
{
    long i = tpl_dict_find(d, key);
    if (i >= 0) {
        d->vals[i] = v;
        return 0;
    }
    return tpl_dict_append(a, d, key, v);
}

int tpl_dict_append(tpl_arena *a, tpl_dict *d, tpl_val key, tpl_val v)
{
    if (d->n == d->cap) {
        size_t kcap = d->cap, vcap = d->cap;
        int rc = grow_vals(a, &d->keys, d->n, &kcap);
        if (rc == 0)
            rc = grow_vals(a, &d->vals, d->n, &vcap);
        if (rc < 0)
            return rc;
        d->cap = kcap;
    }
    d->keys[d->n] = key;
    d->vals[d->n] = v;
    d->n++;
    return 0;
}

/* ---- truth, numbers, equality, order --------------------------------------- */

bool tpl_truthy(tpl_val v)
{
    switch (v.type) {
    case TPL_UNDEF:
    case TPL_NONE: return false;
    case TPL_BOOL: return v.u.b;
    case TPL_INT: return v.u.i != 0;
    case TPL_FLOAT: return v.u.f != 0.0;
    case TPL_STR: return v.u.s.n != 0;
    case TPL_LIST: return v.u.l->n != 0 || (v.flags & TPL_F_GEN);
    case TPL_DICT: return v.u.d->n != 0;
    default: return true;
    }
}

bool tpl_is_number(tpl_val v)
{
    return v.type == TPL_INT || v.type == TPL_FLOAT || v.type == TPL_BOOL;
}

double tpl_as_double(tpl_val v)
{
    switch (v.type) {
    case TPL_BOOL: return v.u.b ? 1.0 : 0.0;
    case TPL_INT: return (double)v.u.i;
    case TPL_FLOAT: return v.u.f;
    default: return 0.0;
    }
}

static int64_t as_int(tpl_val v) { return v.type == TPL_BOOL ? (int64_t)v.u.b : v.u.i; }

static bool str_eq(tpl_val a, tpl_val b)
{
    return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
}

static bool dict_equal(const tpl_dict *a, const tpl_dict *b)
{
    if (a->n != b->n)
        return false;
    for (size_t i = 0; i < a->n; i++) {
        long j = tpl_dict_find(b, a->keys[i]);
        if (j < 0 || !tpl_equal(a->vals[i], b->vals[j]))
            return false;
    }
    return true;
}

bool tpl_equal(tpl_val a, tpl_val b)
{
    if (tpl_is_number(a) && tpl_is_number(b)) {
        if (a.type != TPL_FLOAT && b.type != TPL_FLOAT)
            return as_int(a) == as_int(b);
        return tpl_as_double(a) == tpl_as_double(b);
    }
    if (a.type != b.type)
        return false;
    switch (a.type) {
    case TPL_UNDEF:
    case TPL_NONE: return true;
    case TPL_STR: return str_eq(a, b);
    case TPL_LIST:
        if ((a.flags | b.flags) & TPL_F_GEN) /* a generator equals only itself */
            return a.u.l == b.u.l;
        if ((a.flags ^ b.flags) & TPL_F_TUPLE) /* (1, 2) != [1, 2] */
            return false;
        if (a.u.l->n != b.u.l->n)
            return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!tpl_equal(a.u.l->items[i], b.u.l->items[i]))
                return false;
        return true;
    case TPL_DICT: return dict_equal(a.u.d, b.u.d);
    case TPL_NS: return a.u.d == b.u.d;
    case TPL_MACRO: return a.u.m == b.u.m;
    case TPL_FUNC: return a.u.fn == b.u.fn;
    case TPL_LOOP: return a.u.loop == b.u.loop;
    default: return false;
    }
}

bool tpl_less(tpl_val a, tpl_val b, bool *lt)
{
    if (tpl_is_number(a) && tpl_is_number(b)) {
        if (a.type != TPL_FLOAT && b.type != TPL_FLOAT)
            *lt = as_int(a) < as_int(b);
        else
            *lt = tpl_as_double(a) < tpl_as_double(b);
        return true;
    }
    if (a.type == TPL_STR && b.type == TPL_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = memcmp(a.u.s.p, b.u.s.p, n); /* UTF-8 bytes order as code points */
        *lt = c < 0 || (c == 0 && a.u.s.n < b.u.s.n);
        return true;
    }
    if (a.type == TPL_LIST && b.type == TPL_LIST) {
        const tpl_list *x = a.u.l, *y = b.u.l;
        for (size_t i = 0; i < x->n && i < y->n; i++) {
            if (tpl_equal(x->items[i], y->items[i]))
                continue;
            return tpl_less(x->items[i], y->items[i], lt);
        }
        *lt = x->n < y->n;
        return true;
    }
    return false;
}

const char *tpl_type_name(tpl_val v)
{
    switch (v.type) {
    case TPL_UNDEF: return "Undefined";
    case TPL_NONE: return "NoneType";
    case TPL_BOOL: return "bool";
    case TPL_INT: return "int";
    case TPL_FLOAT: return "float";
    case TPL_STR: return "str";
    case TPL_LIST:
        return v.flags & TPL_F_GEN ? "generator" : v.flags & TPL_F_TUPLE ? "tuple" : "list";
    case TPL_DICT: return "dict";
    case TPL_NS: return "Namespace";
    case TPL_MACRO: return "Macro";
    case TPL_FUNC: return "function";
    case TPL_METHOD: return "method";
    case TPL_LOOP: return "LoopContext";
    default: return "object";
    }
}

/* ---- UTF-8 ---------------------------------------------------------------- */

size_t tpl_utf8_len(const char *p, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)p[i] & 0xC0) != 0x80;
    return k;
}

size_t tpl_utf8_offset(const char *p, size_t n, size_t i)
{
    size_t off = 0;
    while (off < n && i > 0) {
        off++;
        while (off < n && ((unsigned char)p[off] & 0xC0) == 0x80)
            off++;
        i--;
    }
    return off;
}

size_t tpl_utf8_put(char *o, uint32_t cp)
{
    if (cp >= 0xD800 && cp <= 0xDFFF)
        cp = 0xFFFD; /* lone surrogates cannot be UTF-8 */
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

uint32_t tpl_utf8_decode(const char *p, size_t n, size_t *len)
{
    const unsigned char *s = (const unsigned char *)p;
    size_t k = s[0] < 0x80 ? 1 : s[0] < 0xE0 ? 2 : s[0] < 0xF0 ? 3 : 4;
    if (k > n || s[0] >= 0xF8 || (s[0] >= 0x80 && s[0] < 0xC0)) {
        *len = 1;
        return s[0];
    }
    uint32_t cp = k == 1 ? s[0] : s[0] & (0x7F >> k);
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *len = 1;
            return s[0];
        }
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    *len = k;
    return cp;
}

bool tpl_cp_is_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool tpl_cp_is_printable(uint32_t cp)
{
    if (cp < 0x20 || cp == 0x7F)
        return false;
    if (cp < 0x7F)
        return true;
    if (cp == 0x20 || (cp >= 0x80 && cp <= 0xA0) || cp == 0xAD || tpl_cp_is_space(cp))
        return false;
    return !((cp >= 0x200B && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202E) ||
             (cp >= 0x2060 && cp <= 0x206F) || (cp >= 0xD800 && cp <= 0xF8FF) || cp == 0xFEFF ||
             (cp >= 0xFFF9 && cp <= 0xFFFB) || cp == 0xFFFE || cp == 0xFFFF || cp > 0x10FFFF);
}

bool tpl_cp_is_word(uint32_t cp)
{
    if (cp < 0x80)
        return cp == '_' || (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
    if (cp < 0xC0) /* Latin-1 punctuation, except the letters and digits in it */
        return cp == 0xAA || cp == 0xB2 || cp == 0xB3 || cp == 0xB5 || cp == 0xB9 || cp == 0xBA ||
               (cp >= 0xBC && cp <= 0xBE);
    return cp != 0xD7 && cp != 0xF7 && !tpl_cp_is_space(cp) && tpl_cp_is_printable(cp) &&
           !(cp >= 0x2000 && cp <= 0x206F) && !(cp >= 0x3000 && cp <= 0x303F) &&
           !(cp >= 0xFF00 && cp <= 0xFF0F);
}

/* ---- str() and repr() ----------------------------------------------------- */

int tpl_write_float(tpl_buf *b, double f)
{
    if (isnan(f))
        return tpl_buf_put(b, "nan", 3);
    if (isinf(f))
        return f > 0 ? tpl_buf_put(b, "inf", 3) : tpl_buf_put(b, "-inf", 4);
    char digits[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(digits, sizeof digits, "%.*e", prec - 1, f);
        if (strtod(digits, NULL) == f)
            break;
    }
    /* digits is now "-d.ddde+XX": split mantissa digits and exponent. */
    char mant[24];
    size_t nm = 0;
    const char *q = digits;
    bool neg = *q == '-';
    if (neg)
        q++;
    for (; *q && *q != 'e'; q++)
        if (*q != '.' && nm < sizeof mant - 1)
            mant[nm++] = *q;
    mant[nm] = 0;
    int exp10 = atoi(q + 1);
    char out[64];
    size_t o = 0;
    if (neg)
        out[o++] = '-';
    if (exp10 >= 16 || exp10 < -4) { /* Python repr switches to 1e+16 / 1e-05 */
        out[o++] = mant[0];
        if (nm > 1) {
            out[o++] = '.';
            memcpy(out + o, mant + 1, nm - 1);
            o += nm - 1;
        }
        o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d", exp10 < 0 ? '-' : '+',
                              exp10 < 0 ? -exp10 : exp10);
    } else if (exp10 < 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int k = -1; k > exp10; k--)
            out[o++] = '0';
        memcpy(out + o, mant, nm);
        o += nm;
    } else {
        for (int k = 0; k <= exp10 || k < (int)nm; k++) {
            if (k == exp10 + 1)
                out[o++] = '.';
            out[o++] = k < (int)nm ? mant[k] : '0';
        }
        if ((int)nm <= exp10 + 1) {
            out[o++] = '.';
            out[o++] = '0';
        }
    }
    return tpl_buf_put(b, out, o);
}

/* One code point as repr() writes it: printable ones as is, the others as
 * \xNN, \uNNNN or \UNNNNNNNN (Python's str.isprintable() rule). */
static int write_cp_repr(tpl_buf *b, const char *p, size_t k, uint32_t cp)
{
    if (tpl_cp_is_printable(cp) && !(k == 1 && cp >= 0x80))
        return tpl_buf_put(b, p, k);
    if (cp < 0x100)
        return tpl_buf_printf(b, "\\x%02x", cp);
    if (cp < 0x10000)
        return tpl_buf_printf(b, "\\u%04x", cp);
    return tpl_buf_printf(b, "\\U%08x", cp);
}

/* Python's repr of a str: single quotes unless it holds ' and no ". */
static int write_str_repr(tpl_buf *b, const char *p, size_t n)
{
    bool has_sq = memchr(p, '\'', n) != NULL, has_dq = memchr(p, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    int rc = tpl_buf_putc(b, q);
    for (size_t i = 0, k; i < n && rc == 0; i += k) {
        uint32_t cp = tpl_utf8_decode(p + i, n - i, &k);
        if (cp == (uint32_t)q || cp == '\\') {
            char e[2] = {'\\', (char)cp};
            rc = tpl_buf_put(b, e, 2);
        } else if (cp == '\n' || cp == '\r' || cp == '\t') {
            rc = tpl_buf_put(b, cp == '\n' ? "\\n" : cp == '\r' ? "\\r" : "\\t", 2);
        } else {
            rc = write_cp_repr(b, p + i, k, cp);
        }
    }
    return rc ? rc : tpl_buf_putc(b, q);
}

/* Containers print their items' repr; depth stops a namespace that holds
 * itself (Python prints "..." there too). */
#define TPL_REPR_MAX_DEPTH 100

static int write_str_d(tpl_buf *b, tpl_val v, int depth);

static int write_repr_d(tpl_buf *b, tpl_val v, int depth)
{
    switch (v.type) {
    case TPL_STR: return write_str_repr(b, v.u.s.p, v.u.s.n);
    case TPL_UNDEF: return tpl_buf_put(b, "Undefined", 9); /* [x] with x undefined */
    default: return write_str_d(b, v, depth);
    }
}

static int write_seq_repr(tpl_buf *b, const tpl_list *l, bool tuple, int depth)
{
    int rc = tpl_buf_putc(b, tuple ? '(' : '[');
    for (size_t i = 0; i < l->n && rc == 0; i++) {
        if (i)
            rc = tpl_buf_put(b, ", ", 2);
        if (rc == 0)
            rc = write_repr_d(b, l->items[i], depth + 1);
    }
    if (rc == 0 && tuple && l->n == 1)
        rc = tpl_buf_putc(b, ',');
    return rc ? rc : tpl_buf_putc(b, tuple ? ')' : ']');
}

static int write_dict_repr(tpl_buf *b, const tpl_dict *d, int depth)
{
    int rc = tpl_buf_putc(b, '{');
    for (size_t i = 0; i < d->n && rc == 0; i++) {
        if (i)
            rc = tpl_buf_put(b, ", ", 2);
        if (rc == 0)
            rc = write_repr_d(b, d->keys[i], depth + 1);
        if (rc == 0)
            rc = tpl_buf_put(b, ": ", 2);
        if (rc == 0)
            rc = write_repr_d(b, d->vals[i], depth + 1);
    }
    return rc ? rc : tpl_buf_putc(b, '}');
}

int tpl_write_repr(tpl_buf *b, tpl_val v) { return write_repr_d(b, v, 0); }

int tpl_write_str(tpl_buf *b, tpl_val v) { return write_str_d(b, v, 0); }

static int write_str_d(tpl_buf *b, tpl_val v, int depth)
{
    if (depth > TPL_REPR_MAX_DEPTH)
        return tpl_buf_put(b, "...", 3);
    switch (v.type) {
    case TPL_UNDEF: return 0;
    case TPL_NONE: return tpl_buf_put(b, "None", 4);
    case TPL_BOOL: return v.u.b ? tpl_buf_put(b, "True", 4) : tpl_buf_put(b, "False", 5);
    case TPL_INT: return tpl_buf_printf(b, "%lld", (long long)v.u.i);
    case TPL_FLOAT: return tpl_write_float(b, v.u.f);
    case TPL_STR: return tpl_buf_put(b, v.u.s.p, v.u.s.n);
    case TPL_LIST:
        if (v.flags & TPL_F_GEN) /* Python adds an address, which no test can match */
            return tpl_buf_put(b, "<generator object>", 18);
        return write_seq_repr(b, v.u.l, v.flags & TPL_F_TUPLE, depth);
    case TPL_DICT: return write_dict_repr(b, v.u.d, depth);
    case TPL_NS: {
        int rc = tpl_buf_put(b, "<Namespace ", 11);
        if (rc == 0)
            rc = write_dict_repr(b, v.u.d, depth);
        return rc ? rc : tpl_buf_putc(b, '>');
    }
    case TPL_MACRO: return tpl_buf_put(b, "<Macro>", 7);
    case TPL_FUNC: return tpl_buf_printf(b, "<function %s>", tpl_func_name(v.u.fn));
    case TPL_METHOD: return tpl_buf_printf(b, "<built-in method %s>", v.u.meth->name);
    case TPL_LOOP: return tpl_buf_put(b, "<LoopContext>", 13);
    default: return 0;
    }
}

/* ---- JSON (Python json.dumps) ---------------------------------------------- */

/* \uXXXX escapes (a surrogate pair above the BMP), for ensure_ascii. */
static int write_json_u(tpl_buf *b, uint32_t cp)
{
    if (cp < 0x10000)
        return tpl_buf_printf(b, "\\u%04x", cp);
    cp -= 0x10000;
    return tpl_buf_printf(b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
}

static int write_json_str(tpl_buf *b, const char *p, size_t n, bool ascii)
{
    int rc = tpl_buf_putc(b, '"');
    size_t run = 0; /* start of the pending run of plain bytes */
    for (size_t i = 0; i < n && rc == 0; i++) {
        unsigned char ch = (unsigned char)p[i];
        const char *esc = NULL;
        switch (ch) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (ch >= 0x20 && (!ascii || ch < 0x7f))
                continue;
        }
        rc = tpl_buf_put(b, p + run, i - run);
        if (rc == 0 && esc) {
            rc = tpl_buf_put(b, esc, strlen(esc));
        } else if (rc == 0 && ch >= 0x80) {
            size_t k;
            rc = write_json_u(b, tpl_utf8_decode(p + i, n - i, &k));
            i += k - 1;
        } else if (rc == 0) {
            rc = tpl_buf_printf(b, "\\u%04x", ch);
        }
        run = i + 1;
    }
    if (rc == 0)
        rc = tpl_buf_put(b, p + run, n - run);
    return rc ? rc : tpl_buf_putc(b, '"');
}

static int json_newline(tpl_buf *b, const tpl_json_opts *o, int depth)
{
    int rc = tpl_buf_putc(b, '\n');
    for (int i = 0; i < depth && rc == 0; i++) {
        if (o->indent_str)
            rc = tpl_buf_put(b, o->indent_str, strlen(o->indent_str));
        for (int k = 0; k < o->indent && !o->indent_str && rc == 0; k++)
            rc = tpl_buf_putc(b, ' ');
    }
    return rc;
}

static const char *json_item_sep(const tpl_json_opts *o)
{
    return o->item_sep ? o->item_sep : o->indent >= 0 ? "," : ", ";
}

/* A dict key as json.dumps writes it: strings as is, numbers and constants
 * converted; anything else is not serialisable. */
static int write_json_key(tpl_buf *b, tpl_val k, bool ascii, const char **bad)
{
    switch (k.type) {
    case TPL_STR: return write_json_str(b, k.u.s.p, k.u.s.n, ascii);
    case TPL_NONE: return tpl_buf_put(b, "\"null\"", 6);
    case TPL_BOOL: return k.u.b ? tpl_buf_put(b, "\"true\"", 6) : tpl_buf_put(b, "\"false\"", 7);
    case TPL_INT:
    case TPL_FLOAT: {
        int rc = tpl_buf_putc(b, '"');
        if (rc == 0)
            rc = k.type == TPL_INT ? tpl_buf_printf(b, "%lld", (long long)k.u.i)
                                   : tpl_write_float(b, k.u.f);
        return rc ? rc : tpl_buf_putc(b, '"');
    }
    default: *bad = tpl_type_name(k); return LMS_ERR_FORMAT;
    }
}

/* Order of dict entries: insertion order, or sorted by key (sort_keys).
 * False when two keys do not order (Python's sort raises: 1 vs "a"). */
static bool json_key_order(const tpl_dict *d, bool sort, size_t *idx)
{
    for (size_t i = 0; i < d->n; i++)
        idx[i] = i;
    if (!sort)
        return true;
    for (size_t i = 1; i < d->n; i++) { /* insertion sort: dicts are small */
        size_t k = idx[i], j = i;
        bool lt = true;
        while (j > 0 && lt) {
            if (!tpl_less(d->keys[k], d->keys[idx[j - 1]], &lt))
                return false;
            if (lt) {
                idx[j] = idx[j - 1];
                j--;
            }
        }
        idx[j] = k;
    }
    return true;
}

static int write_json_dict(tpl_buf *b, const tpl_dict *d, const tpl_json_opts *o, int depth,
                           const char **bad)
{
    if (d->n == 0)
        return tpl_buf_put(b, "{}", 2);
    size_t *idx = malloc(d->n * sizeof *idx);
    if (!idx)
        return LMS_ERR_NOMEM;
    if (!json_key_order(d, o->sort_keys, idx)) {
        free(idx);
        *bad = "'<' not supported between keys of different types";
        return LMS_ERR_FORMAT;
    }
    const char *isep = json_item_sep(o), *ksep = o->key_sep ? o->key_sep : ": ";
    int rc = tpl_buf_putc(b, '{');
    for (size_t i = 0; i < d->n && rc == 0; i++) {
        if (i)
            rc = tpl_buf_put(b, isep, strlen(isep));
        if (rc == 0 && o->indent >= 0)
            rc = json_newline(b, o, depth + 1);
        if (rc == 0)
            rc = write_json_key(b, d->keys[idx[i]], o->ensure_ascii, bad);
        if (rc == 0)
            rc = tpl_buf_put(b, ksep, strlen(ksep));
        if (rc == 0)
            rc = tpl_write_json(b, d->vals[idx[i]], o, depth + 1, bad);
    }
    free(idx);
    if (rc == 0 && o->indent >= 0)
        rc = json_newline(b, o, depth);
    return rc ? rc : tpl_buf_putc(b, '}');
}

static int write_json_list(tpl_buf *b, const tpl_list *l, const tpl_json_opts *o, int depth,
                           const char **bad)
{
    if (l->n == 0)
        return tpl_buf_put(b, "[]", 2);
    const char *isep = json_item_sep(o);
    int rc = tpl_buf_putc(b, '[');
    for (size_t i = 0; i < l->n && rc == 0; i++) {
        if (i)
            rc = tpl_buf_put(b, isep, strlen(isep));
        if (rc == 0 && o->indent >= 0)
            rc = json_newline(b, o, depth + 1);
        if (rc == 0)
            rc = tpl_write_json(b, l->items[i], o, depth + 1, bad);
    }
    if (rc == 0 && o->indent >= 0)
        rc = json_newline(b, o, depth);
    return rc ? rc : tpl_buf_putc(b, ']');
}

#define TPL_JSON_MAX_DEPTH 200

int tpl_write_json(tpl_buf *b, tpl_val v, const tpl_json_opts *o, int depth, const char **bad)
{
    if (depth > TPL_JSON_MAX_DEPTH) {
        *bad = "nesting too deep";
        return LMS_ERR_LIMIT;
    }
    switch (v.type) {
    case TPL_NONE: return tpl_buf_put(b, "null", 4);
    case TPL_BOOL: return v.u.b ? tpl_buf_put(b, "true", 4) : tpl_buf_put(b, "false", 5);
    case TPL_INT: return tpl_buf_printf(b, "%lld", (long long)v.u.i);
    case TPL_FLOAT:
        if (isnan(v.u.f))
            return tpl_buf_put(b, "NaN", 3);
        if (isinf(v.u.f))
            return v.u.f > 0 ? tpl_buf_put(b, "Infinity", 8) : tpl_buf_put(b, "-Infinity", 9);
        return tpl_write_float(b, v.u.f);
    case TPL_STR: return write_json_str(b, v.u.s.p, v.u.s.n, o->ensure_ascii);
    case TPL_LIST:
        if (v.flags & TPL_F_GEN)
            break;
        return write_json_list(b, v.u.l, o, depth, bad);
    case TPL_DICT: return write_json_dict(b, v.u.d, o, depth, bad);
    default: break;
    }
    *bad = tpl_type_name(v);
    return LMS_ERR_FORMAT;
}
