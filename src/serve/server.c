/*
 * server.c - the server object and its event loop: the libwebsockets
 * context on one port, the protocol callback that routes every lws event
 * to http.c / ws.c / conn.c, the hand-off from other threads (scheduler
 * events, model attach, load failure, stop), the 1-second tick (metrics
 * broadcast) and graceful shutdown.
 *
 * Shutdown, on lms_server_stop:
 *
 *   READY --stop--> DRAINING: new sockets refused, new requests 503,
 *      |                      running streams go on
 *      |            --all tasks ended and output flushed--> done (exit 0)
 *      |            --grace_ms passed--> abort every request; their ends
 *      |                      go out as usual ("abort"), then done (exit 0)
 *      |            --a second stop--> cut everything now, done (exit 0)
 *   LOADING --stop--> done
 *
 * lms_server_run returns when done; lms_server_destroy closes the sockets
 * (aborting what is left) and only then destroys the scheduler, whose
 * final events land in a queue nobody wakes any more and are freed.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/random.h>
#include <unistd.h>

#include "base/err.h"
#include "base/timeutil.h"
#include "ops/log.h"
#include "route/embed.h"
#include "serve/reasoning.h"
#include "serve/serve_int.h"

#define TICK_US (1000 * 1000)
#define DRAIN_TICK_US (100 * 1000)

/* ---- small services ------------------------------------------------------------- */

uint64_t server_rand(lms_server *s)
{
    /* xorshift64*: ids and default seeds, not secrets */
    uint64_t x = s->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    s->rng = x;
    return x * 0x2545F4914F6CDD1Dull;
}

bool server_key_ok(const lms_server *s, const char *presented, size_t n)
{
    const char *key = s->api_key;
    size_t kn = strlen(key);
    /* time depends on the presented length only, never on where bytes differ */
    unsigned diff = n != kn;
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)presented[i] ^ (unsigned char)key[kn ? i % kn : 0];
    return diff == 0 && kn > 0;
}

void server_broadcast_ws(lms_server *s, json_t *msg, bool all)
{
    size_t n;
    char *text = msg ? json_dump_compact(msg, &n) : NULL;
    json_decref(msg);
    if (!text)
        return;
    for (conn *c = s->conns; c; c = c->next)
        if (c->role == CONN_WS && !c->closed && (all || c->op_subscribed))
            conn_out_ws(c, text, n);
    free(text);
}

/* ---- hand-off from other threads ---------------------------------------------------- */

/* Loader thread: the chat template of a freshly loaded model; for the
 * router's embedding model also the embeddings of the router's documents
 * (computed here, where waiting is allowed). */
static int hook_prepare(void *ud, const lms_expert *x, lms_model *m, lms_sched *sched,
                        void **attach, char *err, size_t errsz)
{
    lms_server *s = ud;
    sattach *a = calloc(1, sizeof *a);
    if (!a)
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory");
    int rc = chatfmt_init(&a->fmt, m, x->cfg->chat_template, err, errsz);
    if (rc == 0 && (rc = api_lora_prepare(a, x, m, err, errsz)) < 0)
        chatfmt_deinit(&a->fmt);
    if (rc < 0) {
        free(a);
        return rc;
    }
    int n = lms_router_n_docs(s->router);
    if (x == lms_registry_embedder(s->reg) && n > 0) {
        const char **texts = calloc((size_t)n, sizeof *texts);
        a->n_embd = m->hp.n_embd;
        a->docs = malloc((size_t)n * (size_t)a->n_embd * sizeof *a->docs);
        for (int i = 0; texts && i < n; i++)
            texts[i] = lms_router_doc_text(s->router, i);
        rc = texts && a->docs ? lms_embed_texts(sched, m, texts, n, a->docs, err, errsz)
                              : lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory");
        free(texts);
        a->n_docs = n;
        if (rc < 0) {
            api_lora_free(a);
            chatfmt_deinit(&a->fmt);
            free(a->docs);
            free(a);
            return rc;
        }
    }
    *attach = a;
    return 0;
}

static void hook_release(void *ud, void *attach)
{
    (void)ud;
    sattach *a = attach;
    api_lora_free(a);
    chatfmt_deinit(&a->fmt);
    free(a->docs);
    free(a);
}

/* Loader thread: a job is done; lms_registry_poll at the next wake-up. */
static void hook_wake(void *ud)
{
    lms_server *s = ud;
    pthread_mutex_lock(&s->mu);
    s->pend_poll = true;
    if (s->ctx_alive)
        lws_cancel_service(s->ctx);
    pthread_mutex_unlock(&s->mu);
}

static void set_done(lms_server *s);

static void become_ready(lms_server *s)
{
    s->state = SRV_READY;
    lms_expert *d = server_default_expert(s);
    lms_log(LMS_LOG_INFO, "server_ready", "models", LMS_LOG_I64(lms_registry_count(s->reg)),
            "loaded", LMS_LOG_I64(lms_registry_n_loaded(s->reg)), "default",
            LMS_LOG_STR(d->cfg->id), "lazy", LMS_LOG_BOOL(lms_registry_cfg(s->reg)->lazy));
    for (conn *c = s->conns; c; c = c->next)
        if (c->role == CONN_WS && !c->closed)
            ws_op_hello(c);
}

/* Loop thread (lms_registry_poll): an expert changed state. At start
 * (SRV_LOADING) the server waits for every load begun; one failing ends
 * the server (exit 1), as `serve -m` with a bad file always has. */
static void on_change(void *ud, lms_expert *x)
{
    lms_server *s = ud;
    if (s->state == SRV_LOADING && x->index < lms_registry_count(s->reg)) {
        if (x->state == LMS_EXPERT_FAILED) {
            s->state = SRV_FAILED;
            s->exit_code = 1;
            set_done(s);
            return;
        }
        for (int i = 0; i < lms_registry_count(s->reg); i++)
            if (lms_registry_at(s->reg, i)->state == LMS_EXPERT_LOADING)
                return;
        become_ready(s);
    }
    pick_on_change(s, x);
}

/* Ends lms_server_run: the loop may sit in poll() until its next timer,
 * so wake it. */
static void set_done(lms_server *s)
{
    s->done = true;
    lws_cancel_service(s->ctx);
}

static void finish_now(lms_server *s)
{
    for (conn *c = s->conns; c; c = c->next) {
        if (!c->tasks)
            continue;
        conn_cancel_tasks(c);
        c->kill = true; /* its response is cut short: close it */
        conn_want_write(c);
    }
    set_done(s);
}

static void tick_cb(lws_sorted_usec_list_t *sul);

static void begin_drain(lms_server *s)
{
    if (s->state == SRV_LOADING || s->state == SRV_FAILED) {
        set_done(s);
        return;
    }
    if (s->state == SRV_DRAINING) {
        lms_log(LMS_LOG_WARN, "server_stop_now", "aborted", LMS_LOG_U64(s->n_tasks));
        finish_now(s);
        return;
    }
    s->state = SRV_DRAINING;
    pick_fail_all(s, "the server is shutting down");
    s->drain_deadline = lms_now_ms() + s->p.grace_ms;
    lms_log(LMS_LOG_INFO, "server_draining", "requests", LMS_LOG_U64(s->n_tasks), "grace_ms",
            LMS_LOG_F64(s->p.grace_ms));
    lws_sul_schedule(s->ctx, 0, &s->sul_tick, tick_cb, DRAIN_TICK_US); /* check soon */
}

/* x's engine stalled: its requests end with an error (their events arrive
 * through the queue like any other), a new scheduler with the same
 * parameters takes its place. Request ids are unique across schedulers. */
static void restart_engine(lms_server *s, lms_expert *x)
{
    if (x->state != LMS_EXPERT_READY || s->state == SRV_FAILED)
        return;
    char err[256];
    if (lms_registry_restart(s->reg, x, "the engine stalled and was restarted; please retry", err,
                             sizeof err) < 0) {
        lms_log(LMS_LOG_ERROR, "engine_restart_failed", "model", LMS_LOG_STR(x->cfg->id),
                "error", LMS_LOG_STR(err));
        return; /* the expert is FAILED: its next request loads it again */
    }
    s->n_restarts++;
    if (s->xs[x->index].sup)
        lms_supervisor_reset(s->xs[x->index].sup);
    lms_log(LMS_LOG_WARN, "engine_restarted", "model", LMS_LOG_STR(x->cfg->id), "restarts",
            LMS_LOG_U64(s->n_restarts));
}

void lms_server_engine_stalled(lms_server *s, lms_sched *sched)
{
    pthread_mutex_lock(&s->mu);
    if (sched && s->n_stalled < SRV_MAX_STALLED)
        s->pend_stalled[s->n_stalled++] = sched;
    else
        s->stalled_all = true;
    if (s->ctx_alive)
        lws_cancel_service(s->ctx);
    pthread_mutex_unlock(&s->mu);
}

void server_request_restart(lms_server *s, lms_expert *x)
{
    s->xs[x->index].restart = true;
    lws_cancel_service(s->ctx); /* handled by the next drain_queue */
}

/* Restarts the experts whose schedulers stalled (a scheduler no expert
 * holds any more was replaced or unloaded already). */
static void restarts(lms_server *s, lms_sched *const *stalled, int n, bool all)
{
    for (int i = 0; i < lms_registry_count_all(s->reg); i++) {
        lms_expert *x = lms_registry_at(s->reg, i);
        bool hit = all || s->xs[i].restart;
        for (int k = 0; k < n && !hit; k++)
            hit = x->sched && x->sched == stalled[k];
        s->xs[i].restart = false;
        if (hit && x->sched)
            restart_engine(s, x);
    }
}

/* EVENT_WAIT_CANCELLED: everything other threads posted. */
static void drain_queue(lms_server *s)
{
    pthread_mutex_lock(&s->mu);
    evnode *q = s->q;
    size_t n = s->n_q;
    s->q = NULL;
    s->n_q = s->cap_q = 0;
    s->wake_pending = false;
    bool poll = s->pend_poll, lora = s->pend_lora;
    s->pend_poll = s->pend_lora = false;
    lms_sched *stalled[SRV_MAX_STALLED];
    int n_stalled = s->n_stalled;
    memcpy(stalled, s->pend_stalled, sizeof stalled);
    bool all = s->stalled_all;
    s->n_stalled = 0;
    s->stalled_all = false;
    int stops = s->stop_requests;
    pthread_mutex_unlock(&s->mu);

    restarts(s, stalled, n_stalled, all);
    if (poll)
        lms_registry_poll(s->reg, on_change, s);
    if (lora)
        api_lora_poll(s);
    for (size_t i = 0; i < n; i++)
        task_dispatch(s, q[i].ev, q[i].t_ms);
    free(q);
    while (s->stops_seen < stops) {
        s->stops_seen++;
        begin_drain(s);
    }
}

/* ---- tick ----------------------------------------------------------------------------- */

static bool all_flushed(lms_server *s)
{
    if (s->n_tasks > 0 || s->lora_jobs)
        return false;
    for (conn *c = s->conns; c; c = c->next)
        if (!c->closed && (!conn_idle_out(c) || lws_partial_buffered(c->wsi)))
            return false;
    return true;
}

/* Grace over: abort every request; their end events still go out (an
 * error chunk and [DONE], "end"/"done" with finish_reason "abort"), then
 * the connections are closed. */
static void abort_all(lms_server *s, double now)
{
    lms_log(LMS_LOG_WARN, "grace_over", "aborted", LMS_LOG_U64(s->n_tasks));
    s->aborting = true;
    s->drain_deadline = now + 2000;
    for (conn *c = s->conns; c; c = c->next)
        for (task *t = c->tasks; t; t = t->c_next)
            task_abort(t);
}

static void tick_cb(lws_sorted_usec_list_t *sul)
{
    lms_server *s = lws_container_of(sul, lms_server, sul_tick);
    double now = lms_now_ms();
    if (s->gpu && lms_gpumon_available(s->gpu)) {
        lms_gpumon_poll_if_older(s->gpu, 900);
        if (s->p.thermal) {
            lms_gpu_snapshot snap;
            double temp = NAN;
            lms_gpumon_snapshot(s->gpu, &snap);
            if (!lms_gpu_snapshot_max_temp(&snap, &temp))
                temp = NAN;
            lms_thermal_update(s->p.thermal, temp, now);
        }
    }
    if (s->state == SRV_READY)
        lms_registry_tick(s->reg, now);
    if (s->state != SRV_LOADING && now - s->t_last_broadcast >= 990) {
        s->t_last_broadcast = now;
        bool any = false;
        for (conn *c = s->conns; c && !any; c = c->next)
            any = c->role == CONN_WS && c->op_subscribed;
        if (any)
            server_broadcast_ws(s, ws_op_metrics_msg(s), false);
    }
    if (s->state == SRV_DRAINING) {
        if (all_flushed(s))
            set_done(s);
        else if (now >= s->drain_deadline && !s->aborting)
            abort_all(s, now);
        else if (now >= s->drain_deadline)
            finish_now(s); /* the aborts did not come back in time */
    }
    if (!s->done)
        lws_sul_schedule(s->ctx, 0, &s->sul_tick, tick_cb,
                         s->state == SRV_DRAINING ? DRAIN_TICK_US : TICK_US);
}

/* ---- the lws callback ------------------------------------------------------------------ */

static int on_conn_event(lms_server *s, conn *c, enum lws_callback_reasons reason, void *in,
                         size_t len)
{
    switch (reason) {
    case LWS_CALLBACK_HTTP:
        return http_on_request(c, in);
    case LWS_CALLBACK_HTTP_BODY:
        return http_on_body(c, in, len);
    case LWS_CALLBACK_HTTP_BODY_COMPLETION:
        return http_on_body_done(c);
    case LWS_CALLBACK_HTTP_WRITEABLE:
        return http_on_writable(c);
    case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION:
        return ws_filter(c);
    case LWS_CALLBACK_ESTABLISHED:
        return ws_on_open(c);
    case LWS_CALLBACK_RECEIVE:
        return ws_on_receive(c, in, len);
    case LWS_CALLBACK_SERVER_WRITEABLE:
        return ws_on_writable(c);
    case LWS_CALLBACK_CLOSED:
    case LWS_CALLBACK_CLOSED_HTTP:
        c->closed = true;
        conn_cancel_tasks(c); /* abort at once: frees KV blocks */
        return 0;
    default:
        (void)s;
        return 0;
    }
}

static int callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                    size_t len)
{
    lms_server *s = lws_context_user(lws_get_context(wsi));
    conn *c;
    switch (reason) {
    case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
        if (!s->io_closing)
            drain_queue(s);
        return 0;
    case LWS_CALLBACK_FILTER_NETWORK_CONNECTION:
        return s->state == SRV_DRAINING || s->n_conns >= s->p.max_conns;
    case LWS_CALLBACK_RAW_ADOPT:
        /* lws 4.1 turns a CONNECT request into a raw socket, dropping its
         * conn: one with no timeout, outside max_conns, that nothing here
         * would ever answer or close. This server proxies nothing: close it. */
        return -1;
    case LWS_CALLBACK_SERVER_NEW_CLIENT_INSTANTIATED:
        /* after adoption (which resets the opaque pointer); freed at WSI_DESTROY */
        c = conn_create(s, wsi);
        lws_set_opaque_user_data(wsi, c);
        return c ? 0 : -1;
    case LWS_CALLBACK_WSI_DESTROY:
        c = lws_get_opaque_user_data(wsi);
        if (c) {
            lws_set_opaque_user_data(wsi, NULL);
            conn_destroy(c);
        }
        return 0;
    case LWS_CALLBACK_HTTP:
    case LWS_CALLBACK_HTTP_BODY:
    case LWS_CALLBACK_HTTP_BODY_COMPLETION:
    case LWS_CALLBACK_HTTP_WRITEABLE:
    case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION:
    case LWS_CALLBACK_ESTABLISHED:
    case LWS_CALLBACK_RECEIVE:
    case LWS_CALLBACK_SERVER_WRITEABLE:
    case LWS_CALLBACK_CLOSED:
    case LWS_CALLBACK_CLOSED_HTTP:
        c = lws_get_opaque_user_data(wsi);
        return c ? on_conn_event(s, c, reason, in, len) : -1;
    default:
        return lws_callback_http_dummy(wsi, reason, user, in, len);
    }
}

static const struct lws_protocols protocols[] = {
    {"lmserv", callback, 16, 16384, 0, NULL, 0},
    {NULL, NULL, 0, 0, 0, NULL, 0},
};

/* ---- lifecycle ------------------------------------------------------------------------- */

static char *dup_or_null(const char *s)
{
    return s && s[0] ? strdup(s) : NULL;
}

static void set_defaults(lms_server *s, const lms_server_params *p)
{
    s->p = *p;
    if (!s->p.max_body_bytes)
        s->p.max_body_bytes = 1u << 20;
    if (!s->p.max_frame_bytes)
        s->p.max_frame_bytes = s->p.max_body_bytes;
    if (s->p.max_conns <= 0)
        s->p.max_conns = 512;
    if (s->p.max_conns > 60000)
        s->p.max_conns = 60000;
    if (s->p.grace_ms <= 0)
        s->p.grace_ms = 10000;
    s->host = dup_or_null(p->host);
    s->api_key = dup_or_null(p->api_key);
    s->p.lora_dir = NULL;
    s->p.route = NULL; /* taken by the registry */
    if (getrandom(&s->rng, sizeof s->rng, 0) != sizeof s->rng)
        s->rng = (uint64_t)lms_now_ms() ^ ((uint64_t)getpid() << 32);
    s->rng |= 1;
    s->t_start_ms = lms_now_ms();
    s->t_start_wall = lms_wall_s();
}

static int create_context(lms_server *s, char *err, size_t errsz)
{
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof info);
    info.port = s->p.port;
    info.iface = s->host;
    info.protocols = protocols;
    info.user = s;
    info.options = LWS_SERVER_OPTION_VALIDATE_UTF8;
    if (s->host && strchr(s->host, '.') && !strchr(s->host, ':'))
        info.options |= LWS_SERVER_OPTION_DISABLE_IPV6;
    info.fd_limit_per_thread = (unsigned)s->p.max_conns + 64;
    info.max_http_header_pool = (unsigned short)(s->p.max_conns < 65535 ? s->p.max_conns : 65535);
    info.max_http_header_data = 8192;
    info.keepalive_timeout = 30;
    info.timeout_secs = 30;
    info.pt_serv_buf_size = 32768;
    const char *lvl = getenv("LMSERV_LWS_LOG");
    lws_set_log_level(lvl ? atoi(lvl) : LLL_ERR, NULL);
    s->ctx = lws_create_context(&info);
    if (!s->ctx)
        return lms_errf(err, errsz, LMS_ERR_IO, "cannot listen on %s:%d (address in use?)",
                        s->host ? s->host : "*", s->p.port);
    s->vh = lws_get_vhost_by_name(s->ctx, "default");
    s->port = s->vh ? lws_get_vhost_listen_port(s->vh) : s->p.port;
    s->ctx_alive = true;
    return 0;
}

/* The registry, the router and the per-expert state; takes p->route. */
static int create_models(lms_server *s, lms_route_cfg *route, char *err, size_t errsz)
{
    int n = route->n_experts + 1; /* the router's own model may follow the experts */
    s->xs = calloc((size_t)n, sizeof *s->xs);
    if (!s->xs) {
        lms_route_cfg_free(route);
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory");
    }
    s->n_xs = n;
    for (int i = 0; i < n && s->p.min_tps > 0; i++) {
        lms_supervisor_params sp = {.floor_tps = s->p.min_tps, .window = 8, .min_tokens = 16};
        s->xs[i].sup = lms_supervisor_create(&sp, NULL, NULL);
    }
    lms_registry_hooks h = {.prepare = hook_prepare, .release = hook_release,
                            .wake = hook_wake, .ud = s};
    int rc = lms_registry_create(route, &s->p.sched, &h, &s->reg, err, errsz);
    if (rc < 0) {
        lms_route_cfg_free(route);
        return rc;
    }
    if (lms_router_create(lms_registry_cfg(s->reg), &s->router) < 0)
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory");
    return 0;
}

/* --chat-template-kwargs, --reasoning, --reasoning-format and --pooling. */
static int chat_defaults(lms_server *s, const lms_server_params *p, char *err, size_t errsz)
{
    const char *rf = p->reasoning_format;
    s->rfmt = rf ? reasoning_format_parse(rf) : REASONING_DEEPSEEK;
    if (s->rfmt < 0)
        return lms_errf(err, errsz, LMS_ERR_INVAL, "reasoning format '%.40s': use none, auto, "
                        "deepseek or deepseek-legacy", rf);
    s->pooling = lms_pooling_parse(p->pooling);
    if (p->pooling && !s->pooling)
        return lms_errf(err, errsz, LMS_ERR_UNSUPPORTED, "pooling '%.40s': use mean, cls, last "
                        "or rank (none, per-token vectors, is not served)", p->pooling);
    const int sw = lms_template_switches(p->chat_template_kwargs, p->reasoning, &s->tpl_kwargs,
                                         err, errsz);
    if (sw < 0)
        return sw;
    if (p->sampling_defaults && p->sampling_defaults[0]) {
        json_error_t je;
        genparams gp;
        reqerr e;
        s->gen_defaults = json_loads(p->sampling_defaults, 0, &je);
        if (!json_is_object(s->gen_defaults))
            return lms_errf(err, errsz, LMS_ERR_INVAL, "sampling defaults: %s",
                            s->gen_defaults ? "must be a JSON object" : je.text);
        genparams_init(&gp, 0);
        const int rc = reqparse_gen(s->gen_defaults, &gp, &e);
        genparams_deinit(&gp);
        if (rc < 0)
            return lms_errf(err, errsz, LMS_ERR_INVAL, "sampling defaults: %s", e.msg);
    }
    return 0;
}

void server_genparams(lms_server *s, genparams *gp)
{
    genparams_init(gp, server_rand(s));
    reqerr e;
    if (s->gen_defaults) /* checked at start */
        (void)reqparse_gen(s->gen_defaults, gp, &e);
}

int lms_server_create(const lms_server_params *p, lms_server **out, char *err, size_t errsz)
{
    lms_route_cfg *route = p->route;
    if (!route || route->n_experts < 1) {
        if (route)
            lms_route_cfg_free(route);
        return lms_errf(err, errsz, LMS_ERR_INVAL, "no model to serve");
    }
    if (p->port < 0 || p->port > 65535) {
        lms_route_cfg_free(route);
        return lms_errf(err, errsz, LMS_ERR_INVAL, "port %d is not in [0, 65535]", p->port);
    }
    lms_server *s = calloc(1, sizeof *s);
    if (!s || tasks_init(s) < 0) {
        free(s);
        lms_route_cfg_free(route);
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&s->mu, NULL);
    set_defaults(s, p);
    s->gpu = lms_gpumon_create(NULL); /* NULL only when out of memory: then no GPU data */
    int rc = 0;
    if (p->lora_dir && p->lora_dir[0]) { /* the folder run-time adapter loads stay in */
        struct stat st;
        char real[PATH_MAX];
        if (!realpath(p->lora_dir, real) || stat(real, &st) != 0 || !S_ISDIR(st.st_mode) ||
            !(s->lora_dir = strdup(real)))
            rc = lms_errf(err, errsz, LMS_ERR_INVAL, "--lora-dir '%.300s' is not a directory",
                          p->lora_dir);
    }
    if (rc == 0)
        rc = chat_defaults(s, p, err, errsz);
    if (rc < 0)
        lms_route_cfg_free(route);
    else
        rc = create_models(s, route, err, errsz);
    if (rc == 0)
        rc = create_context(s, err, errsz);
    if (rc < 0) {
        lms_server_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

int lms_server_port(const lms_server *s)
{
    return s->port;
}

void lms_server_stop(lms_server *s)
{
    pthread_mutex_lock(&s->mu);
    s->stop_requests++;
    if (s->ctx_alive)
        lws_cancel_service(s->ctx);
    pthread_mutex_unlock(&s->mu);
}

static int cmp_priority(const void *a, const void *b)
{
    const lms_expert *x = *(lms_expert *const *)a, *y = *(lms_expert *const *)b;
    if (x->cfg->priority != y->cfg->priority)
        return x->cfg->priority > y->cfg->priority ? -1 : 1;
    return x->index - y->index;
}

/* The loads at start: every expert (lazy loading off) or the warm-up pool
 * (on), highest priority first, as far as max_loaded_experts and the
 * memory threshold allow. Without lazy loading the server is ready when
 * they are loaded; with it, at once. */
static void start_models(lms_server *s)
{
    const lms_route_cfg *cfg = lms_registry_cfg(s->reg);
    int n = lms_registry_count(s->reg);
    lms_expert **order = calloc((size_t)n, sizeof *order);
    int want = cfg->lazy ? cfg->warmup : n;
    if (cfg->max_loaded > 0 && want > cfg->max_loaded)
        want = cfg->max_loaded;
    for (int i = 0; order && i < n; i++)
        order[i] = lms_registry_at(s->reg, i);
    if (order)
        qsort(order, (size_t)n, sizeof *order, cmp_priority);
    int started = 0;
    for (int i = 0; order && i < n && started < want; i++) {
        char err[384];
        if (order[i]->remote)
            continue; /* nothing to load */
        if (lms_registry_want(s->reg, order[i], err, sizeof err) < 0)
            break; /* over the memory threshold: the rest load on use */
        started++;
    }
    free(order);
    lms_expert *e = lms_registry_embedder(s->reg);
    if (e && e->index >= n) { /* the router's own model: loads at start, never waited for */
        char err[384];
        lms_registry_want(s->reg, e, err, sizeof err);
    }
    if (cfg->lazy || started == 0)
        become_ready(s);
}

int lms_server_run(lms_server *s)
{
    char url[300];
    snprintf(url, sizeof url, "http://%s:%d", s->host ? s->host : "0.0.0.0", s->port);
    lms_log(LMS_LOG_INFO, "server_listening", "url", LMS_LOG_STR(url), "websocket",
            LMS_LOG_STR("/ws"), "auth", LMS_LOG_BOOL(s->api_key != NULL));
    s->t_last_broadcast = lms_now_ms();
    start_models(s);
    lws_sul_schedule(s->ctx, 0, &s->sul_tick, tick_cb, TICK_US);
    while (!s->done) {
        s->n_pass++;
        if (lws_service(s->ctx, 0) < 0)
            break;
    }
    return s->exit_code;
}

void lms_server_destroy(lms_server *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->ctx_alive = false;
    pthread_mutex_unlock(&s->mu);
    s->io_closing = true;
    if (s->ctx)
        lws_context_destroy(s->ctx); /* closes sockets: their tasks are aborted */
    s->ctx = NULL;
    api_lora_join(s);               /* before the models its loads read go */
    lms_registry_destroy(s->reg);   /* final events go to the queue, unread */
    lms_router_destroy(s->router);
    for (size_t i = 0; i < s->n_q; i++)
        lms_event_free(s->q[i].ev);
    free(s->q);
    tasks_deinit(s);
    lms_gpumon_destroy(s->gpu);
    for (int i = 0; i < s->n_xs; i++)
        lms_supervisor_destroy(s->xs[i].sup);
    free(s->xs);
    free(s->host);
    free(s->api_key);
    free(s->lora_dir);
    json_decref(s->tpl_kwargs);
    json_decref(s->gen_defaults);
    api_responses_free_store(s);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
