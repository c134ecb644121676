/*
 * config.c - reads and checks the multi-model configuration (config.h).
 *
 * Parsing goes field by field with a path naming where we are
 * ("experts[2].examples[0]"); the first problem ends the parse with a
 * message "FILE: PATH: what is wrong". Unknown keys are refused too: a
 * misspelt "max_loaded_expert" silently ignored would be worse than an error.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "base/err.h"
#include "model/template.h"
#include "route/config.h"

#define MAX_EXPERTS 256
#define MAX_EXAMPLES 1024
#define MAX_TEXT 65536

typedef struct cfgp {
    const char *name;      /* the file, for messages */
    const char *base_dir;  /* relative model paths start here */
    char **dirs;           /* model_dirs, resolved; NULL = no restriction */
    int n_dirs;
    char *err;
    size_t errsz;
} cfgp;

static int fail(cfgp *P, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(cfgp *P, const char *field, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return lms_errf(P->err, P->errsz, LMS_ERR_FORMAT, "%s: %s: %s", P->name, field, what);
}

/* ---- typed fields ---------------------------------------------------------------- */

/* A string without NUL or control characters, at most max bytes; absent or
 * null gives *out = NULL when optional. */
static int get_str(cfgp *P, const json_t *o, const char *key, const char *field, bool required,
                   size_t max, char **out)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required)
            return fail(P, field, "is missing");
        *out = NULL;
        return 0;
    }
    if (!json_is_string(v))
        return fail(P, field, "must be a string");
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n != strlen(s))
        return fail(P, field, "contains a NUL character");
    if (n == 0 && required)
        return fail(P, field, "must not be empty");
    if (n > max)
        return fail(P, field, "is too long (more than %zu bytes)", max);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 && s[i] != '\t' && s[i] != '\n')
            return fail(P, field, "contains a control character");
    if (!(*out = strdup(s)))
        return lms_errf(P->err, P->errsz, LMS_ERR_NOMEM, "out of memory");
    return 0;
}

static int get_num(cfgp *P, const json_t *o, const char *key, const char *field, bool integer,
                   double lo, double hi, double *out)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (integer ? !json_is_integer(v) : !json_is_number(v))
        return fail(P, field, "%s", integer ? "must be an integer" : "must be a number");
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) {
        char range[96];
        snprintf(range, sizeof range, "%g and %g", lo, hi);
        return fail(P, field, "must be between %s", range);
    }
    *out = d;
    return 0;
}

static int get_bool(cfgp *P, const json_t *o, const char *key, const char *field, bool *out)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return fail(P, field, "must be true or false");
    *out = json_is_true(v);
    return 0;
}

/* Refuses keys other than those listed (NULL-terminated). */
static int only_keys(cfgp *P, const json_t *o, const char *where, const char *const *keys)
{
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        bool known = false;
        for (const char *const *p = keys; *p && !known; p++)
            known = !strcmp(k, *p);
        if (!known) {
            char field[300];
            snprintf(field, sizeof field, "%s%s%.200s", where, where[0] ? "." : "", k);
            return fail(P, field, "is not a known setting");
        }
    }
    return 0;
}

static bool id_ok(const char *s)
{
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '_' || *s == '-' || *s == ':'))
            return false;
    return true;
}

/* ---- model paths ----------------------------------------------------------------- */

static bool under(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    if (n == 1 && dir[0] == '/')
        return true;
    return !strncmp(path, dir, n) && (path[n] == '/' || path[n] == '\0');
}

/* Resolves model_path: relative to base_dir and staying inside it, a
 * regular readable file, inside model_dirs when given. */
static int resolve_path(cfgp *P, const char *field, char **path)
{
    char joined[PATH_MAX], real[PATH_MAX];
    const char *p = *path;
    bool rel = p[0] != '/';
    if (rel && snprintf(joined, sizeof joined, "%s/%s", P->base_dir, p) >= (int)sizeof joined)
        return fail(P, field, "'%.200s' is too long", p);
    if (!realpath(rel ? joined : p, real))
        return fail(P, field, "'%.300s' does not exist or cannot be reached", p);
    struct stat st;
    if (stat(real, &st) != 0 || !S_ISREG(st.st_mode))
        return fail(P, field, "'%.300s' is not a regular file", p);
    FILE *f = fopen(real, "rb");
    if (!f)
        return fail(P, field, "'%.300s' cannot be read", p);
    fclose(f);
    if (rel) {
        char base[PATH_MAX];
        if (!realpath(P->base_dir, base) || !under(real, base))
            return fail(P, field, "'%.300s' leads outside the config file's directory", p);
    }
    bool allowed = P->n_dirs == 0;
    for (int i = 0; i < P->n_dirs && !allowed; i++)
        allowed = under(real, P->dirs[i]);
    if (!allowed)
        return fail(P, field, "'%.300s' is not inside any of model_dirs", p);
    char *copy = strdup(real);
    if (!copy)
        return lms_errf(P->err, P->errsz, LMS_ERR_NOMEM, "out of memory");
    free(*path);
    *path = copy;
    return 0;
}

static int parse_dirs(cfgp *P, const json_t *root)
{
    const json_t *a = json_object_get(root, "model_dirs");
    if (!a || json_is_null(a))
        return 0;
    if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > 64)
        return fail(P, "model_dirs", "must be an array of 1 to 64 directories");
    P->dirs = calloc(json_array_size(a), sizeof *P->dirs);
    if (!P->dirs)
        return lms_errf(P->err, P->errsz, LMS_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < json_array_size(a); i++) {
        char field[64], real[PATH_MAX], joined[PATH_MAX];
        snprintf(field, sizeof field, "model_dirs[%zu]", i);
        const json_t *v = json_array_get(a, i);
        if (!json_is_string(v) || json_string_length(v) != strlen(json_string_value(v)) ||
            json_string_length(v) == 0)
            return fail(P, field, "must be a non-empty string without NUL");
        const char *d = json_string_value(v);
        if (d[0] != '/')
            snprintf(joined, sizeof joined, "%s/%s", P->base_dir, d);
        if (!realpath(d[0] == '/' ? d : joined, real))
            return fail(P, field, "'%.300s' does not exist", d);
        if (!(P->dirs[P->n_dirs++] = strdup(real)))
            return lms_errf(P->err, P->errsz, LMS_ERR_NOMEM, "out of memory");
    }
    return 0;
}

/* ---- sections ---------------------------------------------------------------------- */

static int parse_examples(cfgp *P, const json_t *x, const char *where, lms_expert_cfg *e)
{
    char field[128];
    snprintf(field, sizeof field, "%s.examples", where);
    const json_t *a = json_object_get(x, "examples");
    if (!a || json_is_null(a))
        return 0;
    if (!json_is_array(a))
        return fail(P, field, "must be an array of strings");
    if (json_array_size(a) > MAX_EXAMPLES)
        return fail(P, field, "has more than %s entries", "1024");
    e->examples = calloc(json_array_size(a) + 1, sizeof *e->examples);
    if (!e->examples)
        return lms_errf(P->err, P->errsz, LMS_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < json_array_size(a); i++) {
        char f2[160];
        snprintf(f2, sizeof f2, "%s[%zu]", field, i);
        const json_t *wrap = json_pack("{s:O}", "v", json_array_get(a, i));
        int rc = get_str(P, wrap, "v", f2, true, MAX_TEXT, &e->examples[i]);
        json_decref((json_t *)wrap);
        if (rc < 0)
            return rc;
        e->n_examples++;
    }
    return 0;
}

int lms_expert_cfg_add_lora(lms_expert_cfg *e, const char *path, float scale)
{
    if (e->n_loras >= LMS_EXPERT_LORAS)
        return LMS_ERR_LIMIT;
    if (!e->lora_paths) {
        e->lora_paths = calloc(LMS_EXPERT_LORAS, sizeof *e->lora_paths);
        e->lora_scales = calloc(LMS_EXPERT_LORAS, sizeof *e->lora_scales);
        if (!e->lora_paths || !e->lora_scales)
            return LMS_ERR_NOMEM;
    }
    if (!(e->lora_paths[e->n_loras] = strdup(path)))
        return LMS_ERR_NOMEM;
    e->lora_scales[e->n_loras++] = scale;
    return 0;
}

/* "lora": adapters loaded with the model, each a path or {"path", "scale"}
 * (scale 1 by default; 0 loads it for requests that ask for it). Paths
 * resolve as model_path does. */
static int parse_loras(cfgp *P, const json_t *x, const char *where, lms_expert_cfg *e)
{
    char field[128];
    snprintf(field, sizeof field, "%s.lora", where);
    const json_t *a = json_object_get(x, "lora");
    if (!a || json_is_null(a))
        return 0;
    if (!json_is_array(a) || json_array_size(a) > LMS_EXPERT_LORAS)
        return fail(P, field, "must be an array of at most %d adapters", LMS_EXPERT_LORAS);
    for (size_t i = 0; i < json_array_size(a); i++) {
        char f2[160], f3[176];
        snprintf(f2, sizeof f2, "%s[%zu]", field, i);
        const json_t *v = json_array_get(a, i);
        json_t *o = json_is_string(v) ? json_pack("{s:O}", "path", v) : json_incref((json_t *)v);
        static const char *const keys[] = {"path", "scale", NULL};
        char *path = NULL;
        double scale = 1.0;
        snprintf(f3, sizeof f3, "%s.path", f2);
        int rc = !json_is_object(o) ? fail(P, f2, "must be a path or {\"path\", \"scale\"}")
                                    : only_keys(P, o, f2, keys);
        if (rc == 0 && (rc = get_str(P, o, "path", f3, true, PATH_MAX - 1, &path)) == 0)
            rc = resolve_path(P, f3, &path);
        snprintf(f3, sizeof f3, "%s.scale", f2);
        if (rc == 0)
            rc = get_num(P, o, "scale", f3, false, -100, 100, &scale);
        if (rc == 0 && lms_expert_cfg_add_lora(e, path, (float)scale) < 0)
            rc = lms_errf(P->err, P->errsz, LMS_ERR_NOMEM, "out of memory");
        free(path);
        json_decref(o);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* An endpoint URL: http(s)://authority[/path], printable ASCII, no
 * credentials in it (they would show wherever the endpoint is shown). */
static int check_endpoint(cfgp *P, const char *field, char *url)
{
    size_t n = strlen(url), scheme = 0;
    if (!strncmp(url, "http://", 7))
        scheme = 7;
    else if (!strncmp(url, "https://", 8))
        scheme = 8;
    if (!scheme)
        return fail(P, field, "must start with http:// or https://");
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)url[i] <= 0x20 || (unsigned char)url[i] >= 0x7f)
            return fail(P, field, "must be printable ASCII without spaces");
    size_t auth = strcspn(url + scheme, "/?#");
    if (auth == 0)
        return fail(P, field, "names no host");
    if (memchr(url + scheme, '@', auth))
        return fail(P, field, "must not hold credentials (use api_key or api_key_env)");
    if (strpbrk(url + scheme, "?#"))
        return fail(P, field, "must not hold a query or fragment");
    while (n > scheme + auth && url[n - 1] == '/')
        url[--n] = '\0';
    return 0;
}

/* api_key or api_key_env (the variable is read now). Messages never show
 * the key. */
static int parse_key(cfgp *P, const json_t *x, const char *where, lms_expert_cfg *e)
{
    char kfield[96], field[96], *var = NULL;
    snprintf(kfield, sizeof kfield, "%s.api_key", where);
    int rc = get_str(P, x, "api_key", kfield, false, 4096, &e->api_key);
    snprintf(field, sizeof field, "%s.api_key_env", where);
    if (rc == 0)
        rc = get_str(P, x, "api_key_env", field, false, 128, &var);
    if (rc == 0 && var && e->api_key)
        rc = fail(P, field, "cannot be given with api_key");
    if (rc == 0 && var) {
        const char *v = getenv(var);
        if (!v || !v[0])
            rc = fail(P, field, "the environment variable '%.128s' is not set", var);
        else if (!(e->api_key = strdup(v)))
            rc = lms_errf(P->err, P->errsz, LMS_ERR_NOMEM, "out of memory");
    }
    for (const char *k = e->api_key; rc == 0 && k && *k; k++)
        if ((unsigned char)*k < 0x20 || *k == 0x7f)
            rc = fail(P, var ? field : kfield, "the key contains a control character");
    free(var);
    return rc;
}

/* The fields of an expert served elsewhere. */
static int parse_remote(cfgp *P, const json_t *x, const char *where, lms_expert_cfg *e)
{
    char field[96];
    snprintf(field, sizeof field, "%s.endpoint", where);
    int rc = get_str(P, x, "endpoint", field, true, 2048, &e->endpoint);
    if (rc == 0)
        rc = check_endpoint(P, field, e->endpoint);
    if (rc == 0 && json_object_get(x, "lora"))
        rc = fail(P, field, "an expert with an endpoint takes no 'lora'");
    if (rc == 0 && json_object_get(x, "draft"))
        rc = fail(P, field, "an expert with an endpoint takes no 'draft'");
    if (rc == 0)
        rc = parse_key(P, x, where, e);
    snprintf(field, sizeof field, "%s.remote_model", where);
    if (rc == 0)
        rc = get_str(P, x, "remote_model", field, false, 256, &e->remote_model);
    if (rc == 0 && !e->remote_model && !(e->remote_model = strdup(e->id)))
        rc = lms_errf(P->err, P->errsz, LMS_ERR_NOMEM, "out of memory");
    snprintf(field, sizeof field, "%s.timeout_s", where);
    e->timeout_s = 600;
    if (rc == 0)
        rc = get_num(P, x, "timeout_s", field, false, 0.1, 86400, &e->timeout_s);
    return rc;
}

/* The largest chat template file read. */
#define MAX_TEMPLATE (1u << 20)

/* *tpl names a built-in template or a template file (resolved as
 * model_path): replaced by the template's text, checked to parse. */
static int load_template(cfgp *P, const char *field, char **tpl)
{
    const char *builtin = lms_template_builtin(*tpl);
    char *text = NULL;
    if (builtin) {
        text = strdup(builtin);
    } else {
        int rc = resolve_path(P, field, tpl);
        if (rc < 0)
            return rc;
        FILE *f = fopen(*tpl, "rb");
        text = f ? malloc(MAX_TEMPLATE + 1) : NULL;
        size_t n = text ? fread(text, 1, MAX_TEMPLATE + 1, f) : 0;
        if (f)
            fclose(f);
        if (text && n > MAX_TEMPLATE) {
            free(text);
            return fail(P, field, "'%.300s' is larger than 1 MiB", *tpl);
        }
        if (text)
            text[n] = 0;
    }
    if (!text)
        return lms_errf(P->err, P->errsz, LMS_ERR_NOMEM, "out of memory");
    lms_template *t;
    char msg[256];
    if (lms_template_parse(text, strlen(text), &t, msg, sizeof msg) < 0) {
        free(text);
        return fail(P, field, "the template does not parse: %s", msg);
    }
    lms_template_destroy(t);
    free(*tpl);
    *tpl = text;
    return 0;
}

static int parse_expert(cfgp *P, const json_t *x, int i, lms_route_cfg *c)
{
    static const char *const keys[] = {"expert_id", "model_path", "domain", "priority",
                                       "examples", "lora", "draft", "endpoint", "api_key",
                                       "api_key_env", "remote_model", "timeout_s",
                                       "chat_template", NULL};
    static const char *const remote_only[] = {"api_key", "api_key_env", "remote_model",
                                              "timeout_s", NULL};
    char where[32], field[64];
    snprintf(where, sizeof where, "experts[%d]", i);
    if (!json_is_object(x))
        return fail(P, where, "must be an object");
    lms_expert_cfg *e = &c->experts[i];
    int rc = only_keys(P, x, where, keys);
    snprintf(field, sizeof field, "%s.expert_id", where);
    if (rc == 0 && (rc = get_str(P, x, "expert_id", field, true, LMS_EXPERT_ID_MAX, &e->id)) == 0 &&
        !id_ok(e->id))
        rc = fail(P, field, "'%.128s' may only hold letters, digits and . _ - :", e->id);
    if (rc == 0 && !strcmp(e->id, "auto"))
        rc = fail(P, field, "'auto' is reserved (it asks for the router)");
    for (int k = 0; rc == 0 && k < i; k++)
        if (!strcmp(c->experts[k].id, e->id))
            rc = fail(P, field, "'%.128s' is used by an earlier expert", e->id);
    const json_t *ep = json_object_get(x, "endpoint");
    bool remote = ep && !json_is_null(ep);
    snprintf(field, sizeof field, "%s.model_path", where);
    if (rc == 0 && remote && json_object_get(x, "model_path"))
        rc = fail(P, field, "cannot be given with endpoint (an expert is local or remote)");
    if (rc == 0 && !remote && !json_object_get(x, "model_path"))
        rc = fail(P, field, "is missing (or give 'endpoint' for an expert served elsewhere)");
    for (int k = 0; rc == 0 && !remote && remote_only[k]; k++)
        if (json_object_get(x, remote_only[k])) {
            snprintf(field, sizeof field, "%s.%s", where, remote_only[k]);
            rc = fail(P, field, "is only for an expert with 'endpoint'");
        }
    snprintf(field, sizeof field, "%s.model_path", where);
    if (rc == 0 && remote)
        rc = parse_remote(P, x, where, e);
    else if (rc == 0 && (rc = get_str(P, x, "model_path", field, true, PATH_MAX - 1, &e->path)) == 0)
        rc = resolve_path(P, field, &e->path);
    snprintf(field, sizeof field, "%s.domain", where);
    if (rc == 0)
        rc = get_str(P, x, "domain", field, false, MAX_TEXT, &e->domain);
    snprintf(field, sizeof field, "%s.priority", where);
    double prio = 0;
    if (rc == 0 && (rc = get_num(P, x, "priority", field, true, -1000000, 1000000, &prio)) == 0)
        e->priority = (int)prio;
    if (rc == 0)
        rc = parse_examples(P, x, where, e);
    snprintf(field, sizeof field, "%s.draft", where);
    if (rc == 0 && !remote &&
        (rc = get_str(P, x, "draft", field, false, PATH_MAX - 1, &e->draft)) == 0 && e->draft)
        rc = resolve_path(P, field, &e->draft);
    snprintf(field, sizeof field, "%s.chat_template", where);
    if (rc == 0 && remote && json_object_get(x, "chat_template"))
        rc = fail(P, field, "an expert with an endpoint takes no 'chat_template'");
    if (rc == 0 && !remote &&
        (rc = get_str(P, x, "chat_template", field, false, PATH_MAX - 1, &e->chat_template)) == 0 &&
        e->chat_template)
        rc = load_template(P, field, &e->chat_template);
    return rc == 0 && !remote ? parse_loras(P, x, where, e) : rc;
}

static int parse_experts(cfgp *P, const json_t *root, lms_route_cfg *c)
{
    const json_t *a = json_object_get(root, "experts");
    if (!a)
        return fail(P, "experts", "is missing");
    if (!json_is_array(a))
        return fail(P, "experts", "must be an array of objects");
    if (json_array_size(a) == 0 || json_array_size(a) > MAX_EXPERTS)
        return fail(P, "experts", "must hold 1 to %s experts", "256");
    c->experts = calloc(json_array_size(a), sizeof *c->experts);
    if (!c->experts)
        return lms_errf(P->err, P->errsz, LMS_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < json_array_size(a); i++) {
        c->n_experts = (int)i + 1;
        int rc = parse_expert(P, json_array_get(a, i), (int)i, c);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int parse_lazy(cfgp *P, const json_t *root, lms_route_cfg *c)
{
    static const char *const keys[] = {"enabled", "warmup_pool_size", "max_loaded_experts",
                                       "memory_threshold", "auto_unload_after_s", NULL};
    const json_t *o = json_object_get(root, "lazy_loading");
    if (!o || json_is_null(o))
        return 0;
    if (!json_is_object(o))
        return fail(P, "lazy_loading", "must be an object");
    double warm = 0, max = 0, mem = 0, idle = 0;
    int rc = only_keys(P, o, "lazy_loading", keys);
    if (rc == 0)
        rc = get_bool(P, o, "enabled", "lazy_loading.enabled", &c->lazy);
    if (rc == 0)
        rc = get_num(P, o, "warmup_pool_size", "lazy_loading.warmup_pool_size", true, 0,
                     MAX_EXPERTS, &warm);
    if (rc == 0)
        rc = get_num(P, o, "max_loaded_experts", "lazy_loading.max_loaded_experts", true, 0,
                     MAX_EXPERTS, &max);
    if (rc == 0)
        rc = get_num(P, o, "memory_threshold", "lazy_loading.memory_threshold", false, 0, 1,
                     &mem);
    if (rc == 0)
        rc = get_num(P, o, "auto_unload_after_s", "lazy_loading.auto_unload_after_s", false, 0,
                     86400.0 * 365, &idle);
    if (rc < 0)
        return rc;
    c->warmup = (int)warm;
    c->max_loaded = (int)max;
    c->mem_threshold = mem;
    c->unload_after_s = idle;
    if (c->max_loaded > 0 && c->warmup > c->max_loaded)
        return fail(P, "lazy_loading.warmup_pool_size",
                    "is larger than max_loaded_experts");
    return 0;
}

/* router.embedding_model: an expert id, else a model file (the rules of
 * model_path) loaded for the router alone. */
static int parse_embedder(cfgp *P, lms_route_cfg *c)
{
    c->embed_expert = lms_route_cfg_find(c, c->embedding_model);
    if (c->embed_expert >= 0 && c->experts[c->embed_expert].endpoint)
        return fail(P, "router.embedding_model", "'%.128s' is a remote expert; the router "
                    "embeds with a local model", c->embedding_model);
    if (c->embed_expert >= 0)
        return 0;
    lms_expert_cfg *e = &c->embedder;
    e->path = strdup(c->embedding_model);
    e->id = strdup("router-embedding");
    if (!e->path || !e->id)
        return lms_errf(P->err, P->errsz, LMS_ERR_NOMEM, "out of memory");
    if (lms_route_cfg_find(c, e->id) >= 0)
        return fail(P, "router.embedding_model", "the expert id 'router-embedding' is reserved "
                    "for an embedding model given as a file");
    return resolve_path(P, "router.embedding_model", &e->path);
}

static int parse_router(cfgp *P, const json_t *root, lms_route_cfg *c)
{
    static const char *const keys[] = {"default", "embedding_model", "threshold", NULL};
    const json_t *o = json_object_get(root, "router");
    c->threshold = 0.1;
    if (!o || json_is_null(o))
        return 0;
    if (!json_is_object(o))
        return fail(P, "router", "must be an object");
    int rc = only_keys(P, o, "router", keys);
    if (rc == 0)
        rc = get_str(P, o, "default", "router.default", false, LMS_EXPERT_ID_MAX, &c->default_id);
    if (rc == 0 && c->default_id && lms_route_cfg_find(c, c->default_id) < 0)
        rc = fail(P, "router.default", "'%.128s' is not an expert_id", c->default_id);
    if (rc == 0)
        rc = get_str(P, o, "embedding_model", "router.embedding_model", false, PATH_MAX - 1,
                     &c->embedding_model);
    if (rc == 0 && c->embedding_model)
        rc = parse_embedder(P, c);
    if (rc == 0)
        rc = get_num(P, o, "threshold", "router.threshold", false, 0, 1, &c->threshold);
    return rc;
}

/* ---- entry points ------------------------------------------------------------------- */

int lms_route_cfg_parse(const char *text, size_t n, const char *name, const char *base_dir,
                        lms_route_cfg *out, char *err, size_t errsz)
{
    static const char *const keys[] = {"experts", "lazy_loading", "router", "model_dirs", NULL};
    cfgp P = {.name = name ? name : "config", .base_dir = base_dir ? base_dir : ".", .err = err,
              .errsz = errsz};
    json_error_t je;
    json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!root)
        return lms_errf(err, errsz, LMS_ERR_FORMAT, "%s: invalid JSON at line %d, column %d: %s",
                        P.name, je.line, je.column, je.text);
    lms_route_cfg c;
    memset(&c, 0, sizeof c);
    c.embed_expert = -1;
    int rc = json_is_object(root) ? 0 : fail(&P, "(top level)", "must be a JSON object");
    if (rc == 0)
        rc = only_keys(&P, root, "", keys);
    if (rc == 0)
        rc = parse_dirs(&P, root);
    if (rc == 0)
        rc = parse_experts(&P, root, &c);
    if (rc == 0)
        rc = parse_lazy(&P, root, &c);
    if (rc == 0)
        rc = parse_router(&P, root, &c);
    json_decref(root);
    for (int i = 0; i < P.n_dirs; i++)
        free(P.dirs[i]);
    free(P.dirs);
    if (rc < 0) {
        lms_route_cfg_free(&c);
        return rc;
    }
    *out = c;
    return 0;
}

int lms_route_cfg_load(const char *path, lms_route_cfg *out, char *err, size_t errsz)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return lms_errf(err, errsz, LMS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            char *nb = cap < (16u << 20) ? realloc(buf, cap ? cap * 2 : 65536) : NULL;
            if (!nb) {
                free(buf);
                fclose(f);
                return lms_errf(err, errsz, LMS_ERR_LIMIT, "%s: the file is over 16 MiB", path);
            }
            buf = nb;
            cap = cap ? cap * 2 : 65536;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0)
            break;
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return lms_errf(err, errsz, LMS_ERR_IO, "%s: cannot read", path);
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    int rc = lms_route_cfg_parse(buf, n, path, dir, out, err, errsz);
    free(buf);
    return rc;
}

int lms_route_cfg_single(const char *model_path, const char *id, lms_route_cfg *out)
{
    lms_route_cfg c;
    memset(&c, 0, sizeof c);
    c.embed_expert = -1;
    c.single = true;
    c.threshold = 0.1;
    c.n_experts = 1;
    c.experts = calloc(1, sizeof *c.experts);
    if (c.experts) {
        c.experts[0].id = strdup(id && id[0] ? id : "model");
        c.experts[0].path = strdup(model_path);
    }
    if (!c.experts || !c.experts[0].id || !c.experts[0].path) {
        lms_route_cfg_free(&c);
        return LMS_ERR_NOMEM;
    }
    *out = c;
    return 0;
}

static void expert_free(lms_expert_cfg *e)
{
    free(e->id);
    free(e->path);
    free(e->endpoint);
    if (e->api_key) /* secret: do not leave it in freed memory */
        memset(e->api_key, 0, strlen(e->api_key));
    free(e->api_key);
    free(e->remote_model);
    free(e->domain);
    for (int k = 0; k < e->n_examples; k++)
        free(e->examples[k]);
    free(e->examples);
    free(e->draft);
    free(e->chat_template);
    for (int k = 0; k < e->n_loras; k++)
        free(e->lora_paths[k]);
    free(e->lora_paths);
    free(e->lora_scales);
}

void lms_route_cfg_free(lms_route_cfg *c)
{
    for (int i = 0; i < c->n_experts; i++)
        expert_free(&c->experts[i]);
    expert_free(&c->embedder);
    free(c->experts);
    free(c->default_id);
    free(c->embedding_model);
    memset(c, 0, sizeof *c);
}

int lms_route_cfg_find(const lms_route_cfg *c, const char *id)
{
    for (int i = 0; i < c->n_experts; i++)
        if (!strcmp(c->experts[i].id, id))
            return i;
    return -1;
}
