/*
 * reqparse.c - client JSON in, errors out: parsing request bodies with
 * positions in the error, typed optional fields that name the field they
 * refuse, the generation parameters every dialect shares, and the OpenAI
 * error object.
 *
 * All input here is hostile. Unknown fields are ignored (clients send
 * extensions we do not know); a known field of the wrong type or out of
 * range is refused with its name, never coerced.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "engine/gbnf.h"
#include "engine/jsonschema.h"
#include "serve/serve_int.h"

/* ---- errors ------------------------------------------------------------------ */

static const char *type_of_status(int status)
{
    switch (status) {
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 429:
        return "rate_limit_error";
    case 503:
        return "unavailable_error";
    default:
        return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

int reqerr_set(reqerr *e, int status, const char *param, const char *fmt, ...)
{
    e->status = status;
    e->type = type_of_status(status);
    e->code = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int reqerr_from_submit(reqerr *e, int rc, const char *msg)
{
    switch (rc) {
    case LMS_ERR_BUSY:
        reqerr_set(e, 429, NULL, "%s", msg);
        e->code = "queue_full";
        break;
    case LMS_ERR_LIMIT:
        reqerr_set(e, 400, "messages", "%s", msg);
        e->code = "context_length_exceeded";
        break;
    case LMS_ERR_NOMEM:
        reqerr_set(e, 503, NULL, "%s", msg);
        break;
    default:
        reqerr_set(e, 400, NULL, "%s", msg);
        break;
    }
    return -1;
}

json_t *reqerr_json(const reqerr *e)
{
    json_t *err = json_object();
    json_object_set_new(err, "message", json_string_lossy(e->msg, strlen(e->msg)));
    json_object_set_new(err, "type", json_string(e->type ? e->type : "server_error"));
    json_object_set_new(err, "param", e->param[0] ? json_string_lossy(e->param, strlen(e->param))
                                                  : json_null());
    json_object_set_new(err, "code", e->code ? json_string(e->code) : json_null());
    json_t *o = json_object();
    json_object_set_new(o, "error", err);
    return o;
}

/* ---- JSON out helpers --------------------------------------------------------- */

json_t *json_string_lossy(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    if (j)
        return j;
    sbuf b = {0};
    sbuf_add_utf8(&b, s, n);
    j = b.oom ? json_string("") : json_stringn(b.p ? b.p : "", b.n);
    sbuf_free(&b);
    return j ? j : json_string("");
}

json_t *json_real_safe(double v)
{
    if (isnan(v))
        v = 0;
    else if (isinf(v))
        v = v > 0 ? 1e30 : -9999.0; /* -inf logprob: "impossible" */
    return json_real(v);
}

char *json_dump_compact(const json_t *j, size_t *n_out)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
    if (s && n_out)
        *n_out = strlen(s);
    return s;
}

/* ---- bodies ------------------------------------------------------------------------ */

int reqparse_body(const char *p, size_t n, json_t **out, reqerr *e)
{
    json_error_t je;
    json_t *j = json_loadb(p ? p : "", n, 0, &je);
    /* jansson names its option for NUL in strings; say what is wrong instead
     * (the server's strings end at NUL, so it takes none) */
    if (!j && json_error_code(&je) == json_error_null_character)
        return reqerr_set(e, 400, NULL, "invalid JSON at line %d, column %d: a string holds "
                          "\\u0000 (NUL), which this server does not accept", je.line, je.column);
    if (!j)
        return reqerr_set(e, 400, NULL, "invalid JSON at line %d, column %d: %s", je.line,
                          je.column, je.text);
    if (!json_is_object(j)) {
        json_decref(j);
        return reqerr_set(e, 400, NULL, "the request body must be a JSON object");
    }
    *out = j;
    return 0;
}

/* ---- typed fields ----------------------------------------------------------------- */

static const json_t *field(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

int reqparse_bool(const json_t *o, const char *key, bool *out, reqerr *e)
{
    const json_t *v = field(o, key);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return reqerr_set(e, 400, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 1;
}

int reqparse_int(const json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out,
                 reqerr *e)
{
    const json_t *v = field(o, key);
    if (!v)
        return 0;
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9.0e18) {
        x = (int64_t)json_real_value(v);
    } else {
        return reqerr_set(e, 400, key, "'%s' must be an integer", key);
    }
    if (x < lo || x > hi)
        return reqerr_set(e, 400, key, "'%s' must be between %lld and %lld, got %lld", key,
                          (long long)lo, (long long)hi, (long long)x);
    *out = x;
    return 1;
}

int reqparse_num(const json_t *o, const char *key, double lo, double hi, double *out, reqerr *e)
{
    const json_t *v = field(o, key);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return reqerr_set(e, 400, key, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return reqerr_set(e, 400, key, "'%s' must be between %g and %g, got %g", key, lo, hi, x);
    *out = x;
    return 1;
}

int reqparse_str(const json_t *o, const char *key, const char **out, reqerr *e)
{
    const json_t *v = field(o, key);
    if (!v)
        return 0;
    if (!json_is_string(v))
        return reqerr_set(e, 400, key, "'%s' must be a string", key);
    *out = json_string_value(v);
    return 1;
}

int reqparse_obj(const json_t *o, const char *key, const json_t **out, reqerr *e)
{
    const json_t *v = field(o, key);
    if (!v)
        return 0;
    if (!json_is_object(v))
        return reqerr_set(e, 400, key, "'%s' must be an object", key);
    *out = v;
    return 1;
}

/* ---- generation parameters --------------------------------------------------------- */

void genparams_init(genparams *gp, uint64_t seed)
{
    memset(gp, 0, sizeof *gp);
    gp->sp = lms_sampler_defaults();
    gp->sp.seed = seed;
    gp->max_tokens = -1;
    gp->reasoning_budget = -2;
}

void genparams_deinit(genparams *gp)
{
    for (int i = 0; i < gp->n_stop; i++)
        free(gp->stop[i]);
    gp->n_stop = 0;
    free(gp->grammar);
    gp->grammar = NULL;
    free(gp->think_close);
    gp->think_close = NULL;
    gp->n_think_close = 0;
}

json_t *reqparse_upstream(const json_t *o)
{
    static const char *const same[] = {"temperature", "top_p", "top_k", "min_p", "typical_p",
                                       "mirostat", "mirostat_tau", "mirostat_eta",
                                       "repeat_penalty", "presence_penalty", "frequency_penalty",
                                       "seed", "stop", "ignore_eos", "logit_bias", "grammar",
                                       NULL};
    static const char *const max[] = {"max_tokens", "max_completion_tokens", "n_predict", NULL};
    json_t *u = json_object();
    if (!u || !json_is_object(o))
        return u;
    for (int k = 0; same[k]; k++) {
        json_t *v = json_object_get(o, same[k]);
        if (v && !json_is_null(v))
            json_object_set(u, same[k], v);
    }
    json_t *t = json_object_get(o, "temp");
    if (json_is_number(t) && !json_object_get(u, "temperature"))
        json_object_set(u, "temperature", t);
    for (int k = 0; max[k]; k++) {
        json_t *v = json_object_get(o, max[k]);
        if (json_is_integer(v) && json_integer_value(v) >= 0) {
            json_object_set(u, "max_tokens", v);
            break;
        }
    }
    return u;
}

lms_request genparams_request(const genparams *gp, const int32_t *toks, int32_t n)
{
    lms_request r = {
        .tokens = toks, .n_tokens = n, .sp = gp->sp, .max_tokens = gp->max_tokens,
        .stop = (const char *const *)gp->stop, .n_stop = gp->n_stop,
        .ignore_eos = gp->ignore_eos, .timeout_ms = gp->timeout_ms,
        .loras = gp->n_loras ? gp->loras : NULL, .n_loras = gp->n_loras,
        .spec_n_max = gp->spec_n_max, .spec_n_min = gp->spec_n_min, .spec_p_min = gp->spec_p_min,
        .grammar = gp->grammar,
        .think_close = gp->think_close, .n_think_close = gp->n_think_close,
        .think_budget = gp->reasoning_budget, .think_open = gp->think_open,
    };
    return r;
}

#define MAX_STOP_BYTES 1024

/* "grammar": GBNF text compiled (engine/gbnf.h); null or "" for none */
static int parse_grammar(const json_t *o, genparams *gp, reqerr *e)
{
    const json_t *g = json_object_get(o, "grammar");
    if (!g || json_is_null(g))
        return 0;
    if (!json_is_string(g))
        return reqerr_set(e, 400, "grammar", "'grammar' must be a string (GBNF text)");
    const size_t n = json_string_length(g);
    if (n == 0)
        return 0;
    if (n > API_GRAMMAR_BYTES)
        return reqerr_set(e, 400, "grammar", "'grammar' has %zu bytes; at most %d are taken", n,
                          API_GRAMMAR_BYTES);
    char err[256];
    free(gp->grammar);
    if (!(gp->grammar = lms_gbnf_compile(json_string_value(g), n, err, sizeof err)))
        return reqerr_set(e, 400, "grammar", "%s", err);
    return 0;
}

static int add_stop(genparams *gp, const json_t *s, reqerr *e)
{
    if (!json_is_string(s))
        return reqerr_set(e, 400, "stop", "'stop' must be a string or an array of strings");
    size_t n = json_string_length(s);
    if (n == 0)
        return 0;
    if (n > MAX_STOP_BYTES)
        return reqerr_set(e, 400, "stop", "a stop string may have at most %d bytes",
                          MAX_STOP_BYTES);
    if (gp->n_stop >= LMS_MAX_STOP)
        return reqerr_set(e, 400, "stop", "at most %d stop strings", LMS_MAX_STOP);
    char *copy = strndup(json_string_value(s), n);
    if (!copy)
        return reqerr_set(e, 503, NULL, "out of memory");
    gp->stop[gp->n_stop++] = copy;
    return 0;
}

static int parse_stop(const json_t *o, genparams *gp, reqerr *e)
{
    const json_t *v = field(o, "stop");
    if (!v)
        return 0;
    if (!json_is_array(v))
        return add_stop(gp, v, e);
    size_t i;
    const json_t *s;
    json_array_foreach(v, i, s)
    {
        if (add_stop(gp, s, e) < 0)
            return -1;
    }
    return 0;
}

/* The first present key of names, or NULL. */
static const char *alias(const json_t *o, const char *const *names)
{
    for (; *names; names++)
        if (field(o, *names))
            return *names;
    return NULL;
}

static int parse_floats(const json_t *o, lms_sampler_params *sp, reqerr *e)
{
    static const char *const temp_names[] = {"temperature", "temp", NULL};
    const char *tk = alias(o, temp_names);
    double d = 0;
    int rc;
    if (tk && (rc = reqparse_num(o, tk, 0, 100, &d, e)) != 0) {
        if (rc < 0)
            return -1;
        sp->temperature = (float)d;
    }
    struct { const char *key; double lo, hi; float *dst; } fl[] = {
        {"top_p", 0, 1, &sp->top_p},
        {"min_p", 0, 1, &sp->min_p},
        {"repeat_penalty", 1e-6, 10, &sp->repeat_penalty},
        {"presence_penalty", -2, 2, &sp->presence_penalty},
        {"frequency_penalty", -2, 2, &sp->frequency_penalty},
        {"typical_p", 1e-6, 1, &sp->typical_p},
        {"mirostat_tau", 0, 100, &sp->mirostat_tau},
        {"mirostat_eta", 0, 10, &sp->mirostat_eta},
    };
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) {
        rc = reqparse_num(o, fl[i].key, fl[i].lo, fl[i].hi, &d, e);
        if (rc < 0)
            return -1;
        if (rc > 0)
            *fl[i].dst = (float)d;
    }
    return 0;
}

/* logit_bias: {"token id": bias in [-100, 100], ...} (OpenAI's shape). */
static int parse_logit_bias(const json_t *o, lms_sampler_params *sp, reqerr *e)
{
    const json_t *lb = field(o, "logit_bias");
    if (!lb)
        return 0;
    if (!json_is_object(lb))
        return reqerr_set(e, 400, "logit_bias", "'logit_bias' must be an object mapping token ids "
                          "to numbers");
    if (json_object_size(lb) > LMS_MAX_LOGIT_BIAS)
        return reqerr_set(e, 400, "logit_bias", "'logit_bias' may hold at most %d tokens",
                          LMS_MAX_LOGIT_BIAS);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)lb, key, v)
    {
        char *end;
        errno = 0;
        long id = strtol(key, &end, 10);
        if (!key[0] || *end || errno || id < 0 || id > INT32_MAX)
            return reqerr_set(e, 400, "logit_bias", "logit_bias key '%.40s' is not a token id",
                              key);
        if (!json_is_number(v) || !(fabs(json_number_value(v)) <= 100))
            return reqerr_set(e, 400, "logit_bias", "logit_bias of token %ld must be a number "
                              "between -100 and 100", id);
        sp->bias[sp->n_bias++] = (lms_logit_bias){(int32_t)id, (float)json_number_value(v)};
    }
    return 0;
}

int reqparse_gen(const json_t *o, genparams *gp, reqerr *e)
{
    static const char *const max_names[] = {"max_tokens", "max_completion_tokens", "n_predict",
                                            "num_predict", NULL};
    int64_t x = 0;
    int rc;
    if (parse_floats(o, &gp->sp, e) < 0 || parse_logit_bias(o, &gp->sp, e) < 0)
        return -1;
    if ((rc = reqparse_int(o, "top_k", 0, 1 << 20, &x, e)) < 0)
        return -1;
    if (rc)
        gp->sp.top_k = (int32_t)x;
    if ((rc = reqparse_int(o, "repeat_last_n", 0, 1 << 20, &x, e)) < 0)
        return -1;
    if (rc)
        gp->sp.penalty_last_n = (int32_t)x;
    if ((rc = reqparse_int(o, "mirostat", 0, 2, &x, e)) < 0) /* 0 off, 1 or 2: the version */
        return -1;
    if (rc)
        gp->sp.mirostat = (int32_t)x;
    if ((rc = reqparse_int(o, "seed", INT64_MIN, INT64_MAX, &x, e)) < 0)
        return -1;
    if (rc && x != -1) {
        gp->sp.seed = (uint64_t)x;
        gp->has_seed = true;
    }
    const char *mk = alias(o, max_names);
    if (mk && reqparse_int(o, mk, -1, INT32_MAX, &x, e) < 0)
        return -1;
    if (mk) {
        if (x == 0 && !gp->zero_max_ok)
            return reqerr_set(e, 400, mk, "'%s' must be at least 1", mk);
        gp->max_tokens = (int32_t)x;
    }
    if (reqparse_bool(o, "ignore_eos", &gp->ignore_eos, e) < 0)
        return -1;
    /* speculative decoding, llama-server's keys: 0 turns it off (n_max) or
     * the limit off (n_min, p_min) for this request */
    if ((rc = reqparse_int(o, "speculative.n_max", 0, LMS_SPEC_MAX, &x, e)) < 0)
        return -1;
    if (rc)
        gp->spec_n_max = x ? (int32_t)x : -1;
    if ((rc = reqparse_int(o, "speculative.n_min", 0, LMS_SPEC_MAX, &x, e)) < 0)
        return -1;
    if (rc)
        gp->spec_n_min = x ? (int32_t)x : -1;
    double pm = 0;
    if ((rc = reqparse_num(o, "speculative.p_min", 0, 1, &pm, e)) < 0)
        return -1;
    if (rc)
        gp->spec_p_min = pm > 0 ? (float)pm : -1.0f;
    double tmo = 0;
    if (reqparse_num(o, "timeout", 0.001, 86400, &tmo, e) < 0)
        return -1;
    gp->timeout_ms = tmo * 1000.0;
    if ((rc = reqparse_int(o, "reasoning_budget", -1, INT32_MAX, &x, e)) < 0)
        return -1;
    if (rc)
        gp->reasoning_budget = (int32_t)x;
    return parse_grammar(o, gp, e) < 0 ? -1 : parse_stop(o, gp, e);
}

int reqparse_token_ids(const json_t *a, const char *field, int32_t **out, int32_t *n_out,
                       reqerr *e)
{
    size_t n = json_array_size(a);
    int32_t *v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return reqerr_set(e, 503, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(a, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX) {
            free(v);
            return reqerr_set(e, 400, field, "%s[%zu] must be a token id", field, i);
        }
        v[i] = (int32_t)json_integer_value(x);
    }
    *out = v;
    *n_out = (int32_t)n;
    return 0;
}

lms_jschema *api_compile_schema(const json_t *schema, const char *param, reqerr *e)
{
    if (!json_is_object(schema)) {
        reqerr_set(e, 400, param, "a JSON schema (an object) is needed");
        return NULL;
    }
    char err[256];
    lms_jschema *sc = lms_jschema_from_json(schema, err, sizeof err);
    if (!sc)
        reqerr_set(e, 400, param, "the JSON schema: %s", err);
    return sc;
}
