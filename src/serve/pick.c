/*
 * pick.c - which expert answers a request, and the requests that wait for
 * one to load.
 *
 * A request names its model or lets the router choose (route/router.h) on
 * its text: the last user message, else the prompt, else the embedding
 * input. When the expert is not ready the registry is asked to load it
 * (route/registry.h: on its loader thread) and the request is parked: the
 * connection, the parsed body (a reference) and the handler that got it.
 *
 *   handler(c, body) --pick_expert--> ready: c->x = expert, handler goes on
 *                                \--> loading: parked, handler returns 0
 *   loader done --> lms_registry_poll --> pick_on_change(x)
 *        READY: every request parked on x runs handler(c, body) again
 *        FAILED / refused: each gets the error (HTTP 500 or 503, or a
 *                          WebSocket error message) naming the model
 *
 * With router.embedding_model the router compares embeddings: the text is
 * embedded by the embedding model's scheduler as an internal task of the
 * connection (the request waits, as when parked, and the embedding model
 * itself may first have to load: the request is then parked "to route");
 * when the vector arrives lms_router_pick_vec picks the expert and the
 * handler runs again with it (c->again). If the embedding model cannot be
 * had (failed, refused) the lexical router decides instead.
 *
 * An expert served elsewhere (state REMOTE) is always ready; only the
 * handlers that forward a request's text (remote_ok) may have it, the
 * others (embeddings, tokenize, ...) get a 400 naming it.
 *
 * The parked list belongs to the event-loop thread. A connection that
 * closes drops its parked requests (pick_drop_conn); nothing else keeps a
 * pointer to it. A parked request counts as a user of its expert
 * (n_waiting), so the expert is not unloaded under it.
 */
#include <stdlib.h>
#include <string.h>

#include "base/timeutil.h"
#include "ops/log.h"
#include "route/embed.h"
#include "serve/serve_int.h"

struct parked {
    conn *c;
    json_t *body;             /* a reference */
    pick_fn fn;
    lms_expert *x;
    bool routing;             /* waits for the router's embedding model, to be routed */
    parked *next;
};

static void answer_err(parked *p, const reqerr *e);

/* A routing embedding in flight (an internal task on the embedding model). */
typedef struct route_job {
    json_t *body;             /* a reference */
    pick_fn fn;
    float *q;                 /* the text's embedding, once it came */
    int32_t n_embd;
    conn *c;
    lms_expert *chosen;       /* set by the terminal event: run fn(c, body) with it */
} route_job;

/* ---- the request's text --------------------------------------------------------- */

/* The text of an OpenAI content value: a string or text parts. */
static const char *content_text(const json_t *v)
{
    if (json_is_string(v))
        return json_string_value(v);
    if (json_is_array(v))
        for (size_t i = 0; i < json_array_size(v); i++) {
            const json_t *t = json_object_get(json_array_get(v, i), "text");
            if (json_is_string(t))
                return json_string_value(t);
        }
    return NULL;
}

/* What the router reads: the last user message, else the prompt (or its
 * first string), else the embedding input. */
static const char *route_text(const json_t *body)
{
    const json_t *msgs = json_object_get(body, "messages");
    for (size_t i = json_array_size(msgs); i > 0; i--) {
        const json_t *m = json_array_get(msgs, i - 1);
        const json_t *role = json_object_get(m, "role");
        if (json_is_string(role) && !strcmp(json_string_value(role), "user")) {
            const char *t = content_text(json_object_get(m, "content"));
            if (t)
                return t;
        }
    }
    static const char *const keys[] = {"prompt", "input"};
    for (size_t k = 0; k < 2; k++) {
        const json_t *p = json_object_get(body, keys[k]);
        if (json_is_array(p))
            p = json_array_get(p, 0);
        if (json_is_string(p))
            return json_string_value(p);
    }
    return NULL;
}

/* ---- choice ------------------------------------------------------------------------ */

lms_expert *server_default_expert(lms_server *s)
{
    return lms_registry_at(s->reg, lms_router_default(s->router));
}

int pick_not_found(lms_server *s, const char *model, reqerr *e)
{
    char list[300] = "";
    size_t n = 0;
    for (int i = 0; i < lms_registry_count(s->reg) && n < sizeof list - 1; i++) {
        const char *id = lms_registry_at(s->reg, i)->cfg->id;
        int k = snprintf(list + n, sizeof list - n, "%s'%s'", i ? ", " : "", id);
        n += k > 0 ? (size_t)k : 0;
    }
    if (n >= sizeof list - 1)
        memcpy(list + sizeof list - 5, "...", 4);
    reqerr_set(e, 404, "model", "the model '%.200s' does not exist; this server serves %s", model,
               list);
    e->type = "invalid_request_error";
    e->code = "model_not_found";
    return -1;
}

static lms_expert *log_pick(lms_server *s, lms_route_pick p, const char *by)
{
    lms_expert *x = lms_registry_at(s->reg, p.expert);
    if (lms_registry_count(s->reg) > 1)
        lms_log(LMS_LOG_INFO, "route", "model", LMS_LOG_STR(x->cfg->id), "by", LMS_LOG_STR(by),
                "score", LMS_LOG_F64(p.score), "fallback", LMS_LOG_BOOL(p.fallback), "best",
                LMS_LOG_STR(p.best >= 0 ? lms_registry_at(s->reg, p.best)->cfg->id : ""));
    return x;
}

/* The lexical router on the request's text. */
static lms_expert *route(lms_server *s, const json_t *body)
{
    const char *text = route_text(body);
    return log_pick(s, lms_router_pick(s->router, text, text ? strlen(text) : 0), "words");
}

static int park(conn *c, json_t *body, pick_fn fn, lms_expert *x, bool routing, reqerr *e)
{
    lms_server *s = c->srv;
    parked *p = calloc(1, sizeof *p);
    if (!p)
        return reqerr_set(e, 503, NULL, "out of memory");
    *p = (parked){.c = c, .body = json_incref(body), .fn = fn, .x = x, .routing = routing};
    if (s->park_tail)
        s->park_tail->next = p;
    else
        s->park_head = p;
    s->park_tail = p;
    x->n_waiting++;
    return 0;
}

/* ---- routing by embeddings -------------------------------------------------------------- */

static void route_job_free(route_job *j)
{
    json_decref(j->body);
    free(j->q);
    free(j);
}

/* The text's embedding came (or the request failed): pick the expert; the
 * request runs again once this task is gone (route_destroy), so that the
 * embedding model, maybe an expert itself, no longer counts it as live. */
static void route_on_event(task *t, const lms_event *ev, double t_ms)
{
    (void)t_ms;
    route_job *j = t->state;
    lms_server *s = t->c->srv;
    if (ev->type == LMS_EV_EMBD && ev->embd && !j->q && ev->n_embd > 0) {
        j->q = malloc((size_t)ev->n_embd * sizeof *j->q);
        if (j->q) {
            memcpy(j->q, ev->embd, (size_t)ev->n_embd * sizeof *j->q);
            j->n_embd = ev->n_embd;
        }
        return;
    }
    if (ev->type != LMS_EV_END && ev->type != LMS_EV_ERROR)
        return;
    conn *c = t->c;
    if (s->state != SRV_READY) { /* aborted by a shutdown */
        reqerr e;
        reqerr_set(&e, 503, NULL, "the server is shutting down");
        parked p = {.c = c, .body = j->body};
        answer_err(&p, &e);
        return;
    }
    const sattach *a = t->x->attach;
    lms_expert *x;
    if (j->q && a->docs && j->n_embd == a->n_embd) {
        x = log_pick(s, lms_router_pick_vec(s->router, a->docs, a->n_embd, j->q), "embedding");
    } else {
        lms_log(LMS_LOG_WARN, "route_embedding_failed", "error",
                LMS_LOG_STR(ev->type == LMS_EV_ERROR ? ev->message : "no embedding"));
        x = route(s, j->body);
    }
    j->chosen = x;
    j->c = c;
}

/* After the terminal event (chosen set): the handler again, with the
 * expert; when canceled (the connection closed): nothing. */
static void route_destroy(task *t)
{
    route_job *j = t->state;
    conn *c = j->c;
    if (j->chosen && c->srv->state == SRV_READY) {
        c->again = j->chosen;
        int rc = j->fn(c, j->body);
        c->again = NULL;
        if (rc < 0) {
            c->kill = true;
            conn_want_write(c);
        }
    }
    route_job_free(j);
}

static const task_ops route_ops = {route_on_event, route_destroy};

/* Routes by embeddings when the router has an embedding model: 0 when the
 * text's embedding is in flight or the request waits for the model, 1 to
 * route by words instead (no embedding model, no text, or the model
 * cannot be had), -1 with e filled. */
static int embed_route(conn *c, json_t *body, pick_fn fn, reqerr *e)
{
    lms_server *s = c->srv;
    lms_expert *em = lms_registry_embedder(s->reg);
    const char *text = route_text(body);
    if (!em || !text || !text[0] || em->state == LMS_EXPERT_FAILED)
        return 1;
    char err[384];
    int rc = lms_registry_want(s->reg, em, err, sizeof err);
    if (rc == 0)
        return park(c, body, fn, em, true, e) < 0 ? -1 : 0;
    if (rc < 0 || !((const sattach *)em->attach)->docs)
        return 1;
    int32_t *toks = NULL, n = 0;
    if (lms_embed_tokens(em->model, text, strlen(text), lms_sched_params_of(em->sched)->n_ctx,
                         &toks, &n) < 0 || n == 0) {
        free(toks);
        return 1;
    }
    route_job *j = calloc(1, sizeof *j);
    if (!j) {
        free(toks);
        return reqerr_set(e, 503, NULL, "out of memory");
    }
    j->body = json_incref(body);
    j->fn = fn;
    lms_request r = {.tokens = toks, .n_tokens = n, .sp = lms_sampler_defaults(),
                     .embedding = true, .pooling = LMS_POOL_MEAN};
    c->x = em;
    reqerr se;
    task *t = task_submit(c, &r, &route_ops, j, &se);
    free(toks);
    if (!t) {
        route_job_free(j);
        lms_log(LMS_LOG_WARN, "route_embedding_failed", "error", LMS_LOG_STR(se.msg));
        return 1;
    }
    t->internal = true;
    return 0;
}

/* The handlers that can forward their request to a remote expert. */
static bool remote_ok(pick_fn fn)
{
    return fn == api_chat || fn == api_completions || fn == api_ollama_chat ||
           fn == api_ollama_generate || fn == ws_op_infer_again || fn == ws_type_again ||
           fn == api_anthropic_messages || fn == api_responses;
}

int pick_expert(conn *c, json_t *body, pick_fn fn, reqerr *e)
{
    lms_server *s = c->srv;
    const char *model = NULL;
    if (reqparse_str(body, "model", &model, e) < 0)
        return -1;
    if (s->state == SRV_LOADING) {
        reqerr_set(e, 503, NULL, "the model is still loading");
        e->code = "model_loading";
        return -1;
    }
    if (s->state != SRV_READY) {
        reqerr_set(e, 503, NULL, "the server is not serving (%s)",
                   s->state == SRV_DRAINING ? "shutting down" : "failed");
        return -1;
    }
    lms_expert *x;
    if (c->again) {
        x = c->again;
        c->again = NULL;
    } else if (model && model[0] && strcmp(model, "auto") != 0) {
        if (!(x = lms_registry_find(s->reg, model)))
            return pick_not_found(s, model, e);
    } else {
        int rc = embed_route(c, body, fn, e);
        if (rc != 1)
            return rc; /* in flight or parked (0), or failed (-1) */
        x = route(s, body);
    }
    if (x->remote && !remote_ok(fn)) {
        reqerr_set(e, 400, "model", "'%s' is a remote expert: this endpoint is not available for "
                   "it (chat, completions, responses and Anthropic's messages are)", x->cfg->id);
        e->code = "model_not_supported";
        return -1;
    }
    char err[384];
    int rc = lms_registry_want(s->reg, x, err, sizeof err);
    if (rc == 1) {
        c->x = x;
        return 1;
    }
    if (rc == 0)
        return park(c, body, fn, x, false, e) < 0 ? -1 : 0;
    reqerr_set(e, 503, "model", "%s", err);
    e->code = "model_unavailable";
    return -1;
}

/* ---- parked requests ---------------------------------------------------------------- */

/* Unlinks every parked request of x (all when x is NULL) into a list. */
static parked *take(lms_server *s, const lms_expert *x, const conn *c)
{
    parked *out = NULL, **tail = &out, **pp = &s->park_head;
    s->park_tail = NULL;
    while (*pp) {
        parked *p = *pp;
        if ((!x || p->x == x) && (!c || p->c == c)) {
            *pp = p->next;
            p->next = NULL;
            *tail = p;
            tail = &p->next;
            if (p->x->n_waiting > 0)
                p->x->n_waiting--;
        } else {
            s->park_tail = p;
            pp = &p->next;
        }
    }
    return out;
}

static void answer_err(parked *p, const reqerr *e)
{
    conn *c = p->c;
    if (c->role == CONN_WS) {
        const json_t *sid = json_object_get(p->body, "session_id");
        ws_send_error(c, json_is_string(sid) ? json_string_value(sid) : NULL, "%s", e->msg);
    } else if (http_reply_err(c, e) < 0) {
        c->kill = true;
        conn_want_write(c);
    }
}

static void free_parked(parked *p)
{
    json_decref(p->body);
    free(p);
}

void pick_on_change(lms_server *s, lms_expert *x)
{
    if (x->state != LMS_EXPERT_READY && x->state != LMS_EXPERT_FAILED)
        return; /* unloaded (and not wanted): nobody waits */
    parked *list = take(s, x, NULL);
    while (list) {
        parked *p = list;
        list = p->next;
        conn *c = p->c;
        if (p->routing) { /* to be routed: by embeddings now, or by words if it failed */
            if (p->fn(c, p->body) < 0) {
                c->kill = true;
                conn_want_write(c);
            }
        } else if (x->state == LMS_EXPERT_READY) {
            c->again = x;
            int rc = p->fn(c, p->body);
            c->again = NULL;
            if (rc < 0) { /* as a callback returning -1: close */
                c->kill = true;
                conn_want_write(c);
            }
        } else {
            reqerr e;
            bool refused = strstr(x->error, "retry later") != NULL;
            reqerr_set(&e, refused ? 503 : 500, "model", "%s", x->error);
            e.code = refused ? "model_unavailable" : "model_load_failed";
            answer_err(p, &e);
        }
        free_parked(p);
    }
}

void pick_drop_conn(conn *c)
{
    parked *list = take(c->srv, NULL, c);
    while (list) {
        parked *p = list;
        list = p->next;
        free_parked(p);
    }
}

void pick_fail_all(lms_server *s, const char *msg)
{
    parked *list = take(s, NULL, NULL);
    while (list) {
        parked *p = list;
        list = p->next;
        reqerr e;
        reqerr_set(&e, 503, NULL, "%s", msg);
        answer_err(p, &e);
        free_parked(p);
    }
}
