/*
 * metrics.c - what the server counts and how it shows it: Prometheus text
 * for GET /metrics and a JSON object for GET /stats.
 *
 * Names follow the vLLM / llama-server ones operators know, with our own
 * prefix (docs/OPENAI.md): counters end in _total, latencies are
 * histograms in seconds. Scheduler-side numbers (tokens, queue, KV blocks,
 * prefix cache) come from lms_sched_get_stats at render time; request
 * outcomes and latencies are recorded here from terminal events on the
 * loop thread, so nothing needs a lock.
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/timeutil.h"
#include "serve/serve_int.h"

/* Upper bounds of the histogram buckets, seconds (the same for all). */
static const double bounds[METRICS_N_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                 0.25,  0.5,    1,     2.5,  5,     10,   30};

static const char *const finish_names[] = {"stop", "length", "abort", "deadline", "error",
                                           "rejected"};

void metrics_observe(histo *h, double seconds)
{
    if (!(seconds >= 0))
        seconds = 0;
    int i = 0;
    while (i < METRICS_N_BUCKETS && seconds > bounds[i])
        i++;
    h->counts[i]++;
    h->sum += seconds;
    h->n++;
}

static int finish_index(const lms_event *ev)
{
    if (ev->type == LMS_EV_ERROR)
        return FIN_ERROR;
    const char *f = ev->stats.finish ? ev->stats.finish : "stop";
    for (int i = 0; i < FIN_ERROR; i++)
        if (!strcmp(f, finish_names[i]))
            return i;
    return FIN_STOP;
}

void metrics_on_terminal(metrics *m, const lms_event *ev)
{
    int k = finish_index(ev);
    m->by_finish[k]++;
    if (ev->type != LMS_EV_END)
        return;
    if (ev->stats.n_gen > 0)
        metrics_observe(&m->ttft, ev->stats.ttft_ms / 1000.0);
    metrics_observe(&m->e2e, ev->stats.total_ms / 1000.0);
    metrics_observe(&m->queue, ev->stats.queue_ms / 1000.0);
}

/* ---- Prometheus text ------------------------------------------------------------- */

static void family(sbuf *o, const char *name, const char *type, const char *help)
{
    sbuf_addf(o, "# HELP lmserv_%s %s\n# TYPE lmserv_%s %s\n", name, help, name, type);
}

static void gauge(sbuf *o, const char *name, const char *help, double v)
{
    family(o, name, "gauge", help);
    sbuf_addf(o, "lmserv_%s %.17g\n", name, v);
}

static void counter(sbuf *o, const char *name, const char *help, uint64_t v)
{
    family(o, name, "counter", help);
    sbuf_addf(o, "lmserv_%s %llu\n", name, (unsigned long long)v);
}

static void histogram(sbuf *o, const char *name, const char *help, const histo *h)
{
    family(o, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < METRICS_N_BUCKETS; i++) {
        cum += h->counts[i];
        sbuf_addf(o, "lmserv_%s_bucket{le=\"%g\"} %llu\n", name, bounds[i],
                  (unsigned long long)cum);
    }
    sbuf_addf(o, "lmserv_%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)h->n);
    sbuf_addf(o, "lmserv_%s_sum %.9g\nlmserv_%s_count %llu\n", name, h->sum, name,
              (unsigned long long)h->n);
}

int metrics_sched_sum(lms_server *s, lms_sched_stats *st)
{
    memset(st, 0, sizeof *st);
    int n = 0;
    double t_last = -1;
    for (int i = 0; i < lms_registry_count(s->reg); i++) {
        lms_expert *x = lms_registry_at(s->reg, i);
        if (x->state != LMS_EXPERT_READY)
            continue;
        lms_sched_stats one;
        lms_sched_get_stats(x->sched, &one);
        n++;
        st->n_running += one.n_running;
        st->n_queued += one.n_queued;
        st->kv_blocks_total += one.kv_blocks_total;
        st->kv_blocks_used += one.kv_blocks_used;
        st->kv_blocks_cached += one.kv_blocks_cached;
        st->prefix_queries += one.prefix_queries;
        st->prefix_hits += one.prefix_hits;
        st->spec_drafted += one.spec_drafted;
        st->spec_accepted += one.spec_accepted;
        st->prompt_tokens += one.prompt_tokens;
        st->gen_tokens += one.gen_tokens;
        st->n_requests += one.n_requests;
        st->n_aborted += one.n_aborted;
        st->n_failed += one.n_failed;
        st->n_steps += one.n_steps;
        st->busy |= one.busy;
        if (x->t_used_ms > t_last && one.n_requests > 0) {
            t_last = x->t_used_ms;
            st->last_tps = one.last_tps;
            st->last_ttft_ms = one.last_ttft_ms;
        }
    }
    return n;
}

static void sched_stats(lms_server *s, lms_sched_stats *st)
{
    metrics_sched_sum(s, st);
}

/* An expert id as a Prometheus label value (a -m file name may hold any
 * byte; ids from a config file are plain). */
static const char *label(const lms_expert *x, char *buf, size_t n)
{
    size_t k = 0;
    for (const char *p = x->cfg->id; *p && k + 1 < n; p++)
        buf[k++] = *p == '"' || *p == '\\' || (unsigned char)*p < 0x20 ? '_' : *p;
    buf[k] = '\0';
    return buf;
}

/* Per expert: its state (one series per state, 1 for the current one),
 * loads, unloads, load failures, requests and live requests. */
static void render_models(lms_server *s, sbuf *o)
{
    int n = lms_registry_count(s->reg);
    char lb[LMS_EXPERT_ID_MAX + 40];
    family(o, "model_state", "gauge", "1 for the state each expert model is in.");
    for (int i = 0; i < n; i++) {
        const lms_expert *x = lms_registry_at(s->reg, i);
        for (int st = LMS_EXPERT_UNLOADED; st <= LMS_EXPERT_REMOTE; st++)
            sbuf_addf(o, "lmserv_model_state{model=\"%s\",state=\"%s\"} %d\n",
                      label(x, lb, sizeof lb), lms_expert_state_name(st), x->state == st);
    }
    static const struct { const char *name, *help; size_t off; } ctr[] = {
        {"model_loads_total", "Loads of each expert model.", offsetof(lms_expert, n_loads)},
        {"model_unloads_total", "Unloads of each expert model.", offsetof(lms_expert, n_unloads)},
        {"model_load_failures_total", "Failed loads of each expert model.",
         offsetof(lms_expert, n_load_failures)},
        {"model_requests_total", "Requests each expert model started.",
         offsetof(lms_expert, n_requests)},
        {"model_engine_restarts_total", "Engine restarts of each expert model.",
         offsetof(lms_expert, n_restarts)},
    };
    for (size_t k = 0; k < sizeof ctr / sizeof ctr[0]; k++) {
        family(o, ctr[k].name, "counter", ctr[k].help);
        for (int i = 0; i < n; i++) {
            const lms_expert *x = lms_registry_at(s->reg, i);
            sbuf_addf(o, "lmserv_%s{model=\"%s\"} %llu\n", ctr[k].name, label(x, lb, sizeof lb),
                      (unsigned long long)*(const uint64_t *)((const char *)x + ctr[k].off));
        }
    }
    family(o, "model_live_requests", "gauge", "Requests running or waiting on each expert.");
    for (int i = 0; i < n; i++) {
        const lms_expert *x = lms_registry_at(s->reg, i);
        sbuf_addf(o, "lmserv_model_live_requests{model=\"%s\"} %d\n", label(x, lb, sizeof lb),
                  x->n_live + x->n_waiting);
    }
    gauge(o, "models_loaded_bytes", "Estimated bytes of the loaded models (weights + KV).",
          (double)lms_registry_loaded_bytes(s->reg));
}

static json_t *sched_json(const lms_sched_stats *st);

static json_t *models_json(lms_server *s)
{
    json_t *a = json_array();
    for (int i = 0; i < lms_registry_count(s->reg); i++) {
        const lms_expert *x = lms_registry_at(s->reg, i);
        json_t *o = json_object();
        json_object_set_new(o, "id", xid_json(x));
        json_object_set_new(o, "state", json_string(lms_expert_state_name(x->state)));
        json_object_set_new(o, "loads", json_integer((json_int_t)x->n_loads));
        json_object_set_new(o, "unloads", json_integer((json_int_t)x->n_unloads));
        json_object_set_new(o, "load_failures", json_integer((json_int_t)x->n_load_failures));
        json_object_set_new(o, "requests", json_integer((json_int_t)x->n_requests));
        json_object_set_new(o, "live", json_integer(x->n_live));
        json_object_set_new(o, "waiting", json_integer(x->n_waiting));
        json_object_set_new(o, "engine_restarts", json_integer((json_int_t)x->n_restarts));
        json_object_set_new(o, "estimated_bytes",
                            json_integer((json_int_t)(x->file_bytes + x->kv_bytes)));
        json_object_set_new(o, "last_load_ms", json_real_safe(x->load_ms));
        if (x->error[0])
            json_object_set_new(o, "error", json_string_lossy(x->error, strlen(x->error)));
        if (x->state == LMS_EXPERT_READY) {
            lms_sched_stats st;
            lms_sched_get_stats(x->sched, &st);
            json_object_set_new(o, "sched", sched_json(&st));
        }
        if (x->remote) { /* the endpoint, never the api_key */
            lms_remote_stats rs;
            lms_remote_get_stats(x->remote, &rs);
            json_object_set_new(o, "remote", json_pack("{s:s, s:i, s:I, s:I, s:I, s:I, s:I, s:o, s:o}",
                "endpoint", x->cfg->endpoint, "running", (int)rs.n_running,
                "requests", (json_int_t)rs.n_requests, "aborted", (json_int_t)rs.n_aborted,
                "failed", (json_int_t)rs.n_failed, "prompt_tokens", (json_int_t)rs.prompt_tokens,
                "gen_tokens", (json_int_t)rs.gen_tokens, "last_tps", json_real_safe(rs.last_tps),
                "last_ttft_ms", json_real_safe(rs.last_ttft_ms)));
        }
        json_array_append_new(a, o);
    }
    return a;
}

static void render_requests(lms_server *s, sbuf *o)
{
    const metrics *m = &s->met;
    family(o, "requests_total", "counter", "Inference requests by final status.");
    for (int i = 0; i <= FIN_REJECTED; i++)
        sbuf_addf(o, "lmserv_requests_total{status=\"%s\"} %llu\n", finish_names[i],
                  (unsigned long long)m->by_finish[i]);
    family(o, "http_responses_total", "counter", "HTTP responses by status code.");
    for (int code = 100; code < 600; code++)
        if (m->http_by_code[code])
            sbuf_addf(o, "lmserv_http_responses_total{code=\"%d\"} %llu\n", code,
                      (unsigned long long)m->http_by_code[code]);
    family(o, "connections", "gauge", "Open client connections.");
    sbuf_addf(o, "lmserv_connections{kind=\"http\"} %d\nlmserv_connections{kind=\"ws\"} %d\n",
              s->n_conns - s->n_ws, s->n_ws);
    counter(o, "ws_messages_received_total", "WebSocket messages received.", m->ws_messages_in);
    counter(o, "ws_messages_sent_total", "WebSocket messages sent.", m->ws_messages_out);
}

static void render_sched(lms_server *s, sbuf *o)
{
    lms_sched_stats st;
    sched_stats(s, &st);
    counter(o, "prompt_tokens_total", "Prompt tokens processed (computed or cached).",
            st.prompt_tokens);
    counter(o, "generation_tokens_total", "Tokens generated.", st.gen_tokens);
    gauge(o, "num_requests_running", "Sequences prefilling or decoding.", st.n_running);
    gauge(o, "num_requests_waiting", "Requests in the queue (queue depth).", st.n_queued);
    gauge(o, "kv_blocks_total", "KV cache blocks in the pool.", st.kv_blocks_total);
    gauge(o, "kv_blocks_used", "KV cache blocks held by sequences.", st.kv_blocks_used);
    gauge(o, "kv_blocks_cached", "Free KV cache blocks holding a reusable prefix.",
          st.kv_blocks_cached);
    gauge(o, "kv_cache_usage_ratio", "Share of KV blocks held by sequences (0-1).",
          st.kv_blocks_total ? (double)st.kv_blocks_used / st.kv_blocks_total : 0.0);
    counter(o, "prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
            st.prefix_queries);
    counter(o, "prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
            st.prefix_hits);
    gauge(o, "last_tokens_per_second", "Decode speed of the last finished request.", st.last_tps);
}

static void render_gpu(lms_server *s, sbuf *o)
{
    lms_gpu_snapshot snap;
    lms_gpumon_snapshot(s->gpu, &snap);
    size_t cap = 4096 + 2048 * (size_t)snap.n_gpus;
    char *buf = malloc(cap);
    int n = buf ? lms_gpu_snapshot_prometheus(&snap, buf, cap) : -1;
    if (n > 0)
        sbuf_add(o, buf, (size_t)n);
    free(buf);
}

json_t *metrics_gpu_json(lms_server *s)
{
    if (!s->gpu)
        return json_null();
    lms_gpu_snapshot snap;
    lms_gpumon_snapshot(s->gpu, &snap);
    size_t cap = 1024 + 1024 * (size_t)snap.n_gpus;
    char *buf = malloc(cap);
    int n = buf ? lms_gpu_snapshot_json(&snap, buf, cap) : -1;
    json_t *j = n > 0 ? json_loadb(buf, (size_t)n, 0, NULL) : NULL;
    free(buf);
    return j ? j : json_null();
}

void metrics_render_prom(lms_server *s, sbuf *o)
{
    const metrics *m = &s->met;
    gauge(o, "model_loaded", "1 when a model is loaded and serving.",
          lms_registry_n_loaded(s->reg) > 0 && s->state == SRV_READY ? 1 : 0);
    gauge(o, "models_loaded", "Expert models loaded or loading.", lms_registry_n_loaded(s->reg));
    gauge(o, "uptime_seconds", "Seconds since the server started.",
          (lms_now_ms() - s->t_start_ms) / 1000.0);
    render_requests(s, o);
    render_sched(s, o);
    render_models(s, o);
    histogram(o, "time_to_first_token_seconds", "Time from request to first token.", &m->ttft);
    histogram(o, "inter_token_latency_seconds", "Time between consecutive tokens of a request.",
              &m->itl);
    histogram(o, "e2e_request_latency_seconds", "Time from request to its end.", &m->e2e);
    histogram(o, "request_queue_time_seconds", "Time a request waited before its first step.",
              &m->queue);
    if (s->gpu)
        render_gpu(s, o);
}

/* ---- /stats ----------------------------------------------------------------------- */

static const char *state_name(int st)
{
    switch (st) {
    case SRV_LOADING:
        return "loading";
    case SRV_READY:
        return "ready";
    case SRV_DRAINING:
        return "draining";
    default:
        return "failed";
    }
}

static json_t *sched_json(const lms_sched_stats *st)
{
    json_t *o = json_object();
    json_object_set_new(o, "running", json_integer(st->n_running));
    json_object_set_new(o, "queued", json_integer(st->n_queued));
    json_object_set_new(o, "busy", json_boolean(st->busy));
    json_object_set_new(o, "steps", json_integer((json_int_t)st->n_steps));
    json_object_set_new(o, "prompt_tokens", json_integer((json_int_t)st->prompt_tokens));
    json_object_set_new(o, "gen_tokens", json_integer((json_int_t)st->gen_tokens));
    json_object_set_new(o, "prefix_queries", json_integer((json_int_t)st->prefix_queries));
    json_object_set_new(o, "prefix_hits", json_integer((json_int_t)st->prefix_hits));
    json_object_set_new(o, "draft_tokens", json_integer((json_int_t)st->spec_drafted));
    json_object_set_new(o, "draft_accepted", json_integer((json_int_t)st->spec_accepted));
    json_object_set_new(o, "finished", json_integer((json_int_t)st->n_requests));
    json_object_set_new(o, "aborted", json_integer((json_int_t)st->n_aborted));
    json_object_set_new(o, "failed", json_integer((json_int_t)st->n_failed));
    json_object_set_new(o, "last_tps", json_real_safe(st->last_tps));
    json_object_set_new(o, "last_ttft_ms", json_real_safe(st->last_ttft_ms));
    return o;
}

json_t *metrics_stats_json(lms_server *s)
{
    lms_sched_stats st;
    sched_stats(s, &st);
    json_t *o = json_object();
    json_object_set_new(o, "state", json_string(state_name(s->state)));
    json_object_set_new(o, "model", s->state == SRV_READY ? xid_json(server_default_expert(s))
                                                           : json_null());
    json_object_set_new(o, "models", models_json(s));
    json_object_set_new(o, "uptime_s", json_real_safe((lms_now_ms() - s->t_start_ms) / 1000.0));
    json_t *cn = json_object();
    json_object_set_new(cn, "http", json_integer(s->n_conns - s->n_ws));
    json_object_set_new(cn, "ws", json_integer(s->n_ws));
    json_object_set_new(o, "connections", cn);
    json_object_set_new(o, "live_requests", json_integer((json_int_t)s->n_tasks));
    json_t *kv = json_object();
    json_object_set_new(kv, "blocks_total", json_integer(st.kv_blocks_total));
    json_object_set_new(kv, "blocks_used", json_integer(st.kv_blocks_used));
    json_object_set_new(kv, "blocks_cached", json_integer(st.kv_blocks_cached));
    json_object_set_new(o, "kv", kv);
    json_object_set_new(o, "sched", sched_json(&st));
    json_t *req = json_object();
    for (int i = 0; i <= FIN_REJECTED; i++)
        json_object_set_new(req, finish_names[i], json_integer((json_int_t)s->met.by_finish[i]));
    json_object_set_new(o, "requests", req);
    json_object_set_new(o, "gpu", metrics_gpu_json(s));
    return o;
}
