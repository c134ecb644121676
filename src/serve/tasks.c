/*
 * tasks.c - scheduler requests as the event loop sees them: submission,
 * the table that matches events to live tasks by request id, cancellation,
 * and the scheduler callback that hands events to the loop.
 *
 * Hand-off (see serve_int.h): the callback runs on the scheduler thread; it
 * appends the event to the server's queue under `mu` and wakes the loop
 * with lws_cancel_service once per batch (wake_pending). The loop drains
 * the queue and calls task_dispatch for each event. Events are matched by
 * id, so an event of a request whose connection has gone finds nothing
 * and is freed.
 *
 * A remote expert (route/remote.h) takes the place of the scheduler for
 * task_submit_remote: the same callback, the same events, ids from a range
 * of their own; task_abort reaches whichever engine runs the task.
 *
 * Ordering: submit runs on the loop thread and the table entry is made
 * before the loop drains again, so the first event of a request always
 * finds its task.
 */
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/timeutil.h"
#include "ops/log.h"
#include "model/tokenizer.h"
#include "serve/serve_int.h"

#define TAB_CAP 4096 /* power of two; chains absorb more */

int tasks_init(lms_server *s)
{
    s->tab = calloc(TAB_CAP, sizeof *s->tab);
    s->tab_cap = TAB_CAP;
    return s->tab ? 0 : -1;
}

void tasks_deinit(lms_server *s)
{
    free(s->tab);
    s->tab = NULL;
}

static size_t slot(const lms_server *s, uint64_t id)
{
    return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 32) & (s->tab_cap - 1);
}

static task *find(lms_server *s, uint64_t id)
{
    for (task *t = s->tab[slot(s, id)]; t; t = t->h_next)
        if (t->id == id)
            return t;
    return NULL;
}

static void link_task(lms_server *s, task *t)
{
    size_t k = slot(s, t->id);
    t->h_next = s->tab[k];
    s->tab[k] = t;
    conn *c = t->c;
    t->c_prev = NULL;
    t->c_next = c->tasks;
    if (c->tasks)
        c->tasks->c_prev = t;
    c->tasks = t;
    s->n_tasks++;
}

/* Unlinks t from the table and its connection, then frees it. */
static void remove_task(lms_server *s, task *t)
{
    task **pp = &s->tab[slot(s, t->id)];
    while (*pp && *pp != t)
        pp = &(*pp)->h_next;
    if (*pp)
        *pp = t->h_next;
    if (t->c_prev)
        t->c_prev->c_next = t->c_next;
    else
        t->c->tasks = t->c_next;
    if (t->c_next)
        t->c_next->c_prev = t->c_prev;
    if (t->c->op_task == t)
        t->c->op_task = NULL;
    s->n_tasks--;
    lms_registry_end(t->x, lms_now_ms());
    t->ops->destroy(t);
    free(t);
}

/* Registers a task for a request its engine accepted as id. */
static task *task_link(conn *c, lms_expert *x, uint64_t id, const task_ops *ops, void *state,
                       task *t)
{
    t->id = id;
    t->c = c;
    t->x = x;
    lms_registry_begin(x, lms_now_ms());
    memcpy(t->peer, c->peer, sizeof t->peer);
    t->ops = ops;
    t->state = state;
    link_task(c->srv, t);
    return t;
}

/* Prompt and output must fit one sequence's context (OpenAI's rule: a
 * too-large max_tokens is refused, not silently cut). */
static int check_budget(const lms_expert *x, const lms_request *r, reqerr *e)
{
    int32_t n_ctx = lms_sched_params_of(x->sched)->n_ctx;
    if (r->n_tokens >= n_ctx)
        reqerr_set(e, 400, r->embedding ? "input" : "messages",
                   "the prompt has %d tokens; the context holds %d (prompt + output)", r->n_tokens,
                   n_ctx);
    else if (!r->embedding && r->max_tokens > n_ctx - r->n_tokens)
        reqerr_set(e, 400, "max_tokens",
                   "max_tokens %d does not fit: the prompt has %d tokens and the context holds %d",
                   r->max_tokens, r->n_tokens, n_ctx);
    else
        return 0;
    e->code = "context_length_exceeded";
    return -1;
}

/* --log-prompts: the prompt as text (special tokens shown), at most 16 KiB. */
static void log_prompt(const lms_request *r, const task *t)
{
    enum { CAP = 16384 };
    char *text = malloc(CAP);
    size_t n = 0;
    for (int32_t i = 0; text && i < r->n_tokens && n < CAP - 256; i++) {
        int k = lms_token_to_piece(t->x->model->tok, r->tokens[i], true, text + n, CAP - 1 - n);
        n += k > 0 ? (size_t)k : 0;
    }
    lms_log(LMS_LOG_INFO, "request_prompt", "req_id", LMS_LOG_U64(t->id), "client",
            LMS_LOG_STR(t->peer), "prompt_tokens", LMS_LOG_I64(r->n_tokens), "prompt",
            LMS_LOG_STRN(text ? text : "", text ? n : 0));
    free(text);
}

/* A new task for a request whose deadline is *timeout_ms: --timeout bounds
 * every request, and a request may ask for a shorter one. */
static task *task_new(const lms_server *s, double *timeout_ms, reqerr *e)
{
    const double cap = s->p.request_timeout_ms;
    if (cap > 0 && (*timeout_ms <= 0 || *timeout_ms > cap))
        *timeout_ms = cap;
    task *t = calloc(1, sizeof *t);
    if (!t)
        reqerr_set(e, 503, NULL, "out of memory");
    return t;
}

task *task_submit(conn *c, lms_request *r, const task_ops *ops, void *state, reqerr *e)
{
    lms_server *s = c->srv;
    lms_expert *x = c->x;
    if (x && x->remote) {
        reqerr_set(e, 400, "model", "'%s' is a remote expert: this request cannot go to it",
                   x->cfg->id);
        return NULL;
    }
    if (!x || !x->sched) {
        reqerr_set(e, 503, NULL, "the model is still loading");
        e->code = "model_loading";
        return NULL;
    }
    if (check_budget(x, r, e) < 0) {
        s->met.by_finish[FIN_REJECTED]++;
        return NULL;
    }
    task *t = task_new(s, &r->timeout_ms, e);
    if (!t)
        return NULL;
    r->cb = task_sched_cb;
    r->user = s;
    char msg[256] = "";
    uint64_t id = 0;
    int rc = lms_sched_submit(x->sched, r, &id, msg, sizeof msg);
    if (rc < 0) {
        free(t);
        s->met.by_finish[FIN_REJECTED]++;
        reqerr_from_submit(e, rc, msg);
        return NULL;
    }
    task_link(c, x, id, ops, state, t);
    t->n_prompt = r->n_tokens;
    t->max_tokens = r->max_tokens;
    if (s->p.log_prompts)
        log_prompt(r, t);
    return t;
}

task *task_submit_remote(conn *c, lms_remote_request *r, const task_ops *ops, void *state,
                         reqerr *e)
{
    lms_server *s = c->srv;
    lms_expert *x = c->x;
    task *t = task_new(s, &r->timeout_ms, e);
    if (!t)
        return NULL;
    r->cb = task_sched_cb;
    r->user = s;
    char msg[256] = "";
    uint64_t id = 0;
    if (lms_remote_submit(x->remote, r, &id, msg, sizeof msg) < 0) {
        free(t);
        s->met.by_finish[FIN_REJECTED]++;
        reqerr_set(e, 400, NULL, "%s", msg);
        return NULL;
    }
    return task_link(c, x, id, ops, state, t);
}

task *task_submit_upstream(conn *c, json_t *what, const json_t *params, const genparams *gp,
                           const task_ops *ops, void *state, reqerr *e)
{
    bool chat = json_is_array(what) || json_is_object(what);
    json_t *o = reqparse_upstream(params);
    if (o && json_is_object(what))
        json_object_update(o, what);
    if (o && what && !json_is_object(what))
        json_object_set_new(o, chat ? "messages" : "prompt", what);
    else
        json_decref(what);
    size_t n = 0;
    char *text = o ? json_dump_compact(o, &n) : NULL;
    json_decref(o);
    if (!text) {
        reqerr_set(e, 503, NULL, "out of memory");
        return NULL;
    }
    lms_remote_request rq = {.chat = chat, .body = text, .n_body = n,
                             .timeout_ms = gp->timeout_ms};
    task *t = task_submit_remote(c, &rq, ops, state, e);
    free(text);
    return t;
}

int task_error_status(const task *t, const lms_event *ev)
{
    if (!t->x->remote)
        return 500;
    /* the upstream's own 4xx passes; else 502 (no or a bad answer) or 504 (too slow) */
    return ev->token >= 400 && ev->token < 500 ? ev->token : ev->err == LMS_ERR_BUSY ? 504 : 502;
}

void task_abort(task *t)
{
    if (t->x->remote)
        lms_remote_abort(t->x->remote, t->id);
    else if (t->x->sched)
        lms_sched_abort(t->x->sched, t->id);
}

void task_cancel(task *t)
{
    lms_server *s = t->c->srv;
    task_abort(t);
    remove_task(s, t);
}

static void log_end(const lms_event *ev, const task *t)
{
    const lms_req_stats *st = &ev->stats;
    const char *peer = t ? t->peer : "";
    const char *model = t ? t->x->cfg->id : "";
    if (ev->type == LMS_EV_ERROR)
        lms_log(LMS_LOG_WARN, "request_failed", "req_id", LMS_LOG_U64(ev->id), "model",
                LMS_LOG_STR(model), "client", LMS_LOG_STR(peer), "error",
                LMS_LOG_STR(ev->message));
    else
        lms_log(LMS_LOG_INFO, "request_end", "req_id", LMS_LOG_U64(ev->id), "model",
                LMS_LOG_STR(model), "client", LMS_LOG_STR(peer), "finish",
                LMS_LOG_STR(st->finish), "client_gone", LMS_LOG_BOOL(!t),
                "prompt_tokens", LMS_LOG_I64(st->n_prompt), "cached_tokens",
                LMS_LOG_I64(st->n_cached), "gen_tokens", LMS_LOG_I64(st->n_gen), "ttft_ms",
                LMS_LOG_F64(st->ttft_ms), "total_ms", LMS_LOG_F64(st->total_ms), "tps",
                LMS_LOG_F64(st->tps));
}

void task_dispatch(lms_server *s, lms_event *ev, double t_ms)
{
    bool terminal = ev->type == LMS_EV_END || ev->type == LMS_EV_ERROR;
    task *t = find(s, ev->id);
    bool internal = t && t->internal;
    if (terminal && !internal)
        metrics_on_terminal(&s->met, ev);
    if (t) {
        if (ev->type == LMS_EV_TOKEN && ev->token >= 0) {
            if (t->t_last_tok > 0)
                metrics_observe(&s->met.itl, (t_ms - t->t_last_tok) / 1000.0);
            t->t_last_tok = t_ms;
            t->n_decoded++;
            s->met.total_gen_tokens++;
        }
        t->ops->on_event(t, ev, t_ms);
    }
    if (terminal) {
        if (!internal)
            log_end(ev, t);
        lms_expert *x = t ? t->x : NULL;
        lms_supervisor *sup = x && !internal && !x->remote ? s->xs[x->index].sup : NULL;
        if (t)
            remove_task(s, t);
        if (sup && ev->type == LMS_EV_END && ev->stats.n_gen > 1 && ev->stats.tps > 0 &&
            lms_supervisor_record(sup, ev->stats.n_gen - 1, (ev->stats.n_gen - 1) * 1000.0 /
                                                               ev->stats.tps))
            server_request_restart(s, x);
    }
    lms_event_free(ev);
}

/* Scheduler thread. Must not block: a short critical section and a pipe
 * write. */
void task_sched_cb(void *user, lms_event *ev)
{
    lms_server *s = user;
    double now = lms_now_ms();
    pthread_mutex_lock(&s->mu);
    if (s->n_q == s->cap_q) {
        size_t cap = s->cap_q ? s->cap_q * 2 : 256;
        evnode *nq = realloc(s->q, cap * sizeof *nq);
        if (!nq) {
            pthread_mutex_unlock(&s->mu);
            lms_event_free(ev); /* out of memory: the event is lost */
            return;
        }
        s->q = nq;
        s->cap_q = cap;
    }
    s->q[s->n_q++] = (evnode){ev, now};
    if (!s->wake_pending && s->ctx_alive) {
        s->wake_pending = true;
        lws_cancel_service(s->ctx);
    }
    pthread_mutex_unlock(&s->mu);
}

bool task_end_failed(const task *t, const lms_event *ev, reqerr *e)
{
    const char *f = ev->stats.finish;
    if (ev->type != LMS_EV_ERROR && !(f && !strcmp(f, "abort")))
        return false;
    reqerr_set(e, ev->type == LMS_EV_ERROR ? task_error_status(t, ev) : 503, NULL, "%s",
               ev->type == LMS_EV_ERROR ? ev->message : "the generation was aborted");
    return true;
}
