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

static void sched_stats(lms_server *s, lms_sched_stats *st)
{
    memset(st, 0, sizeof *st);
    if (s->sched)
        lms_sched_get_stats(s->sched, st);
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
    gauge(o, "model_loaded", "1 when the model is loaded and serving.", s->sched ? 1 : 0);
    gauge(o, "uptime_seconds", "Seconds since the server started.",
          (lms_now_ms() - s->t_start_ms) / 1000.0);
    render_requests(s, o);
    render_sched(s, o);
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
    json_object_set_new(o, "model", s->sched ? json_string_lossy(s->model_id, strlen(s->model_id))
                                             : json_null());
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
