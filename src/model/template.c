/*
 * template.c - the public API of template.h: parse (lex + parse into a
 * template-owned arena), apply (convert the JSON inputs into values, set up
 * the variables transformers passes, run the evaluator), and the one-shot
 * lms_template_render.
 */
#include "model/template.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/timeutil.h"
#include "model/template_impl.h"

#define TPL_PARSE_MAX_BYTES ((size_t)256 << 20) /* AST of one template */
#define TPL_JSON_MAX_DEPTH  512

static const lms_template_limits k_default_limits = {
    .max_loop_iters = 1000000,
    .max_depth = 64,
    .max_output_bytes = (size_t)16 << 20,
    .max_memory_bytes = (size_t)256 << 20,
    .max_time_ms = 5000,
};

/* ---- parse ------------------------------------------------------------------ */

int lms_template_parse(const char *src, size_t n, lms_template **out, char *err, size_t errsz)
{
    if (!src && n)
        return lms_errf(err, errsz, LMS_ERR_INVAL, "template: no source");
    lms_template *t = calloc(1, sizeof *t);
    if (!t)
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "template: out of memory");
    tpl_arena_init(&t->arena, TPL_PARSE_MAX_BYTES);
    tpl_tokens toks = {0};
    int rc = tpl_lex(&t->arena, src ? src : "", n, &toks, err, errsz);
    if (rc == 0)
        rc = tpl_parse(t, &toks, err, errsz);
    free(toks.v);
    if (rc < 0) {
        lms_template_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

void lms_template_destroy(lms_template *t)
{
    if (!t)
        return;
    tpl_arena_deinit(&t->arena);
    free(t);
}

/* ---- JSON -> values ------------------------------------------------------------ */

static int from_json(tpl_ctx *c, const json_t *j, int depth, tpl_val *out);

static int from_json_object(tpl_ctx *c, const json_t *j, int depth, tpl_val *out)
{
    tpl_dict *d = tpl_dict_new(&c->arena, json_object_size(j));
    if (!d)
        return tpl_fail_nomem(c, NULL);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)j, key, v)
    {
        tpl_val kv, vv;
        size_t kn = strlen(key);
        char *k = tpl_strdup(&c->arena, key, kn);
        if (!k)
            return tpl_fail_nomem(c, NULL);
        kv = tpl_str(k, kn);
        int rc = from_json(c, v, depth + 1, &vv);
        if (rc < 0)
            return rc;
        if (tpl_dict_append(&c->arena, d, kv, vv) < 0)
            return tpl_fail_nomem(c, NULL);
    }
    *out = tpl_dict_val(d);
    return 0;
}

static int from_json(tpl_ctx *c, const json_t *j, int depth, tpl_val *out)
{
    if (depth > TPL_JSON_MAX_DEPTH)
        return tpl_fail(c, NULL, LMS_ERR_LIMIT, "input JSON nested deeper than %d",
                        TPL_JSON_MAX_DEPTH);
    switch (json_typeof(j)) {
    case JSON_NULL: *out = tpl_none(); return 0;
    case JSON_TRUE: *out = tpl_bool(true); return 0;
    case JSON_FALSE: *out = tpl_bool(false); return 0;
    case JSON_INTEGER: *out = tpl_int((int64_t)json_integer_value(j)); return 0;
    case JSON_REAL: *out = tpl_float(json_real_value(j)); return 0;
    case JSON_STRING: {
        size_t n = json_string_length(j);
        char *p = tpl_strdup(&c->arena, json_string_value(j), n);
        if (!p)
            return tpl_fail_nomem(c, NULL);
        *out = tpl_str(p, n);
        return 0;
    }
    case JSON_ARRAY: {
        tpl_list *l = tpl_list_new(&c->arena, json_array_size(j));
        if (!l)
            return tpl_fail_nomem(c, NULL);
        for (size_t i = 0; i < json_array_size(j); i++) {
            int rc = from_json(c, json_array_get(j, i), depth + 1, &l->items[i]);
            if (rc < 0)
                return rc;
            l->n++;
        }
        *out = tpl_list_val(l);
        return 0;
    }
    case JSON_OBJECT: return from_json_object(c, j, depth, out);
    default: return tpl_fail(c, NULL, LMS_ERR_INVAL, "unknown JSON value type");
    }
}

/* ---- variables ----------------------------------------------------------------- */

static int set_var(tpl_ctx *c, tpl_scope *s, const char *name, tpl_val v)
{
    if (tpl_dict_set(&c->arena, &s->vars, tpl_cstr(name), v) < 0)
        return tpl_fail_nomem(c, NULL);
    return 0;
}

static int set_json_var(tpl_ctx *c, tpl_scope *s, const char *name, const json_t *j)
{
    tpl_val v;
    int rc = from_json(c, j, 0, &v);
    return rc < 0 ? rc : set_var(c, s, name, v);
}

/* The template's globals and variables, as transformers passes them. */
static int setup_vars(tpl_ctx *c, tpl_scope *s, const lms_template_vars *v)
{
    static const struct {
        const char *name;
        int fn;
    } funcs[] = {{"namespace", FN_NAMESPACE},
                 {"range", FN_RANGE},
                 {"dict", FN_DICT},
                 {"raise_exception", FN_RAISE},
                 {"strftime_now", FN_STRFTIME}};
    int rc = 0;
    for (size_t k = 0; k < sizeof funcs / sizeof funcs[0] && rc == 0; k++) {
        tpl_val f = {.type = TPL_FUNC};
        f.u.fn = funcs[k].fn;
        rc = set_var(c, s, funcs[k].name, f);
    }
    if (rc == 0 && v->messages)
        rc = set_json_var(c, s, "messages", v->messages);
    else if (rc == 0)
        rc = set_var(c, s, "messages", tpl_list_val(tpl_list_new(&c->arena, 0)));
    if (rc == 0 && v->tools)
        rc = set_json_var(c, s, "tools", v->tools);
    if (rc == 0)
        rc = set_var(c, s, "add_generation_prompt", tpl_bool(v->add_generation_prompt));
    if (rc == 0 && v->bos_token)
        rc = set_var(c, s, "bos_token", tpl_cstr(v->bos_token));
    if (rc == 0 && v->eos_token)
        rc = set_var(c, s, "eos_token", tpl_cstr(v->eos_token));
    if (rc == 0 && v->extra && json_is_object(v->extra)) {
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)v->extra, key, val)
        {
            char *k = tpl_strdup(&c->arena, key, strlen(key));
            if (!k)
                return tpl_fail_nomem(c, NULL);
            if ((rc = set_json_var(c, s, k, val)) < 0)
                break;
        }
    }
    return rc;
}

static void fill_limits(lms_template_limits *l, const lms_template_limits *user)
{
    *l = k_default_limits;
    if (!user)
        return;
    if (user->max_loop_iters > 0)
        l->max_loop_iters = user->max_loop_iters;
    if (user->max_depth > 0)
        l->max_depth = user->max_depth;
    if (user->max_output_bytes > 0)
        l->max_output_bytes = user->max_output_bytes;
    if (user->max_memory_bytes > 0)
        l->max_memory_bytes = user->max_memory_bytes;
    if (user->max_time_ms > 0)
        l->max_time_ms = user->max_time_ms;
}

/* ---- apply ---------------------------------------------------------------------- */

int lms_template_apply(const lms_template *t, const lms_template_vars *vars, char **out,
                       size_t *out_len, char *err, size_t errsz)
{
    if (!t || !vars || !out)
        return lms_errf(err, errsz, LMS_ERR_INVAL, "template: bad arguments");
    if (vars->messages && !json_is_array(vars->messages))
        return lms_errf(err, errsz, LMS_ERR_INVAL, "template: messages must be a JSON array");
    tpl_ctx c = {.vars = vars, .err = err, .errsz = errsz};
    fill_limits(&c.lim, vars->limits);
    tpl_arena_init(&c.arena, c.lim.max_memory_bytes);
    tpl_buf buf = {.max_bytes = c.lim.max_output_bytes};
    c.out = &buf;
    c.deadline_ms = (int64_t)lms_now_ms() + c.lim.max_time_ms;
    int rc = 0;
    tpl_scope *top = tpl_alloc(&c.arena, sizeof *top);
    if (!top)
        rc = tpl_fail_nomem(&c, NULL);
    c.scope = top;
    if (rc == 0)
        rc = setup_vars(&c, top, vars);
    if (rc == 0)
        rc = tpl_render(&c, t->root);
    if (rc == 0 && !buf.p)
        rc = tpl_buf_put(&buf, "", 0) < 0 ? tpl_fail_nomem(&c, NULL) : 0;
    tpl_arena_deinit(&c.arena);
    if (rc < 0) {
        tpl_buf_free(&buf);
        return rc;
    }
    *out = buf.p;
    if (out_len)
        *out_len = buf.n;
    return 0;
}

int lms_template_render(const char *tpl, size_t tpl_len, const lms_template_vars *vars, char **out,
                        size_t *out_len, char *err, size_t errsz)
{
    lms_template *t = NULL;
    int rc = lms_template_parse(tpl, tpl_len, &t, err, errsz);
    if (rc < 0)
        return rc;
    rc = lms_template_apply(t, vars, out, out_len, err, errsz);
    lms_template_destroy(t);
    return rc;
}

int lms_template_switches(const char *kwargs_json, const char *reasoning, json_t **out,
                          char *err, size_t errsz)
{
    *out = NULL;
    const char *r = reasoning;
    if (r && strcmp(r, "on") && strcmp(r, "off") && strcmp(r, "auto"))
        return lms_errf(err, errsz, LMS_ERR_INVAL, "reasoning '%.40s': use on, off or auto", r);
    json_t *kw = NULL;
    if (kwargs_json && kwargs_json[0]) {
        json_error_t je;
        kw = json_loads(kwargs_json, 0, &je);
        if (!json_is_object(kw)) {
            const int rc = lms_errf(err, errsz, LMS_ERR_INVAL, "chat template kwargs: %s",
                                    kw ? "must be a JSON object" : je.text);
            json_decref(kw);
            return rc;
        }
    }
    if (r && strcmp(r, "auto")) {
        if (!kw && !(kw = json_object()))
            return lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory");
        json_object_set_new(kw, "enable_thinking", json_boolean(!strcmp(r, "on")));
    }
    *out = kw;
    return 0;
}
