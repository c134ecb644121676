/*
 * template_eval.c - tree-walking evaluator: runs the AST of a template with
 * a set of variables and writes the text.
 *
 * Scoping copies jinja2 (templates depend on it, even on its surprises):
 *
 *   construct          scope of a {% set %} inside it
 *   -----------------  -----------------------------------------------------
 *   top level, if      the template's scope (an `if` opens no scope)
 *   for body           a scope per loop, emptied at each iteration: values
 *                      set in the body are gone after the loop, and each
 *                      iteration starts from the outer values again
 *   macro body         the call's own scope; its parent is the scope where
 *                      the macro was defined (read live, not copied)
 *   with               its own scope
 *
 * State that must outlive a loop therefore lives in namespace() objects,
 * which `set ns.attr = ...` mutates in place.
 *
 * Every evaluation step calls tpl_tick (time budget), every loop iteration
 * counts against max_loop_iters, macro calls against max_depth, and all
 * output goes through capped buffers: a hostile template ends with an
 * error, never a hang or a crash.
 */
#include "model/template_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/ckd.h"
#include "base/err.h"
#include "base/timeutil.h"

enum { FLOW_BREAK = 1, FLOW_CONTINUE = 2 };

#define TPL_TICK_EVERY      4096 /* evaluation steps between clock reads */
#define TPL_MAX_RENDER_NEST 1000 /* eval/exec recursion: well under 1 MiB of stack */

static int eval(tpl_ctx *c, const tpl_node *n, tpl_val *out);
static int exec_block(tpl_ctx *c, const tpl_node *block);
static int call_loop(tpl_ctx *c, const tpl_node *at, const tpl_loop *lp, const tpl_args *a,
                     tpl_val *out);

/* ---- errors, limits ----------------------------------------------------------- */

int tpl_fail(tpl_ctx *c, const tpl_node *n, int code, const char *fmt, ...)
{
    if (c->failed) /* the innermost error says what went wrong */
        return code;
    c->failed = true;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n)
        lms_errf(c->err, c->errsz, code, "template:%d:%d: %s", n->line, n->col, msg);
    else
        lms_errf(c->err, c->errsz, code, "template: %s", msg);
    return code;
}

int tpl_fail_nomem(tpl_ctx *c, const tpl_node *n)
{
    if (c->arena.hit_cap)
        return tpl_fail(c, n, LMS_ERR_LIMIT, "memory limit of %zu bytes exceeded",
                        c->arena.cap_bytes);
    return tpl_fail(c, n, LMS_ERR_NOMEM, "out of memory");
}

/* Error for a failed buffer append (rc from tpl_buf_*). */
static int fail_buf(tpl_ctx *c, const tpl_node *n, int rc)
{
    if (rc == LMS_ERR_LIMIT)
        return tpl_fail(c, n, LMS_ERR_LIMIT, "output larger than %zu bytes",
                        c->lim.max_output_bytes);
    return tpl_fail(c, n, LMS_ERR_NOMEM, "out of memory");
}

int tpl_tick(tpl_ctx *c, const tpl_node *at)
{
    if (++c->n_steps % TPL_TICK_EVERY != 0 || !c->deadline_ms)
        return 0;
    if (lms_now_ms() > (double)c->deadline_ms)
        return tpl_fail(c, at, LMS_ERR_LIMIT, "render took longer than %lld ms",
                        (long long)c->lim.max_time_ms);
    return 0;
}

int tpl_fail_undefined(tpl_ctx *c, const tpl_node *at, tpl_val v)
{
    int len = (int)(v.u.s.n > 100 ? 100 : v.u.s.n);
    const char *name = v.u.s.p ? v.u.s.p : "";
    if (v.flags & TPL_F_UNSAFE)
        return tpl_fail(c, at, LMS_ERR_FORMAT,
                        "access to attribute '%.*s' of '%s' object is unsafe", len, name,
                        tpl_type_name((tpl_val){.type = v.owner}));
    if (v.flags & TPL_F_ELEMENT)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "%s object has no element %.*s",
                        tpl_type_name((tpl_val){.type = v.owner}), len, name);
    if (v.owner < TPL_N_TYPES)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "'%s object' has no attribute '%.*s'",
                        tpl_type_name((tpl_val){.type = v.owner}), len, name);
    return tpl_fail(c, at, LMS_ERR_FORMAT, "'%.*s' is undefined", len, name);
}

int tpl_new_str(tpl_ctx *c, const tpl_node *at, size_t n, char **p, tpl_val *out)
{
    char *s = n < SIZE_MAX ? tpl_alloc(&c->arena, n + 1) : NULL;
    if (!s)
        return tpl_fail_nomem(c, at);
    *p = s;
    *out = tpl_str(s, n);
    return 0;
}

int tpl_to_str(tpl_ctx *c, const tpl_node *at, tpl_val v, tpl_val *out)
{
    if (v.type == TPL_STR) {
        *out = v;
        return 0;
    }
    tpl_buf b = {.max_bytes = c->lim.max_output_bytes};
    int rc = tpl_write_str(&b, v);
    if (rc < 0) {
        tpl_buf_free(&b);
        return fail_buf(c, at, rc);
    }
    char *p = NULL;
    rc = tpl_new_str(c, at, b.n, &p, out);
    if (rc == 0 && b.n)
        memcpy(p, b.p, b.n);
    tpl_buf_free(&b);
    return rc;
}

int tpl_list_from_vals(tpl_ctx *c, const tpl_node *at, const tpl_val *v, size_t n, tpl_val *out)
{
    tpl_list *l = tpl_list_new(&c->arena, n);
    if (!l)
        return tpl_fail_nomem(c, at);
    if (n)
        memcpy(l->items, v, n * sizeof *v);
    l->n = n;
    *out = tpl_list_val(l);
    return 0;
}

/* ---- arguments ---------------------------------------------------------------- */

bool tpl_arg(const tpl_args *a, size_t i, const char *name, tpl_val *out)
{
    if (i < a->n_pos) {
        *out = a->pos[i];
        return true;
    }
    size_t len = strlen(name);
    for (size_t k = 0; k < a->n_kw; k++) {
        if (a->kw_names[k].u.s.n == len && memcmp(a->kw_names[k].u.s.p, name, len) == 0) {
            *out = a->kw_vals[k];
            return true;
        }
    }
    return false;
}

/* Is `name` (n bytes) one of the comma-separated names from index `from` on? */
static bool param_known(const char *params, size_t from, const char *name, size_t n)
{
    size_t idx = 0;
    for (const char *p = params; *p; idx++) {
        size_t len = strcspn(p, ",");
        if (idx >= from && len == n && memcmp(p, name, n) == 0)
            return true;
        p += len + (p[len] == ',');
    }
    return false;
}

int tpl_args_check(tpl_ctx *c, const tpl_node *at, const tpl_args *a, const char *what,
                   const char *params)
{
    size_t n_params = *params ? 1 : 0;
    for (const char *p = params; *p; p++)
        n_params += *p == ',';
    if (a->n_pos > n_params)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "%s takes at most %zu arguments (%zu given)", what,
                        n_params, a->n_pos);
    for (size_t k = 0; k < a->n_kw; k++)
        if (!param_known(params, a->n_pos, a->kw_names[k].u.s.p, a->kw_names[k].u.s.n))
            return tpl_fail(c, at, LMS_ERR_FORMAT, "%s got an unexpected keyword argument '%.*s'",
                            what, (int)a->kw_names[k].u.s.n, a->kw_names[k].u.s.p);
    return 0;
}

/* ---- scopes ------------------------------------------------------------------ */

static tpl_scope *scope_new(tpl_ctx *c, tpl_scope *parent)
{
    tpl_scope *s = tpl_alloc(&c->arena, sizeof *s);
    if (s)
        s->parent = parent;
    return s;
}

static bool scope_lookup(const tpl_scope *s, const char *name, size_t n, tpl_val *out)
{
    for (; s; s = s->parent) {
        long i = tpl_dict_find_str(&s->vars, name, n);
        if (i >= 0) {
            *out = s->vars.vals[i];
            return true;
        }
    }
    return false;
}

static int scope_set(tpl_ctx *c, const tpl_node *at, tpl_scope *s, const char *name, size_t n,
                     tpl_val v)
{
    if (tpl_dict_set(&c->arena, &s->vars, tpl_str(name, n), v) < 0)
        return tpl_fail_nomem(c, at);
    return 0;
}

/* ---- attribute and item access --------------------------------------------------- */

static bool name_is(const char *name, size_t n, const char *lit)
{
    return strlen(lit) == n && memcmp(name, lit, n) == 0;
}

/* loop.index, loop.first, ...: 0 and *out set, or 1 when name is none of
 * them (then it may be a method: cycle, changed). */
static int loop_attr(const tpl_loop *lp, const char *name, size_t len, tpl_val *out)
{
    size_t n = lp->items->n, i = lp->index0;
    static const char *const ints[] = {"index",  "index0", "revindex", "revindex0",
                                       "length", "depth",  "depth0"};
    const int64_t vals[] = {(int64_t)i + 1, (int64_t)i, (int64_t)(n - i), (int64_t)(n - i - 1),
                            (int64_t)n,     lp->depth,  lp->depth - 1};
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
        if (name_is(name, len, ints[k])) {
            *out = tpl_int(vals[k]);
            return 0;
        }
    }
    if (name_is(name, len, "first") || name_is(name, len, "last")) {
        *out = tpl_bool(name[0] == 'f' ? i == 0 : i + 1 == n);
        return 0;
    }
    if (name_is(name, len, "previtem")) {
        *out = i > 0 ? lp->items->items[i - 1] : tpl_undef("previtem", 8, TPL_N_TYPES);
        return 0;
    }
    if (name_is(name, len, "nextitem")) {
        *out = i + 1 < n ? lp->items->items[i + 1] : tpl_undef("nextitem", 8, TPL_N_TYPES);
        return 0;
    }
    return 1;
}

int tpl_getattr(tpl_ctx *c, const tpl_node *at, tpl_val obj, const char *name, size_t n,
                tpl_val *out)
{
    if (obj.type == TPL_UNDEF)
        return tpl_fail_undefined(c, at, obj);
    if (obj.type == TPL_LOOP && loop_attr(obj.u.loop, name, n, out) == 0)
        return 0;
    if (obj.type == TPL_LIST && (obj.flags & TPL_F_GROUP) &&
        ((n == 7 && !memcmp(name, "grouper", 7)) || (n == 4 && !memcmp(name, "list", 4)))) {
        *out = obj.u.l->items[n == 4];
        return 0;
    }
    if (n && name[0] == '_') { /* the sandbox hides private attributes */
        *out = tpl_undef(name, n, obj.type);
        return 0;
    }
    bool is_num = obj.type == TPL_INT || obj.type == TPL_FLOAT || obj.type == TPL_BOOL;
    if (is_num && (name_is(name, n, "real") || name_is(name, n, "imag"))) {
        /* Python numbers are complex numbers too; a bool's parts are ints */
        bool real = name[0] == 'r';
        *out = obj.type == TPL_FLOAT ? tpl_float(real ? obj.u.f : 0.0)
                                     : tpl_int(!real ? 0 : obj.type == TPL_BOOL ? obj.u.b : obj.u.i);
        return 0;
    }
    int found = tpl_method_find(c, at, obj, name, n, out);
    if (found != 0)
        return found < 0 ? found : 0;
    if (obj.type == TPL_DICT || obj.type == TPL_NS) {
        long i = tpl_dict_find_str(obj.u.d, name, n);
        if (i >= 0) {
            *out = obj.u.d->vals[i];
            return 0;
        }
    }
    *out = tpl_undef(name, n, obj.type);
    return 0;
}

/* Normalises a Python index against len; false when out of range. */
static bool norm_index(int64_t i, size_t len, size_t *out)
{
    if (i < 0)
        i += (int64_t)len;
    if (i < 0 || (uint64_t)i >= len)
        return false;
    *out = (size_t)i;
    return true;
}

/* s[i] by code point; false when out of range. */
static bool str_char_at(tpl_val s, int64_t i, tpl_val *out)
{
    size_t len = tpl_utf8_len(s.u.s.p, s.u.s.n), k;
    if (!norm_index(i, len, &k))
        return false;
    size_t b = tpl_utf8_offset(s.u.s.p, s.u.s.n, k);
    size_t e = tpl_utf8_offset(s.u.s.p + b, s.u.s.n - b, 1);
    *out = tpl_str(s.u.s.p + b, e);
    return true;
}

/* obj[key]: items first, then attributes; a miss is undefined, not an
 * error (jinja2's getitem swallows LookupError and TypeError). */
int tpl_getitem(tpl_ctx *c, const tpl_node *at, tpl_val obj, tpl_val key, tpl_val *out)
{
    if (obj.type == TPL_UNDEF)
        return tpl_fail_undefined(c, at, obj);
    bool int_key = key.type == TPL_INT || key.type == TPL_BOOL;
    int64_t ik = key.type == TPL_BOOL ? key.u.b : key.u.i;
    size_t k;
    if ((obj.type == TPL_DICT || obj.type == TPL_NS)) {
        long i = tpl_dict_find(obj.u.d, key);
        if (i >= 0) {
            *out = obj.u.d->vals[i];
            return 0;
        }
    } else if (obj.type == TPL_LIST && int_key && !(obj.flags & TPL_F_GEN)) {
        if (norm_index(ik, obj.u.l->n, &k)) {
            *out = obj.u.l->items[k];
            return 0;
        }
    } else if (obj.type == TPL_STR && int_key) {
        if (str_char_at(obj, ik, out))
            return 0;
    }
    if (key.type == TPL_STR)
        return tpl_getattr(c, at, obj, key.u.s.p, key.u.s.n, out);
    *out = tpl_undef(NULL, 0, obj.type);
    if (int_key) { /* remember the index for the error message */
        char num[24], *p = NULL;
        int n = snprintf(num, sizeof num, "%lld", (long long)ik);
        TPL_TRY(tpl_new_str(c, at, (size_t)n, &p, &key));
        memcpy(p, num, (size_t)n);
        *out = tpl_undef(p, (size_t)n, obj.type);
        out->flags = TPL_F_ELEMENT;
    }
    return 0;
}

/* ---- slicing ------------------------------------------------------------------- */

/* Python's slice.indices(): clamps start/stop for a sequence of len items. */
static void slice_bounds(int64_t len, const tpl_val *lo, const tpl_val *hi, int64_t step,
                         int64_t *start, int64_t *stop)
{
    int64_t def_lo = step > 0 ? 0 : len - 1, def_hi = step > 0 ? len : -1;
    int64_t v[2] = {def_lo, def_hi};
    const tpl_val *in[2] = {lo, hi};
    for (int k = 0; k < 2; k++) {
        if (!in[k] || in[k]->type == TPL_NONE)
            continue;
        int64_t x = in[k]->type == TPL_BOOL ? in[k]->u.b : in[k]->u.i;
        if (x < 0) {
            x += len;
            if (x < 0)
                x = step > 0 ? 0 : -1;
        } else if (x >= len) {
            x = step > 0 ? len : len - 1;
        }
        v[k] = x;
    }
    *start = v[0];
    *stop = v[1];
}

static bool slice_arg_ok(const tpl_val *v)
{
    return !v || v->type == TPL_NONE || v->type == TPL_INT || v->type == TPL_BOOL;
}

/* Byte offsets of each code point of s (n_cp + 1 entries), in the arena. */
static size_t *cp_offsets(tpl_ctx *c, tpl_val s, size_t n_cp)
{
    size_t *off = tpl_alloc(&c->arena, (n_cp + 1) * sizeof *off);
    if (!off)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < s.u.s.n; i++)
        if (((unsigned char)s.u.s.p[i] & 0xC0) != 0x80)
            off[k++] = i;
    off[k] = s.u.s.n;
    return off;
}

static int slice_str(tpl_ctx *c, const tpl_node *at, tpl_val s, int64_t start, int64_t stop,
                     int64_t step, size_t count, size_t n_cp, tpl_val *out)
{
    bool ascii = n_cp == s.u.s.n;
    size_t *off = ascii ? NULL : cp_offsets(c, s, n_cp);
    if (!ascii && !off)
        return tpl_fail_nomem(c, at);
    if (step == 1) { /* a view, no copy */
        size_t b = ascii ? (size_t)start : off[start], e = ascii ? (size_t)stop : off[stop];
        *out = count ? tpl_str(s.u.s.p + b, e - b) : tpl_str("", 0);
        return 0;
    }
    char *p = NULL;
    TPL_TRY(tpl_new_str(c, at, s.u.s.n, &p, out));
    size_t o = 0;
    for (size_t k = 0; k < count; k++) {
        size_t i = (size_t)(start + (int64_t)k * step);
        size_t b = ascii ? i : off[i], e = ascii ? i + 1 : off[i + 1];
        memcpy(p + o, s.u.s.p + b, e - b);
        o += e - b;
    }
    out->u.s.n = o;
    return 0;
}

static int do_slice(tpl_ctx *c, const tpl_node *at, tpl_val obj, const tpl_val *lo,
                    const tpl_val *hi, const tpl_val *st, tpl_val *out)
{
    if (obj.type == TPL_UNDEF)
        return tpl_fail_undefined(c, at, obj);
    if (!slice_arg_ok(lo) || !slice_arg_ok(hi) || !slice_arg_ok(st))
        return tpl_fail(c, at, LMS_ERR_FORMAT,
                        "slice indices must be integers or None or have an __index__ method");
    int64_t step = st && st->type != TPL_NONE ? (st->type == TPL_BOOL ? st->u.b : st->u.i) : 1;
    if (step == 0)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "slice step cannot be zero");
    if (step == INT64_MIN)
        step = -INT64_MAX;
    size_t n_cp = 0;
    if (obj.type == TPL_STR)
        n_cp = tpl_utf8_len(obj.u.s.p, obj.u.s.n);
    else if (obj.type == TPL_LIST && !(obj.flags & TPL_F_GEN))
        n_cp = obj.u.l->n;
    else {
        *out = tpl_undef(NULL, 0, obj.type);
        return 0;
    }
    int64_t start, stop;
    slice_bounds((int64_t)n_cp, lo, hi, step, &start, &stop);
    int64_t span = step > 0 ? stop - start : start - stop;
    int64_t astep = step > 0 ? step : -step;
    size_t count = span > 0 ? (size_t)((span - 1) / astep + 1) : 0;
    if (obj.type == TPL_STR)
        return slice_str(c, at, obj, start, stop, step, count, n_cp, out);
    tpl_list *l = tpl_list_new(&c->arena, count);
    if (!l)
        return tpl_fail_nomem(c, at);
    for (size_t k = 0; k < count; k++)
        l->items[k] = obj.u.l->items[start + (int64_t)k * step];
    l->n = count;
    *out = tpl_list_val(l);
    out->flags = obj.flags;
    return 0;
}

/* ---- iteration --------------------------------------------------------------- */

/* The items a generator has not yielded yet; it yields them now. */
static int drain_gen(tpl_ctx *c, const tpl_node *at, tpl_list *g, tpl_list **out)
{
    tpl_list *l = tpl_alloc(&c->arena, sizeof *l);
    if (!l)
        return tpl_fail_nomem(c, at);
    /* an empty generator may have no items array: NULL + 0 is undefined */
    l->items = g->items ? g->items + g->taken : NULL;
    l->n = l->cap = g->n - g->taken;
    g->taken = g->n;
    *out = l;
    return 0;
}

int tpl_iterate(tpl_ctx *c, const tpl_node *at, tpl_val v, tpl_list **out)
{
    switch (v.type) {
    case TPL_LIST:
        if (v.flags & TPL_F_GEN)
            return drain_gen(c, at, v.u.l, out);
        *out = v.u.l;
        return 0;
    case TPL_UNDEF:
        if (v.flags & TPL_F_UNSAFE)
            return tpl_fail_undefined(c, at, v);
        break;
    case TPL_DICT: {
        tpl_val keys;
        TPL_TRY(tpl_list_from_vals(c, at, v.u.d->keys, v.u.d->n, &keys));
        *out = keys.u.l;
        return 0;
    }
    case TPL_STR: {
        tpl_list *l = tpl_list_new(&c->arena, tpl_utf8_len(v.u.s.p, v.u.s.n));
        if (!l)
            return tpl_fail_nomem(c, at);
        for (size_t i = 0; i < v.u.s.n;) {
            size_t k = tpl_utf8_offset(v.u.s.p + i, v.u.s.n - i, 1);
            l->items[l->n++] = tpl_str(v.u.s.p + i, k);
            i += k;
        }
        *out = l;
        return 0;
    }
    default:
        return tpl_fail(c, at, LMS_ERR_FORMAT, "'%s' object is not iterable", tpl_type_name(v));
    }
    *out = tpl_list_new(&c->arena, 0);
    return *out ? 0 : tpl_fail_nomem(c, at);
}

/* ---- operators ----------------------------------------------------------------- */

static int type_error(tpl_ctx *c, const tpl_node *at, const char *op, tpl_val a, tpl_val b)
{
    if (a.type == TPL_UNDEF)
        return tpl_fail_undefined(c, at, a);
    if (b.type == TPL_UNDEF)
        return tpl_fail_undefined(c, at, b);
    if (op[0] == '+' && a.type == TPL_STR)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "can only concatenate str (not \"%s\") to str",
                        tpl_type_name(b));
    return tpl_fail(c, at, LMS_ERR_FORMAT, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                    tpl_type_name(a), tpl_type_name(b));
}

static int concat_str(tpl_ctx *c, const tpl_node *at, tpl_val a, tpl_val b, tpl_val *out)
{
    size_t n;
    if (lms_ckd_add(&n, a.u.s.n, b.u.s.n) || n > c->lim.max_output_bytes)
        return tpl_fail(c, at, LMS_ERR_LIMIT, "string longer than %zu bytes",
                        c->lim.max_output_bytes);
    char *p = NULL;
    TPL_TRY(tpl_new_str(c, at, n, &p, out));
    memcpy(p, a.u.s.p, a.u.s.n);
    memcpy(p + a.u.s.n, b.u.s.p, b.u.s.n);
    return 0;
}

static int concat_list(tpl_ctx *c, const tpl_node *at, const tpl_list *a, const tpl_list *b,
                       size_t times, tpl_val *out)
{
    size_t per = a->n + (b ? b->n : 0), n;
    if (lms_ckd_mul(&n, per, times) || n > c->lim.max_output_bytes / sizeof(tpl_val))
        return tpl_fail(c, at, LMS_ERR_LIMIT, "list too long");
    tpl_list *l = tpl_list_new(&c->arena, n);
    if (!l)
        return tpl_fail_nomem(c, at);
    for (size_t t = 0; t < times && n; t++) { /* n == 0: items may be NULL */
        if (a->n)
            memcpy(l->items + l->n, a->items, a->n * sizeof(tpl_val));
        l->n += a->n;
        if (b && b->n) {
            memcpy(l->items + l->n, b->items, b->n * sizeof(tpl_val));
            l->n += b->n;
        }
    }
    *out = tpl_list_val(l);
    return 0;
}

static int repeat_str(tpl_ctx *c, const tpl_node *at, tpl_val s, int64_t times, tpl_val *out)
{
    size_t n;
    if (times <= 0) {
        *out = tpl_str("", 0);
        return 0;
    }
    if (lms_ckd_mul(&n, s.u.s.n, (size_t)times) || n > c->lim.max_output_bytes)
        return tpl_fail(c, at, LMS_ERR_LIMIT, "string longer than %zu bytes",
                        c->lim.max_output_bytes);
    char *p = NULL;
    TPL_TRY(tpl_new_str(c, at, n, &p, out));
    for (int64_t k = 0; k < times; k++)
        memcpy(p + (size_t)k * s.u.s.n, s.u.s.p, s.u.s.n);
    return 0;
}

static int64_t ival(tpl_val v) { return v.type == TPL_BOOL ? v.u.b : v.u.i; }

/* a**b for b >= 0 by squaring; true on overflow. */
static bool int_pow(int64_t a, int64_t b, int64_t *out)
{
    int64_t r = 1;
    while (b > 0) {
        if ((b & 1) && lms_ckd_mul(&r, r, a))
            return true;
        b >>= 1;
        if (b && lms_ckd_mul(&a, a, a))
            return true;
    }
    *out = r;
    return false;
}

/* Integer arithmetic with Python semantics (floor division and modulo). */
static int int_op(tpl_ctx *c, const tpl_node *at, int op, int64_t a, int64_t b, tpl_val *out)
{
    int64_t r = 0;
    bool ovf = false;
    switch (op) {
    case OP_ADD: ovf = lms_ckd_add(&r, a, b); break;
    case OP_SUB: ovf = lms_ckd_sub(&r, a, b); break;
    case OP_MUL: ovf = lms_ckd_mul(&r, a, b); break;
    case OP_FLOORDIV:
    case OP_MOD:
        if (b == 0)
            return tpl_fail(c, at, LMS_ERR_FORMAT, "integer division or modulo by zero");
        if (a == INT64_MIN && b == -1) {
            ovf = op == OP_FLOORDIV;
            break;
        }
        r = op == OP_FLOORDIV ? a / b - ((a % b != 0) && ((a < 0) != (b < 0)))
                              : a % b + ((a % b != 0 && (a % b < 0) != (b < 0)) ? b : 0);
        break;
    case OP_POW:
        if (b < 0) {
            *out = tpl_float(pow((double)a, (double)b));
            return 0;
        }
        ovf = int_pow(a, b, &r);
        break;
    default: return tpl_fail(c, at, LMS_ERR_FORMAT, "bad integer operator");
    }
    if (ovf)
        return tpl_fail(c, at, LMS_ERR_RANGE, "integer overflow");
    *out = tpl_int(r);
    return 0;
}

/* Python's float floor division (want_mod false) or modulo, via fmod so
 * that large operands keep their precision. b != 0. */
static double py_divmod(double a, double b, bool want_mod)
{
    double mod = fmod(a, b), div = (a - mod) / b;
    if (mod != 0.0) {
        if ((b < 0) != (mod < 0)) {
            mod += b;
            div -= 1.0;
        }
    } else {
        mod = copysign(0.0, b);
    }
    if (want_mod)
        return mod;
    if (div == 0.0)
        return copysign(0.0, a / b);
    double fl = floor(div);
    return div - fl > 0.5 ? fl + 1.0 : fl;
}

static int float_op(tpl_ctx *c, const tpl_node *at, int op, double a, double b, tpl_val *out)
{
    double r;
    switch (op) {
    case OP_ADD: r = a + b; break;
    case OP_SUB: r = a - b; break;
    case OP_MUL: r = a * b; break;
    case OP_DIV:
    case OP_FLOORDIV:
    case OP_MOD:
        if (b == 0.0)
            return tpl_fail(c, at, LMS_ERR_FORMAT, "float division by zero");
        r = op == OP_DIV ? a / b : py_divmod(a, b, op == OP_MOD);
        break;
    case OP_POW: r = pow(a, b); break;
    default: return tpl_fail(c, at, LMS_ERR_FORMAT, "bad float operator");
    }
    *out = tpl_float(r);
    return 0;
}

static const char *op_text(int op)
{
    static const char *const t[] = {
        [OP_ADD] = "+",       [OP_SUB] = "-", [OP_MUL] = "*",  [OP_DIV] = "/",
        [OP_FLOORDIV] = "//", [OP_MOD] = "%", [OP_POW] = "**", [OP_CONCAT] = "~"};
    return op < (int)(sizeof t / sizeof t[0]) && t[op] ? t[op] : "?";
}

static int binary_op(tpl_ctx *c, const tpl_node *at, int op, tpl_val a, tpl_val b, tpl_val *out)
{
    if (op == OP_CONCAT) {
        tpl_val sa, sb;
        TPL_TRY(tpl_to_str(c, at, a, &sa));
        TPL_TRY(tpl_to_str(c, at, b, &sb));
        return concat_str(c, at, sa, sb, out);
    }
    if (tpl_is_number(a) && tpl_is_number(b)) {
        if (a.type != TPL_FLOAT && b.type != TPL_FLOAT && op != OP_DIV)
            return int_op(c, at, op, ival(a), ival(b), out);
        return float_op(c, at, op, tpl_as_double(a), tpl_as_double(b), out);
    }
    if ((a.type == TPL_LIST && (a.flags & TPL_F_GEN)) ||
        (b.type == TPL_LIST && (b.flags & TPL_F_GEN)))
        return type_error(c, at, op_text(op), a, b);
    if (op == OP_ADD && a.type == TPL_STR && b.type == TPL_STR) {
        if (!((a.flags | b.flags) & TPL_F_SAFE))
            return concat_str(c, at, a, b, out);
        /* Markup + str escapes the str (either side) and stays Markup */
        TPL_TRY(tpl_escape_html(c, at, a, &a));
        TPL_TRY(tpl_escape_html(c, at, b, &b));
        TPL_TRY(concat_str(c, at, a, b, out));
        out->flags |= TPL_F_SAFE;
        return 0;
    }
    if (op == OP_ADD && a.type == TPL_LIST && b.type == TPL_LIST &&
        !((a.flags ^ b.flags) & TPL_F_TUPLE)) { /* list + tuple is a TypeError */
        TPL_TRY(concat_list(c, at, a.u.l, b.u.l, 1, out));
        out->flags = a.flags & TPL_F_TUPLE;
        return 0;
    }
    if (op == OP_MUL && (a.type == TPL_INT || a.type == TPL_BOOL) &&
        (b.type == TPL_STR || b.type == TPL_LIST))
        return binary_op(c, at, op, b, a, out);
    if (op == OP_MUL && a.type == TPL_STR && (b.type == TPL_INT || b.type == TPL_BOOL))
        return repeat_str(c, at, a, ival(b), out);
    if (op == OP_MUL && a.type == TPL_LIST && (b.type == TPL_INT || b.type == TPL_BOOL)) {
        TPL_TRY(concat_list(c, at, a.u.l, NULL, ival(b) > 0 ? (size_t)ival(b) : 0, out));
        out->flags = a.flags & TPL_F_TUPLE;
        return 0;
    }
    if (op == OP_MOD && a.type == TPL_STR)
        return tpl_str_format(c, at, a, b, out);
    return type_error(c, at, op_text(op), a, b);
}

static int contains(tpl_ctx *c, const tpl_node *at, tpl_val item, tpl_val box, bool *out)
{
    switch (box.type) {
    case TPL_UNDEF: *out = false; return 0;
    case TPL_STR:
        if (item.type != TPL_STR)
            return tpl_fail(c, at, LMS_ERR_FORMAT,
                            "'in <string>' requires string as left operand, not %s",
                            tpl_type_name(item));
        *out = item.u.s.n == 0 || memmem(box.u.s.p, box.u.s.n, item.u.s.p, item.u.s.n) != NULL;
        return 0;
    case TPL_LIST: {
        tpl_list *l = box.u.l;
        size_t i = box.flags & TPL_F_GEN ? l->taken : 0;
        *out = false;
        for (; i < l->n && !*out; i++)
            *out = tpl_equal(l->items[i], item);
        if (box.flags & TPL_F_GEN) /* a generator is used up to the match */
            l->taken = i;
        return 0;
    }
    case TPL_DICT:
    case TPL_NS: *out = tpl_dict_find(box.u.d, item) >= 0; return 0;
    default:
        return tpl_fail(c, at, LMS_ERR_FORMAT, "argument of type '%s' is not iterable",
                        tpl_type_name(box));
    }
}

static int compare(tpl_ctx *c, const tpl_node *at, int op, tpl_val a, tpl_val b, bool *out)
{
    static const char *const names[] = {
        [OP_LT] = "<", [OP_LE] = "<=", [OP_GT] = ">", [OP_GE] = ">="};
    bool lt;
    switch (op) {
    case OP_EQ: *out = tpl_equal(a, b); return 0;
    case OP_NE: *out = !tpl_equal(a, b); return 0;
    case OP_IN: return contains(c, at, a, b, out);
    case OP_NOTIN:
        TPL_TRY(contains(c, at, a, b, out));
        *out = !*out;
        return 0;
    default: break;
    }
    if (a.type == TPL_UNDEF || b.type == TPL_UNDEF)
        return tpl_fail_undefined(c, at, a.type == TPL_UNDEF ? a : b);
    tpl_val x = op == OP_GT || op == OP_LE ? b : a, y = op == OP_GT || op == OP_LE ? a : b;
    if (!tpl_less(x, y, &lt))
        return tpl_fail(c, at, LMS_ERR_FORMAT,
                        "'%s' not supported between instances of '%s' and '%s'", names[op],
                        tpl_type_name(a), tpl_type_name(b));
    *out = op == OP_LT || op == OP_GT ? lt : !lt; /* a<=b is !(b<a) */
    return 0;
}

/* ---- expressions ---------------------------------------------------------------- */

/* Evaluates call arguments into arrays from the arena when they do not fit
 * the caller's (small) stack arrays. */
typedef struct arg_store {
    tpl_val pos[8], kwn[8], kwv[8];
    tpl_args a;
} arg_store;

static int eval_args(tpl_ctx *c, const tpl_node *n, size_t first, arg_store *st)
{
    size_t cnt = n->n_kids - first;
    tpl_val *pos = st->pos, *kwn = st->kwn, *kwv = st->kwv;
    if (cnt > 8) {
        pos = tpl_alloc(&c->arena, 3 * cnt * sizeof(tpl_val));
        if (!pos)
            return tpl_fail_nomem(c, n);
        kwn = pos + cnt;
        kwv = kwn + cnt;
    }
    st->a = (tpl_args){.pos = pos, .kw_names = kwn, .kw_vals = kwv};
    for (size_t k = first; k < n->n_kids; k++) {
        const tpl_node *arg = n->kids[k];
        if (arg->kind == N_KWARG) {
            kwn[st->a.n_kw] = tpl_str(arg->name, arg->name_n);
            TPL_TRY(eval(c, arg->a, &kwv[st->a.n_kw]));
            st->a.n_kw++;
        } else {
            if (st->a.n_kw)
                return tpl_fail(c, arg, LMS_ERR_FORMAT,
                                "positional argument follows keyword argument");
            TPL_TRY(eval(c, arg, &pos[st->a.n_pos++]));
        }
    }
    return 0;
}

static int eval_call(tpl_ctx *c, const tpl_node *n, tpl_val *out)
{
    tpl_val fn;
    arg_store st;
    TPL_TRY(eval(c, n->a, &fn));
    TPL_TRY(eval_args(c, n, 0, &st));
    return tpl_call_value(c, n, fn, st.a.pos, st.a.n_pos, st.a.kw_names, st.a.kw_vals, st.a.n_kw,
                          out);
}

static int eval_filter(tpl_ctx *c, const tpl_node *n, tpl_val *out)
{
    tpl_val in;
    arg_store st;
    if (n->value.u.i < 0)
        return tpl_fail(c, n, LMS_ERR_FORMAT, "unknown filter '%s'", n->name);
    TPL_TRY(eval(c, n->a, &in));
    TPL_TRY(eval_args(c, n, 0, &st));
    return tpl_filter_apply(c, n, (int)n->value.u.i, in, &st.a, out);
}

static int eval_test(tpl_ctx *c, const tpl_node *n, tpl_val *out)
{
    tpl_val in;
    arg_store st;
    bool r;
    if (n->value.u.i < 0)
        return tpl_fail(c, n, LMS_ERR_FORMAT, "unknown test '%s'", n->name);
    TPL_TRY(eval(c, n->a, &in));
    TPL_TRY(eval_args(c, n, 0, &st));
    TPL_TRY(tpl_test_apply(c, n, (int)n->value.u.i, in, &st.a, &r));
    *out = tpl_bool(n->op ? !r : r);
    return 0;
}

static int eval_compare(tpl_ctx *c, const tpl_node *n, tpl_val *out)
{
    tpl_val left, right;
    bool r = true;
    TPL_TRY(eval(c, n->a, &left));
    for (size_t k = 0; k < n->n_kids && r; k++) {
        TPL_TRY(eval(c, n->kids[k]->a, &right));
        TPL_TRY(compare(c, n->kids[k], n->kids[k]->op, left, right, &r));
        left = right;
    }
    *out = tpl_bool(r);
    return 0;
}

static int eval_collection(tpl_ctx *c, const tpl_node *n, tpl_val *out)
{
    if (n->kind == N_DICT) {
        tpl_dict *d = tpl_dict_new(&c->arena, n->n_kids / 2);
        if (!d)
            return tpl_fail_nomem(c, n);
        for (size_t k = 0; k + 1 < n->n_kids; k += 2) {
            tpl_val key, v;
            TPL_TRY(eval(c, n->kids[k], &key));
            TPL_TRY(eval(c, n->kids[k + 1], &v));
            if (tpl_dict_set(&c->arena, d, key, v) < 0)
                return tpl_fail_nomem(c, n);
        }
        *out = tpl_dict_val(d);
        return 0;
    }
    tpl_list *l = tpl_list_new(&c->arena, n->n_kids);
    if (!l)
        return tpl_fail_nomem(c, n);
    for (size_t k = 0; k < n->n_kids; k++)
        TPL_TRY(eval(c, n->kids[k], &l->items[l->n++]));
    *out = tpl_list_val(l);
    out->flags = n->kind == N_TUPLE ? TPL_F_TUPLE : 0;
    return 0;
}

static int eval_unary(tpl_ctx *c, const tpl_node *n, tpl_val *out)
{
    tpl_val v;
    TPL_TRY(eval(c, n->a, &v));
    if (v.type == TPL_FLOAT) {
        *out = tpl_float(n->op == OP_NEG ? -v.u.f : v.u.f);
        return 0;
    }
    if (v.type == TPL_INT || v.type == TPL_BOOL) {
        int64_t i = ival(v);
        if (n->op == OP_NEG && i == INT64_MIN)
            return tpl_fail(c, n, LMS_ERR_RANGE, "integer overflow");
        *out = tpl_int(n->op == OP_NEG ? -i : i);
        return 0;
    }
    if (v.type == TPL_UNDEF)
        return tpl_fail_undefined(c, n, v);
    return tpl_fail(c, n, LMS_ERR_FORMAT, "bad operand type for unary %s: '%s'",
                    n->op == OP_NEG ? "-" : "+", tpl_type_name(v));
}

static int eval_slice(tpl_ctx *c, const tpl_node *n, tpl_val *out)
{
    tpl_val obj, v[3];
    const tpl_val *p[3] = {NULL, NULL, NULL};
    const tpl_node *parts[3] = {n->b, n->c, n->kids[0]};
    TPL_TRY(eval(c, n->a, &obj));
    for (int k = 0; k < 3; k++) {
        if (parts[k]) {
            TPL_TRY(eval(c, parts[k], &v[k]));
            p[k] = &v[k];
        }
    }
    return do_slice(c, n, obj, p[0], p[1], p[2], out);
}

static int eval_logic(tpl_ctx *c, const tpl_node *n, tpl_val *out)
{
    TPL_TRY(eval(c, n->a, out));
    bool t = tpl_truthy(*out);
    if (n->kind == N_NOT) {
        *out = tpl_bool(!t);
        return 0;
    }
    if ((n->kind == N_AND) == t) /* and: left falsy -> left; or: left truthy -> left */
        return eval(c, n->b, out);
    return 0;
}

static int eval_node(tpl_ctx *c, const tpl_node *n, tpl_val *out)
{
    tpl_val a, b;
    switch (n->kind) {
    case N_CONST: *out = n->value; return 0;
    case N_NAME:
        if (!scope_lookup(c->scope, n->name, n->name_n, out))
            *out = tpl_undef(n->name, n->name_n, TPL_N_TYPES);
        return 0;
    case N_ATTR: TPL_TRY(eval(c, n->a, &a)); return tpl_getattr(c, n, a, n->name, n->name_n, out);
    case N_ITEM:
        TPL_TRY(eval(c, n->a, &a));
        TPL_TRY(eval(c, n->b, &b));
        return tpl_getitem(c, n, a, b, out);
    case N_SLICE: return eval_slice(c, n, out);
    case N_CALL: return eval_call(c, n, out);
    case N_FILTER: return eval_filter(c, n, out);
    case N_TEST: return eval_test(c, n, out);
    case N_UNARY: return eval_unary(c, n, out);
    case N_BINARY:
        TPL_TRY(eval(c, n->a, &a));
        TPL_TRY(eval(c, n->b, &b));
        return binary_op(c, n, n->op, a, b, out);
    case N_COMPARE: return eval_compare(c, n, out);
    case N_AND:
    case N_OR:
    case N_NOT: return eval_logic(c, n, out);
    case N_COND:
        TPL_TRY(eval(c, n->b, &a));
        if (tpl_truthy(a))
            return eval(c, n->a, out);
        if (n->c)
            return eval(c, n->c, out);
        *out = tpl_undef(NULL, 0, TPL_N_TYPES);
        return 0;
    case N_LIST:
    case N_TUPLE:
    case N_DICT: return eval_collection(c, n, out);
    case N_HOLE: *out = c->hole; return 0;
    default: return tpl_fail(c, n, LMS_ERR_FORMAT, "not an expression");
    }
}

/* ---- macros and calls --------------------------------------------------------- */

/* Ends a capture into buf (rc: how the rendering went): its text as a
 * new string value. */
static int end_capture(tpl_ctx *c, const tpl_node *at, tpl_buf *buf, int rc, tpl_val *out)
{
    char *p = NULL;
    if (rc >= 0)
        rc = tpl_new_str(c, at, buf->n, &p, out);
    if (rc >= 0 && buf->n)
        memcpy(p, buf->p, buf->n);
    tpl_buf_free(buf);
    return rc < 0 ? rc : 0;
}

/* Runs block with output captured into a new string value. */
static int capture(tpl_ctx *c, const tpl_node *block, tpl_val *out)
{
    tpl_buf buf = {.max_bytes = c->lim.max_output_bytes}, *saved = c->out;
    c->out = &buf;
    int rc = exec_block(c, block);
    c->out = saved;
    return end_capture(c, block, &buf, rc, out);
}

static int bind_macro_args(tpl_ctx *c, const tpl_node *at, const tpl_node *def, tpl_scope *s,
                           const tpl_args *a)
{
    bool var = def->op & TPL_MACRO_VARARGS, kw = def->op & TPL_MACRO_KWARGS;
    if (a->n_pos > def->n_kids && !var)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "macro '%s' takes not more than %zu argument(s)",
                        def->name, def->n_kids);
    tpl_dict *extra = kw ? tpl_dict_new(&c->arena, 0) : NULL;
    if (kw && !extra)
        return tpl_fail_nomem(c, at);
    for (size_t k = 0; k < a->n_kw; k++) {
        bool known = (def->op & TPL_MACRO_CALLER) && tpl_equal(a->kw_names[k], tpl_cstr("caller"));
        if (known)
            TPL_TRY(scope_set(c, at, s, "caller", 6, a->kw_vals[k]));
        for (size_t j = 0; j < def->n_kids && !known; j++)
            known = tpl_equal(a->kw_names[k], tpl_str(def->kids[j]->name, def->kids[j]->name_n));
        if (!known && kw && tpl_dict_set(&c->arena, extra, a->kw_names[k], a->kw_vals[k]) < 0)
            return tpl_fail_nomem(c, at);
        if (!known && !kw)
            return tpl_fail(c, at, LMS_ERR_FORMAT, "macro '%s' takes no keyword argument '%.*s'",
                            def->name, (int)a->kw_names[k].u.s.n, a->kw_names[k].u.s.p);
    }
    if (var) {
        size_t n = a->n_pos > def->n_kids ? a->n_pos - def->n_kids : 0;
        tpl_val t;
        TPL_TRY(tpl_list_from_vals(c, at, a->pos + def->n_kids, n, &t));
        t.flags = TPL_F_TUPLE;
        TPL_TRY(scope_set(c, at, s, "varargs", 7, t));
    }
    if (kw)
        TPL_TRY(scope_set(c, at, s, "kwargs", 6, tpl_dict_val(extra)));
    for (size_t j = 0; j < def->n_kids; j++) {
        const tpl_node *param = def->kids[j];
        tpl_val v;
        if (!tpl_arg(a, j, param->name, &v)) {
            if (param->a)
                TPL_TRY(eval(c, param->a, &v)); /* defaults see earlier parameters */
            else
                v = tpl_undef(param->name, param->name_n, TPL_N_TYPES);
        }
        TPL_TRY(scope_set(c, at, s, param->name, param->name_n, v));
    }
    return 0;
}

static int call_macro(tpl_ctx *c, const tpl_node *at, const tpl_macro *m, const tpl_args *a,
                      tpl_val *out)
{
    if (c->depth >= c->lim.max_depth)
        return tpl_fail(c, at, LMS_ERR_LIMIT, "macro calls nested deeper than %d",
                        c->lim.max_depth);
    tpl_scope *s = scope_new(c, m->closure), *saved = c->scope;
    if (!s)
        return tpl_fail_nomem(c, at);
    c->scope = s;
    c->depth++;
    int rc = bind_macro_args(c, at, m->def, s, a);
    if (rc == 0)
        rc = capture(c, m->def->b, out);
    c->depth--;
    c->scope = saved;
    return rc;
}

int tpl_call_value(tpl_ctx *c, const tpl_node *at, tpl_val fn, const tpl_val *args, size_t n_args,
                   const tpl_val *kw_names, const tpl_val *kw_vals, size_t n_kw, tpl_val *out)
{
    tpl_args a = {args, n_args, kw_names, kw_vals, n_kw};
    switch (fn.type) {
    case TPL_MACRO: return call_macro(c, at, fn.u.m, &a, out);
    case TPL_FUNC: return tpl_func_call(c, at, fn.u.fn, &a, out);
    case TPL_METHOD: return tpl_method_call(c, at, fn.u.meth, &a, out);
    case TPL_LOOP: return call_loop(c, at, fn.u.loop, &a, out);
    case TPL_UNDEF: return tpl_fail_undefined(c, at, fn);
    default:
        return tpl_fail(c, at, LMS_ERR_FORMAT, "'%s' object is not callable", tpl_type_name(fn));
    }
}

/* ---- statements ---------------------------------------------------------------- */

static int write_out(tpl_ctx *c, const tpl_node *at, const char *p, size_t n)
{
    int rc = tpl_buf_put(c->out, p, n);
    return rc < 0 ? fail_buf(c, at, rc) : 0;
}

static int output_value(tpl_ctx *c, const tpl_node *n, tpl_val v)
{
    if (v.type == TPL_STR)
        return write_out(c, n, v.u.s.p, v.u.s.n);
    if (v.type == TPL_UNDEF && (v.flags & TPL_F_UNSAFE))
        return tpl_fail_undefined(c, n, v);
    int rc = tpl_write_str(c->out, v);
    return rc < 0 ? fail_buf(c, n, rc) : 0;
}

static int exec_output(tpl_ctx *c, const tpl_node *n)
{
    tpl_val v;
    TPL_TRY(eval(c, n->a, &v));
    return output_value(c, n, v);
}

/* Binds v to a target: a name, ns.attr, or a tuple of names (unpacking). */
static int assign(tpl_ctx *c, const tpl_node *target, tpl_val v)
{
    if (target->kind == N_NAME)
        return scope_set(c, target, c->scope, target->name, target->name_n, v);
    if (target->kind == N_ATTR) {
        tpl_val ns;
        if (!scope_lookup(c->scope, target->a->name, target->a->name_n, &ns))
            return tpl_fail(c, target, LMS_ERR_FORMAT, "'%s' is undefined", target->a->name);
        if (ns.type != TPL_NS)
            return tpl_fail(c, target, LMS_ERR_FORMAT,
                            "cannot assign attribute on non-namespace object");
        if (tpl_dict_set(&c->arena, ns.u.d, tpl_str(target->name, target->name_n), v) < 0)
            return tpl_fail_nomem(c, target);
        return 0;
    }
    tpl_list *items = NULL;
    TPL_TRY(tpl_iterate(c, target, v, &items));
    if (items->n != target->n_kids)
        return tpl_fail(c, target, LMS_ERR_FORMAT, "%s values to unpack (expected %zu, got %zu)",
                        items->n < target->n_kids ? "not enough" : "too many", target->n_kids,
                        items->n);
    for (size_t k = 0; k < items->n; k++)
        TPL_TRY(assign(c, target->kids[k], items->items[k]));
    return 0;
}

/* Binds a loop's targets (kids[1..]) to item. */
static int bind_targets(tpl_ctx *c, const tpl_node *n, tpl_val item)
{
    if (n->n_kids == 2)
        return assign(c, n->kids[1], item);
    tpl_list *parts = NULL;
    TPL_TRY(tpl_iterate(c, n, item, &parts));
    if (parts->n != n->n_kids - 1)
        return tpl_fail(c, n, LMS_ERR_FORMAT, "cannot unpack %zu values into %zu loop variables",
                        parts->n, n->n_kids - 1);
    for (size_t k = 0; k < parts->n; k++)
        TPL_TRY(assign(c, n->kids[k + 1], parts->items[k]));
    return 0;
}

static int count_iter(tpl_ctx *c, const tpl_node *at)
{
    if (++c->n_iters > c->lim.max_loop_iters)
        return tpl_fail(c, at, LMS_ERR_LIMIT, "more than %lld loop iterations",
                        (long long)c->lim.max_loop_iters);
    return tpl_tick(c, at); /* an empty body evaluates nothing else */
}

/* Items of a loop after its `if` filter (evaluated with the targets bound). */
static int loop_items(tpl_ctx *c, const tpl_node *n, tpl_scope *s, tpl_val seq, tpl_list **items)
{
    TPL_TRY(tpl_iterate(c, n->a, seq, items));
    const tpl_node *cond = n->kids[0];
    if (!cond)
        return 0;
    tpl_list *kept = tpl_list_new(&c->arena, (*items)->n);
    if (!kept)
        return tpl_fail_nomem(c, n);
    for (size_t i = 0; i < (*items)->n; i++) {
        tpl_val ok;
        s->vars.n = 0;
        TPL_TRY(count_iter(c, n));
        TPL_TRY(bind_targets(c, n, (*items)->items[i]));
        TPL_TRY(eval(c, cond, &ok));
        if (tpl_truthy(ok))
            kept->items[kept->n++] = (*items)->items[i];
    }
    *items = kept;
    return 0;
}

/* Runs the loop n over seq in scope s (a child of outer); depth counts
 * recursive loop(...) calls from 1. */
static int run_loop(tpl_ctx *c, const tpl_node *n, tpl_scope *s, tpl_scope *outer, tpl_val seq,
                    int depth)
{
    tpl_list *items = NULL;
    TPL_TRY(loop_items(c, n, s, seq, &items));
    if (items->n == 0) {
        s->vars.n = 0;
        return n->c ? exec_block(c, n->c) : 0;
    }
    tpl_loop *lp = tpl_alloc(&c->arena, sizeof *lp);
    if (!lp)
        return tpl_fail_nomem(c, n);
    lp->items = items;
    lp->depth = depth;
    lp->recursive = n->op ? n : NULL;
    lp->outer = outer;
    tpl_val loop_val = {.type = TPL_LOOP};
    loop_val.u.loop = lp;
    for (size_t i = 0; i < items->n; i++) {
        s->vars.n = 0; /* each iteration starts from the outer scope again */
        lp->index0 = i;
        TPL_TRY(count_iter(c, n));
        TPL_TRY(bind_targets(c, n, items->items[i]));
        TPL_TRY(scope_set(c, n, s, "loop", 4, loop_val));
        int rc = exec_block(c, n->b);
        if (rc < 0)
            return rc;
        if (rc == FLOW_BREAK)
            break;
    }
    return 0;
}

static int exec_for(tpl_ctx *c, const tpl_node *n)
{
    tpl_scope *s = scope_new(c, c->scope), *saved = c->scope;
    if (!s)
        return tpl_fail_nomem(c, n);
    c->scope = s;
    tpl_val seq;
    int rc = eval(c, n->a, &seq);
    if (rc >= 0)
        rc = run_loop(c, n, s, saved, seq, 1);
    c->scope = saved;
    return rc;
}

/* loop(seq) in a recursive loop: the same loop over seq one level deeper,
 * its output returned as a string. */
static int call_loop(tpl_ctx *c, const tpl_node *at, const tpl_loop *lp, const tpl_args *a,
                     tpl_val *out)
{
    if (!lp->recursive)
        return tpl_fail(c, at, LMS_ERR_FORMAT,
                        "loop() needs a loop marked recursive: {%% for ... recursive %%}");
    if (a->n_pos != 1 || a->n_kw)
        return tpl_fail(c, at, LMS_ERR_FORMAT, "loop() takes exactly one argument");
    if (c->depth >= c->lim.max_depth)
        return tpl_fail(c, at, LMS_ERR_LIMIT, "recursive loop nested deeper than %d",
                        c->lim.max_depth);
    tpl_scope *s = scope_new(c, lp->outer), *saved = c->scope;
    if (!s)
        return tpl_fail_nomem(c, at);
    tpl_buf buf = {.max_bytes = c->lim.max_output_bytes}, *saved_out = c->out;
    c->out = &buf;
    c->scope = s;
    c->depth++;
    int rc = run_loop(c, lp->recursive, s, lp->outer, a->pos[0], lp->depth + 1);
    c->depth--;
    c->scope = saved;
    c->out = saved_out;
    return end_capture(c, at, &buf, rc, out);
}

/* Renders body and runs the filter chain (on N_HOLE) over its text. */
static int capture_filtered(tpl_ctx *c, const tpl_node *body, const tpl_node *chain, tpl_val *out)
{
    tpl_val saved = c->hole;
    TPL_TRY(capture(c, body, &c->hole));
    int rc = eval(c, chain, out);
    c->hole = saved;
    return rc;
}

static int exec_setblock(tpl_ctx *c, const tpl_node *n)
{
    tpl_val v;
    TPL_TRY(capture_filtered(c, n->b, n->c, &v));
    return assign(c, n->a, v);
}

static int exec_filterblock(tpl_ctx *c, const tpl_node *n)
{
    tpl_val v;
    TPL_TRY(capture_filtered(c, n->b, n->a, &v));
    return output_value(c, n, v);
}

static int exec_with(tpl_ctx *c, const tpl_node *n)
{
    tpl_scope *s = scope_new(c, c->scope), *saved = c->scope;
    if (!s)
        return tpl_fail_nomem(c, n);
    c->scope = s;
    int rc = 0;
    for (size_t k = 0; k < n->n_kids && rc >= 0; k++) {
        tpl_val v;
        rc = eval(c, n->kids[k]->a, &v);
        if (rc >= 0)
            rc = assign(c, n->kids[k]->b, v);
    }
    if (rc >= 0)
        rc = exec_block(c, n->b);
    c->scope = saved;
    return rc;
}

static int exec_macro_def(tpl_ctx *c, const tpl_node *n)
{
    tpl_macro *m = tpl_alloc(&c->arena, sizeof *m);
    if (!m)
        return tpl_fail_nomem(c, n);
    m->def = n;
    m->closure = c->scope;
    tpl_val v = {.type = TPL_MACRO};
    v.u.m = m;
    return scope_set(c, n, c->scope, n->name, n->name_n, v);
}

/* {% call %}: the call of n->a with one more keyword, caller = the body
 * (n->b) as a macro defined here; what it returns is output. */
static int exec_call_block(tpl_ctx *c, const tpl_node *n)
{
    const tpl_node *call = n->a;
    tpl_macro *m = tpl_alloc(&c->arena, sizeof *m);
    if (!m)
        return tpl_fail_nomem(c, n);
    m->def = n->b;
    m->closure = c->scope;
    tpl_val fn, res;
    arg_store st;
    TPL_TRY(eval(c, call->a, &fn));
    TPL_TRY(eval_args(c, call, 0, &st));
    size_t nk = st.a.n_kw;
    tpl_val *kw = tpl_alloc(&c->arena, 2 * (nk + 1) * sizeof *kw);
    if (!kw)
        return tpl_fail_nomem(c, n);
    memcpy(kw, st.a.kw_names, nk * sizeof *kw);
    memcpy(kw + nk + 1, st.a.kw_vals, nk * sizeof *kw);
    kw[nk] = tpl_cstr("caller");
    kw[2 * nk + 1] = (tpl_val){.type = TPL_MACRO, .u.m = m};
    TPL_TRY(tpl_call_value(c, call, fn, st.a.pos, st.a.n_pos, kw, kw + nk + 1, nk + 1, &res));
    return output_value(c, n, res);
}

static int exec_node(tpl_ctx *c, const tpl_node *n)
{
    tpl_val v;
    switch (n->kind) {
    case N_TEXT: return write_out(c, n, n->value.u.s.p, n->value.u.s.n);
    case N_OUTPUT: return exec_output(c, n);
    case N_IF:
        TPL_TRY(eval(c, n->a, &v));
        if (tpl_truthy(v))
            return exec_block(c, n->b);
        if (!n->c)
            return 0;
        return n->c->kind == N_IF ? exec_node(c, n->c) : exec_block(c, n->c);
    case N_FOR: return exec_for(c, n);
    case N_SET: TPL_TRY(eval(c, n->a, &v)); return assign(c, n->b, v);
    case N_SETBLOCK: return exec_setblock(c, n);
    case N_MACRO: return exec_macro_def(c, n);
    case N_FILTERBLK: return exec_filterblock(c, n);
    case N_WITH: return exec_with(c, n);
    case N_CALLBLOCK: return exec_call_block(c, n);
    case N_BLOCK: return exec_block(c, n);
    case N_BREAK: return FLOW_BREAK;
    case N_CONTINUE: return FLOW_CONTINUE;
    default: return tpl_fail(c, n, LMS_ERR_FORMAT, "not a statement");
    }
}

/* Every eval and exec level goes through here: it keeps the clock and
 * bounds the C stack (nested expressions inside recursive macros multiply). */
static int enter(tpl_ctx *c, const tpl_node *n)
{
    if (++c->nest > TPL_MAX_RENDER_NEST) {
        c->nest--;
        return tpl_fail(c, n, LMS_ERR_LIMIT, "expressions and blocks nested deeper than %d",
                        TPL_MAX_RENDER_NEST);
    }
    int rc = tpl_tick(c, n);
    if (rc < 0)
        c->nest--;
    return rc;
}

static int eval(tpl_ctx *c, const tpl_node *n, tpl_val *out)
{
    TPL_TRY(enter(c, n));
    int rc = eval_node(c, n, out);
    c->nest--;
    return rc;
}

static int exec_stmt(tpl_ctx *c, const tpl_node *n)
{
    TPL_TRY(enter(c, n));
    int rc = exec_node(c, n);
    c->nest--;
    return rc;
}

static int exec_block(tpl_ctx *c, const tpl_node *block)
{
    for (size_t k = 0; k < block->n_kids; k++) {
        int rc = exec_stmt(c, block->kids[k]);
        if (rc != 0)
            return rc; /* error, break or continue */
    }
    return 0;
}

int tpl_render(tpl_ctx *c, const tpl_node *root)
{
    int rc = exec_block(c, root);
    return rc < 0 ? rc : 0;
}
