/*
 * api_native.c - POST /completion, llama-server's own completion endpoint
 * (scripts and older clients call it):
 *
 *   {"prompt": "text" | [token ids and texts], "n_predict": 64,
 *    "stream": false, "temperature": ..., "stop": [...], "seed": ...,
 *    "json_schema": {...}, "lora": [...]}
 *
 * The prompt is raw text (BOS added where the vocabulary wants it; no chat
 * template), or an array mixing token ids and texts. The answer is one
 * object: content, stop, model, tokens_predicted, tokens_evaluated,
 * tokens_cached, stop_type ("eos", "word", "limit"), stopping_word (the
 * request's stop string when it had one), truncated and timings (prompt_n,
 * prompt_ms, predicted_n, predicted_ms and their per-token and per-second
 * rates). With "stream": true, server-sent events: each piece as
 * {"content", "stop": false, "tokens": [id]}, then that object with
 * "stop": true (no [DONE] line, as llama-server). n_probs (up to 20) adds
 * completion_probabilities: per token {id, token, bytes, logprob,
 * top_logprobs: [...]} of the model's distribution (prob / top_probs,
 * the same as probabilities, with post_sampling_probs). Sampling fields are read
 * as by the other endpoints (reqparse_gen), "grammar" (GBNF, engine/gbnf.h)
 * among them; it and json_schema exclude each other. Local models only.
 *
 * POST /infill (fill-in-the-middle, for editor plugins): input_prefix,
 * input_suffix, input_extra ([{"filename", "text"}], other files as
 * context), prompt (text after the prefix), and the fields above; the same
 * answer. Its tokens are laid out as llama-server does, with the model's
 * FIM tokens (the GGUF's tokenizer.ggml.fim_*_token_id, else found by
 * their usual texts):
 *
 *   [REP]myproject\n [SEP]file\ntext ... [SEP]filename\n   (extra, when the
 *                                                       vocabulary has them)
 *   [BOS] [PRE]prefix prompt [SUF]suffix [MID]
 *
 * the prefix cut to its last 3/4 of a step's token budget, the suffix to
 * what is left of the last quarter, the extra context to what the context
 * holds besides. A model without PRE/SUF/MID tokens is refused (400).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/timeutil.h"
#include "engine/jsonschema.h"
#include "engine/sched.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "serve/serve_int.h"

typedef struct nat_job {
    bool stream;
    bool post_probs;        /* probabilities rather than log-probabilities */
    int n_probs;            /* alternatives per token (0: no completion_probabilities) */
    json_t *probs;          /* not streamed: every token's entry */
    sbuf text;              /* the reply (not streamed) */
    const lms_expert *x;
    char *stop_word;        /* the request's only stop string, or NULL */
} nat_job;

static json_t *rate(double n, double ms)
{
    return json_real_safe(n > 0 && ms > 0 ? n * 1000.0 / ms : 0.0);
}

/* The closing object's counters, reasons and timings. */
static void add_final(json_t *o, const nat_job *j, const lms_req_stats *st)
{
    const char *f = st->finish ? st->finish : "stop";
    const bool limit = !strcmp(f, "length") || !strcmp(f, "deadline");
    json_object_set_new(o, "model", json_string(j->x->cfg->id));
    json_object_set_new(o, "tokens_predicted", json_integer(st->n_gen));
    json_object_set_new(o, "tokens_evaluated", json_integer(st->n_prompt));
    json_object_set_new(o, "tokens_cached", json_integer(st->n_cached));
    json_object_set_new(o, "truncated", json_false());
    json_object_set_new(o, "stop_type",
                        json_string(limit ? "limit" : st->stop_word ? "word" : "eos"));
    json_object_set_new(o, "stopping_word",
                        json_string(st->stop_word && j->stop_word ? j->stop_word : ""));
    const double p_n = st->n_prompt - st->n_cached, p_ms = st->ttft_ms - st->queue_ms;
    const double g_n = st->n_gen, g_ms = st->total_ms - st->ttft_ms;
    json_t *t = json_object();
    json_object_set_new(t, "prompt_n", json_integer((json_int_t)p_n));
    json_object_set_new(t, "prompt_ms", json_real_safe(p_ms));
    json_object_set_new(t, "prompt_per_token_ms", json_real_safe(p_n > 0 ? p_ms / p_n : 0.0));
    json_object_set_new(t, "prompt_per_second", rate(p_n, p_ms));
    json_object_set_new(t, "predicted_n", json_integer((json_int_t)g_n));
    json_object_set_new(t, "predicted_ms", json_real_safe(g_ms));
    json_object_set_new(t, "predicted_per_token_ms", json_real_safe(g_n > 0 ? g_ms / g_n : 0.0));
    json_object_set_new(t, "predicted_per_second", rate(g_n, g_ms));
    json_object_set_new(o, "timings", t);
}

static json_t *piece_obj(const char *text, size_t n, bool stop)
{
    json_t *o = json_object();
    json_object_set_new(o, "index", json_integer(0));
    json_object_set_new(o, "content", json_stringn(text, n));
    json_object_set_new(o, "id_slot", json_integer(-1));
    json_object_set_new(o, "stop", json_boolean(stop));
    return o;
}

/* "logprob" -> "prob" (its exponential) in an entry and its alternatives */
static void to_probs(json_t *o)
{
    json_t *lp = json_object_get(o, "logprob");
    if (lp)
        json_object_set_new(o, "prob", json_real_safe(exp(json_number_value(lp))));
    json_object_del(o, "logprob");
    json_t *top = json_object_get(o, "top_logprobs");
    if (!top)
        return;
    json_incref(top);
    json_object_del(o, "top_logprobs");
    size_t i;
    json_t *a;
    json_array_foreach(top, i, a)
        to_probs(a);
    json_object_set_new(o, "top_probs", top);
}

/* A generated token's completion_probabilities entry (llama-server's). */
static json_t *prob_entry(const nat_job *j, const lms_event *ev)
{
    json_t *o = api_lp_entry(j->x->model, ev, true);
    if (j->post_probs)
        to_probs(o);
    return o;
}

static void nat_on_event(task *t, const lms_event *ev, double t_ms)
{
    nat_job *j = t->state;
    conn *c = t->c;
    (void)t_ms;
    if (ev->type == LMS_EV_TOKEN) {
        /* flushed text at the end carries no token of its own */
        const bool probs = j->n_probs > 0 && ev->token >= 0 && ev->n_top > 0;
        if (!j->stream) {
            sbuf_add(&j->text, ev->text, ev->text_len);
            if (probs)
                json_array_append_new(j->probs, prob_entry(j, ev));
        } else if (ev->text_len > 0 || probs) {
            json_t *o = piece_obj(ev->text, ev->text_len, false);
            json_object_set_new(o, "tokens", json_pack("[i]", (json_int_t)ev->token));
            if (probs)
                json_object_set_new(o, "completion_probabilities", json_pack("[o]", prob_entry(j, ev)));
            http_sse_json(c, o);
        }
        return;
    }
    if (ev->type != LMS_EV_END && ev->type != LMS_EV_ERROR)
        return;
    const char *f = ev->stats.finish;
    const bool failed = ev->type == LMS_EV_ERROR || (f && !strcmp(f, "abort"));
    const char *why = ev->type == LMS_EV_ERROR ? ev->message : "the generation was aborted";
    reqerr e;
    if (failed)
        reqerr_set(&e, ev->type == LMS_EV_ERROR ? task_error_status(t, ev) : 503, NULL, "%s", why);
    if (j->stream) {
        json_t *o = failed ? reqerr_json(&e) : piece_obj("", 0, true);
        if (!failed)
            add_final(o, j, &ev->stats);
        http_sse_json(c, o);
        http_stream_end(c);
    } else if (failed) {
        http_reply_err(c, &e);
    } else {
        json_t *o = piece_obj(j->text.p ? j->text.p : "", j->text.n, true);
        add_final(o, j, &ev->stats);
        if (j->n_probs > 0)
            json_object_set(o, "completion_probabilities", j->probs);
        http_reply_json(c, 200, o);
    }
}

static void nat_destroy(task *t)
{
    nat_job *j = t->state;
    sbuf_free(&j->text);
    json_decref(j->probs);
    free(j->stop_word);
    free(j);
}

static const task_ops nat_ops = {nat_on_event, nat_destroy};

/* A growing token list; oom stays set once an append failed. */
typedef struct tokv {
    int32_t *v;
    int32_t n, cap;
    bool oom;
} tokv;

static void toks_add(tokv *t, const int32_t *ids, int32_t n)
{
    if (t->oom || n <= 0)
        return;
    if (t->n + n > t->cap) {
        int32_t nc = (t->n + n) * 2;
        int32_t *g = realloc(t->v, (size_t)nc * sizeof *g);
        if (!g) {
            t->oom = true;
            return;
        }
        t->v = g, t->cap = nc;
    }
    memcpy(t->v + t->n, ids, (size_t)n * sizeof *ids);
    t->n += n;
}

static void toks_one(tokv *t, int32_t id)
{
    toks_add(t, &id, 1);
}

/* Text (control tokens not parsed: a user's text is plain text), BOS first
 * with bos where the vocabulary wants one. */
static int toks_text(tokv *t, const lms_model *m, const char *s, size_t n, bool bos, reqerr *e)
{
    int32_t *ids = NULL, k = 0;
    if (chatfmt_text_tokens(m, s, n, bos, &ids, &k, e) < 0)
        return -1;
    toks_add(t, ids, k);
    free(ids);
    return 0;
}

/* "prompt": a text, or an array of token ids and texts, in that order. */
static int prompt_ids(const lms_model *m, const json_t *p, tokv *out, reqerr *e)
{
    if (json_is_string(p))
        return toks_text(out, m, json_string_value(p), json_string_length(p), true, e);
    if (!json_is_array(p) || json_array_size(p) == 0)
        return reqerr_set(e, 400, "prompt",
                          "'prompt' must be a string or a non-empty array of token ids and texts");
    const int32_t n_vocab = lms_tokenizer_n_vocab(m->tok);
    size_t i;
    const json_t *v;
    json_array_foreach(p, i, v)
    {
        if (json_is_integer(v)) {
            const json_int_t id = json_integer_value(v);
            if (id < 0 || id >= n_vocab)
                return reqerr_set(e, 400, "prompt", "prompt[%zu] = %lld is not in the vocabulary "
                                  "(0..%d)", i, (long long)id, n_vocab - 1);
            toks_one(out, (int32_t)id);
        } else if (!json_is_string(v)) {
            return reqerr_set(e, 400, "prompt", "prompt[%zu] must be a token id or a text", i);
        } else if (toks_text(out, m, json_string_value(v), json_string_length(v), i == 0, e) < 0) {
            return -1; /* BOS only before a leading text, as one string prompt would get */
        }
    }
    return out->oom ? reqerr_set(e, 503, NULL, "out of memory") : 0;
}

/* ---- fill in the middle --------------------------------------------------------- */

typedef struct fim_ids {
    int32_t pre, suf, mid, sep, rep;
} fim_ids;

/* A FIM token: the GGUF key's id (or the older key's), else the first of
 * the texts the vocabulary has; -1 when none. */
static int32_t fim_token(const lms_model *m, const char *key, const char *old_key,
                         const char *const *texts)
{
    const int32_t n_vocab = lms_tokenizer_n_vocab(m->tok);
    uint32_t v;
    if ((gguf_get_u32(m->gguf, key, &v) >= 0 || (old_key && gguf_get_u32(m->gguf, old_key, &v) >= 0)) &&
        v < (uint32_t)n_vocab)
        return (int32_t)v;
    for (int i = 0; texts[i]; i++) {
        int32_t id = lms_token_find(m->tok, texts[i]);
        if (id >= 0)
            return id;
    }
    return -1;
}

static fim_ids fim_of(const lms_model *m)
{
    static const char *const pre[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>",
                                      "\xe2\x96\x81<PRE>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>",
                                      NULL};
    static const char *const suf[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>",
                                      "\xe2\x96\x81<SUF>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>",
                                      NULL};
    static const char *const mid[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>",
                                      "\xe2\x96\x81<MID>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>",
                                      NULL};
    static const char *const sep[] = {"<|file_sep|>", "<file_sep>", "<|file_separator|>", NULL};
    static const char *const rep[] = {"<|repo_name|>", "<repo_name>", "<reponame>", NULL};
    return (fim_ids){
        fim_token(m, "tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id", pre),
        fim_token(m, "tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id", suf),
        fim_token(m, "tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id", mid),
        fim_token(m, "tokenizer.ggml.fim_sep_token_id", NULL, sep),
        fim_token(m, "tokenizer.ggml.fim_rep_token_id", NULL, rep),
    };
}

static int str_field(const json_t *o, const char *key, const char **out, reqerr *e)
{
    *out = "";
    const char *s = NULL;
    if (reqparse_str(o, key, &s, e) < 0)
        return -1;
    if (s)
        *out = s;
    return 0;
}

/* The /infill prompt (layout above) of body into *out. */
/* The layout above of prefix, prompt, suffix and the extra files (an
 * array, or NULL) into *out; a 400 for a model without FIM tokens. */
static int fim_layout(const lms_expert *x, const char *prefix, const char *suffix,
                      const char *prompt, const json_t *extra, int32_t n_predict, tokv *out,
                      reqerr *e)
{
    const lms_model *m = x->model;
    const fim_ids f = fim_of(m);
    if (f.pre < 0 || f.suf < 0 || f.mid < 0)
        return reqerr_set(e, 400, NULL, "model '%s' has no fill-in-the-middle tokens (prefix, "
                          "suffix, middle): filling in text (/infill, a 'suffix') needs a code "
                          "model trained for it", x->cfg->id);
    const lms_sched_params *sp = lms_sched_params_of(x->sched);
    tokv pre = {0}, suf = {0}, pr = {0}, ex = {0};
    int rc = toks_text(&pre, m, prefix, strlen(prefix), false, e) < 0 ||
                     toks_text(&suf, m, suffix, strlen(suffix), false, e) < 0 ||
                     toks_text(&pr, m, prompt, strlen(prompt), false, e) < 0
                 ? -1
                 : 0;
    if (rc == 0 && f.rep >= 0) {
        toks_one(&ex, f.rep);
        rc = toks_text(&ex, m, "myproject\n", 10, false, e);
    }
    size_t i;
    const json_t *ch;
    json_array_foreach(extra, i, ch)
    {
        if (rc < 0)
            break;
        const char *fn = "tmp", *text = "";
        if (!json_is_object(ch) || (json_object_get(ch, "filename") && str_field(ch, "filename", &fn, e) < 0) ||
            str_field(ch, "text", &text, e) < 0) {
            rc = reqerr_set(e, 400, "input_extra", "input_extra[%zu] must be an object with string "
                            "'filename' and 'text'", i);
            break;
        }
        if (f.sep >= 0) {
            toks_one(&ex, f.sep);
            rc = toks_text(&ex, m, fn, strlen(fn), false, e) < 0 || toks_text(&ex, m, "\n", 1, false, e) < 0 ? -1 : 0;
        } else {
            rc = toks_text(&ex, m, "\n\n--- snippet ---\n\n", 19, false, e);
        }
        if (rc == 0)
            rc = toks_text(&ex, m, text, strlen(text), false, e);
    }
    if (rc == 0 && f.sep >= 0) {
        toks_one(&ex, f.sep);
        rc = toks_text(&ex, m, "filename\n", 9, false, e);
    }
    if (rc == 0) {
        /* a step's budget: 3/4 for the prefix's end, the rest of a quarter
         * for the suffix's start; the context's remainder for extra's end */
        const int32_t nb = sp->n_batch;
        const int32_t n_pre = pre.n < 3 * (nb / 4) ? pre.n : 3 * (nb / 4);
        int32_t n_suf = nb / 4 - (2 + pr.n);
        n_suf = n_suf < 0 ? 0 : (suf.n < n_suf ? suf.n : n_suf);
        int32_t n_ex = sp->n_ctx - nb - 2 * (n_predict > 0 ? n_predict : 0);
        n_ex = n_ex < 0 ? 0 : (ex.n < n_ex ? ex.n : n_ex);
        toks_add(out, ex.v + (ex.n - n_ex), n_ex);
        if (lms_tokenizer_add_bos(m->tok) && lms_tokenizer_bos(m->tok) >= 0)
            toks_one(out, lms_tokenizer_bos(m->tok));
        toks_one(out, f.pre);
        toks_add(out, pre.v + (pre.n - n_pre), n_pre);
        toks_add(out, pr.v, pr.n);
        toks_one(out, f.suf);
        toks_add(out, suf.v, n_suf);
        toks_one(out, f.mid);
        if (out->oom || pre.oom || suf.oom || pr.oom || ex.oom)
            rc = reqerr_set(e, 503, NULL, "out of memory");
    }
    free(pre.v);
    free(suf.v);
    free(pr.v);
    free(ex.v);
    return rc;
}

/* The /infill prompt of body's fields. */
static int infill_ids(const lms_expert *x, const json_t *body, int32_t n_predict, tokv *out,
                      reqerr *e)
{
    const char *prefix, *suffix, *prompt;
    if (str_field(body, "input_prefix", &prefix, e) < 0 ||
        str_field(body, "input_suffix", &suffix, e) < 0 || str_field(body, "prompt", &prompt, e) < 0)
        return -1;
    const json_t *extra = json_object_get(body, "input_extra");
    if (extra && !json_is_null(extra) && !json_is_array(extra))
        return reqerr_set(e, 400, "input_extra", "'input_extra' must be an array of "
                          "{\"filename\", \"text\"} objects");
    return fim_layout(x, prefix, suffix, prompt, json_is_array(extra) ? extra : NULL, n_predict,
                      out, e);
}

int api_fim_prompt(const lms_expert *x, const char *prefix, const char *suffix,
                   int32_t n_predict, int32_t **toks, int32_t *n, reqerr *e)
{
    tokv t = {0};
    if (fim_layout(x, prefix, suffix, "", NULL, n_predict, &t, e) < 0) {
        free(t.v);
        return -1;
    }
    *toks = t.v;
    *n = t.n;
    return 0;
}

/* ---- the requests ---------------------------------------------------------------- */

static int native_run(conn *c, json_t *body, pick_fn fn, bool infill)
{
    reqerr e;
    int picked = pick_expert(c, body, fn, &e);
    if (picked <= 0)
        return picked < 0 ? http_reply_err(c, &e) : 0;
    int rc = 0;
    bool stream = false;
    genparams gp;
    server_genparams(c->srv, &gp);
    const json_t *schema_j = json_object_get(body, "json_schema");
    lms_jschema *schema = NULL;
    int64_t n_probs = 0;
    bool post_probs = false;
    if (reqparse_bool(body, "stream", &stream, &e) < 0 || reqparse_gen(body, &gp, &e) < 0 ||
        reqparse_int(body, "n_probs", 0, LMS_MAX_LOGPROBS, &n_probs, &e) < 0 ||
        reqparse_bool(body, "post_sampling_probs", &post_probs, &e) < 0 ||
        api_lora_pick(c, body, &gp, &e) < 0)
        rc = -1;
    if (rc == 0 && gp.grammar && schema_j && !json_is_null(schema_j))
        rc = reqerr_set(&e, 400, "grammar", "give 'grammar' or 'json_schema', not both");
    if (rc == 0 && schema_j && !json_is_null(schema_j) &&
        !(schema = api_compile_schema(schema_j, "json_schema", &e)))
        rc = -1;
    tokv pt = {0};
    const json_t *p = json_object_get(body, "prompt");
    if (rc == 0 && infill)
        rc = infill_ids(c->x, body, gp.max_tokens, &pt, &e);
    else if (rc == 0 && (!p || json_is_null(p)))
        rc = reqerr_set(&e, 400, "prompt", "'prompt' is required");
    else if (rc == 0)
        rc = prompt_ids(c->x->model, p, &pt, &e);
    nat_job *j = rc == 0 ? calloc(1, sizeof *j) : NULL;
    if (rc == 0 && !j)
        rc = reqerr_set(&e, 503, NULL, "out of memory");
    task *t = NULL;
    if (rc == 0) {
        j->stream = stream;
        j->x = c->x;
        j->n_probs = (int)n_probs;
        j->post_probs = post_probs;
        j->probs = json_array();
        if (gp.n_stop == 1)
            j->stop_word = strdup(gp.stop[0]); /* (none on failure: "" is reported) */
        lms_request r = genparams_request(&gp, pt.v, pt.n);
        r.schema = schema;
        r.n_logprobs = (int)n_probs;
        t = task_submit(c, &r, &nat_ops, j, &e);
        if (!t)
            nat_destroy(&(task){.state = j});
    }
    free(pt.v);
    free(schema); /* the scheduler made its copy */
    genparams_deinit(&gp);
    if (!t)
        return http_reply_err(c, &e);
    if (stream)
        http_stream_begin(c, 200, "text/event-stream");
    return 0;
}

int api_native_completion(conn *c, json_t *body)
{
    return native_run(c, body, api_native_completion, false);
}

int api_native_infill(conn *c, json_t *body)
{
    return native_run(c, body, api_native_infill, true);
}
