/*
 * remote.c - experts served by another OpenAI-compatible server (remote.h).
 *
 * One worker thread per remote expert drives a curl multi handle. Requests
 * and aborts reach it through two lists under `mu`, and curl_multi_wakeup
 * ends its poll at once; it then starts the new transfers, removes the
 * aborted ones (ending them with finish "abort"), lets curl move bytes and
 * finishes what completed. A transfer's write callback feeds the SSE
 * reader; each data payload becomes a token event on the spot.
 *
 * Errors name the expert and the endpoint (never the key): connection
 * failures with curl's own words, a non-2xx answer with its status and the
 * message of its OpenAI error body, an error inside the stream with its
 * message.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>
#include <jansson.h>

#include "base/err.h"
#include "base/timeutil.h"
#include "route/remote.h"

#define ERRBODY_MAX 65536 /* bytes of a non-2xx body kept for its message */
#define MAX_CALLS 64      /* function calls in one reply */
/* Remote ids live apart from the scheduler's (which count up from 1). */
#define REMOTE_ID_BASE (1ull << 62)

static uint64_t g_next_id;

typedef struct rreq rreq;

/* A function call of the reply, put together from its pieces. */
typedef struct rcall {
    char *name;                /* the first name a piece gave, or NULL */
    char *args;                /* the arguments' JSON text so far (capped at LMS_SSE_MAX) */
    size_t n_args, cap_args;
} rcall;

struct lms_remote {
    const lms_expert_cfg *e;   /* borrowed: id, endpoint, key, model, timeout */
    CURLM *multi;              /* worker thread */
    pthread_t th;
    bool started;
    pthread_mutex_t mu;
    rreq *incoming;            /* mu: submitted, not yet started (LIFO; order is free) */
    uint64_t *aborts;          /* mu: ids to stop */
    size_t n_aborts, cap_aborts;
    bool stop;                 /* mu */
    lms_remote_stats st;       /* mu */
    rreq *active;              /* worker thread: transfers in flight */
};

/* One upstream request (worker thread once submitted). */
struct rreq {
    lms_remote *r;
    uint64_t id;
    bool chat;
    char *body;                /* the upstream body (model, stream set) */
    double timeout_ms;
    bool own_deadline;         /* timeout_ms is the request's deadline, not the expert's */
    lms_event_fn cb;
    void *user;
    CURL *h;
    struct curl_slist *hdr;
    char curl_err[CURL_ERROR_SIZE];
    lms_sse sse;
    long status;               /* HTTP status once the headers came; 0 before */
    bool thinking;             /* the pieces passed on are inside <think> (on_data) */
    bool tools;                /* the body has tools: the upstream's calls are passed on */
    rcall *calls;              /* [MAX_CALLS] by index once a call came, else NULL */
    int n_calls;               /* the highest index seen + 1 */
    bool json_body;            /* a 2xx answer in one JSON body (an upstream that does not
                                * stream): kept in eb, read at the end */
    char *eb;                  /* non-2xx body or json_body (capped) */
    size_t n_eb;
    double t0, t_first;
    int64_t n_pieces, n_prompt, n_gen;
    const char *finish;
    char *stream_err;          /* an error the stream reported, or a parse failure */
    rreq *next;
};

/* ---- SSE reader ---------------------------------------------------------------------- */

void lms_sse_init(lms_sse *p)
{
    memset(p, 0, sizeof *p);
}

void lms_sse_deinit(lms_sse *p)
{
    free(p->line);
    free(p->data);
    memset(p, 0, sizeof *p);
}

/* Appends to a growable buffer capped at LMS_SSE_MAX; false when over it
 * (nothing appended) or out of memory (*oom set). */
static bool grow_add(char **buf, size_t *n, size_t *cap, const char *s, size_t k, bool *oom)
{
    if (*n + k > LMS_SSE_MAX)
        return false;
    if (*n + k + 1 > *cap) {
        size_t nc = *cap ? *cap : 256;
        while (nc < *n + k + 1)
            nc *= 2;
        char *nb = realloc(*buf, nc);
        if (!nb) {
            *oom = true;
            return false;
        }
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *n, s, k);
    *n += k;
    (*buf)[*n] = '\0';
    return true;
}

static int sse_line(lms_sse *p, lms_sse_fn on_data, void *ud)
{
    bool oom = false;
    const char *l = p->line ? p->line : "";
    size_t n = p->n_line;
    if (n == 0) { /* blank line: the event is complete */
        if (p->has_data)
            on_data(ud, p->data ? p->data : "", p->n_data, p->overflow);
        p->n_data = 0;
        p->has_data = p->overflow = false;
        return 0;
    }
    if (l[0] == ':') /* comment (keep-alive) */
        return 0;
    const char *colon = memchr(l, ':', n);
    size_t fn = colon ? (size_t)(colon - l) : n;
    if (fn != 4 || memcmp(l, "data", 4) != 0)
        return 0; /* event:, id:, retry: and unknown fields mean nothing here */
    const char *v = colon ? colon + 1 : l + n;
    size_t vn = (size_t)(l + n - v);
    if (vn && v[0] == ' ')
        v++, vn--;
    if ((p->has_data && !grow_add(&p->data, &p->n_data, &p->cap_data, "\n", 1, &oom)) ||
        !grow_add(&p->data, &p->n_data, &p->cap_data, v, vn, &oom))
        p->overflow = true;
    p->has_data = true;
    return oom ? LMS_ERR_NOMEM : 0;
}

int lms_sse_feed(lms_sse *p, const char *bytes, size_t n, lms_sse_fn on_data, void *ud)
{
    for (size_t i = 0; i < n; i++) {
        char c = bytes[i];
        if (p->cr && c == '\n') { /* the LF of a CRLF */
            p->cr = false;
            continue;
        }
        p->cr = c == '\r';
        if (c == '\r' || c == '\n') {
            if (p->line_over) { /* an overlong line: its event is flagged, not cut short */
                p->line_over = false;
                p->has_data = p->overflow = true;
                p->n_line = 0;
                continue;
            }
            int rc = sse_line(p, on_data, ud);
            p->n_line = 0;
            if (rc < 0)
                return rc;
            continue;
        }
        /* the run up to the next line end in one append */
        size_t k = i;
        while (k < n && bytes[k] != '\r' && bytes[k] != '\n')
            k++;
        bool oom = false;
        if (!p->line_over && !grow_add(&p->line, &p->n_line, &p->cap_line, bytes + i, k - i, &oom))
            p->line_over = true;
        if (oom)
            return LMS_ERR_NOMEM;
        i = k - 1;
    }
    return 0;
}

/* ---- payloads -------------------------------------------------------------------------- */

static const char *finish_static(const char *f)
{
    static const char *const known[] = {"stop", "length", "tool_calls", "content_filter",
                                        "function_call"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(f, known[i]))
            return known[i];
    return "stop";
}

static char *error_of(const json_t *root)
{
    const json_t *e = json_object_get(root, "error");
    const json_t *m = json_is_object(e) ? json_object_get(e, "message") : e;
    if (!json_is_string(m))
        m = json_object_get(root, "message");
    if (!json_is_string(m))
        m = json_object_get(root, "detail");
    if (json_is_string(m))
        return strdup(json_string_value(m));
    return e && !json_is_null(e) ? strdup("(no message)") : NULL;
}

void lms_remote_delta_free(lms_remote_delta *d)
{
    free(d->text);
    free(d->thought);
    free(d->error);
    for (int i = 0; i < d->n_calls; i++) {
        free(d->calls[i].name);
        free(d->calls[i].args);
    }
    free(d->calls);
    memset(d, 0, sizeof *d);
}

/* chat's tool_calls (of a delta or a message) into out->calls; < 0 when
 * out of memory. Arguments given as JSON other than a string (some
 * servers send the object) are taken as their text. */
static int parse_calls(const json_t *calls, lms_remote_delta *out)
{
    const size_t n = json_array_size(calls);
    if (n == 0)
        return 0;
    if (!(out->calls = calloc(n, sizeof *out->calls)))
        return LMS_ERR_NOMEM;
    size_t k;
    const json_t *c;
    json_array_foreach(calls, k, c)
    {
        lms_remote_call_piece *p = &out->calls[out->n_calls++];
        const json_t *ix = json_object_get(c, "index"), *fn = json_object_get(c, "function");
        const json_t *name = json_object_get(fn, "name"), *a = json_object_get(fn, "arguments");
        p->index = json_is_integer(ix) ? (int64_t)json_integer_value(ix) : (int64_t)k;
        if (json_is_string(name) && json_string_length(name) > 0 &&
            !(p->name = strdup(json_string_value(name))))
            return LMS_ERR_NOMEM;
        if (json_is_string(a))
            p->args = strndup(json_string_value(a), json_string_length(a));
        else if (a && !json_is_null(a))
            p->args = json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
        if (a && !json_is_null(a) && !p->args)
            return LMS_ERR_NOMEM;
        p->n_args = p->args ? strlen(p->args) : 0;
    }
    return 0;
}

int lms_remote_parse_chunk(const char *data, size_t n, bool chat, lms_remote_delta *out)
{
    memset(out, 0, sizeof *out);
    out->n_prompt = out->n_gen = -1;
    while (n && (data[n - 1] == ' ' || data[n - 1] == '\t'))
        n--;
    while (n && (data[0] == ' ' || data[0] == '\t'))
        data++, n--;
    if (n == 6 && !memcmp(data, "[DONE]", 6)) {
        out->done = true;
        return 0;
    }
    json_error_t je;
    json_t *root = json_loadb(data, n, JSON_ALLOW_NUL, &je);
    if (!json_is_object(root)) {
        json_decref(root);
        return LMS_ERR_FORMAT;
    }
    out->error = error_of(root);
    const json_t *c0 = json_array_get(json_object_get(root, "choices"), 0);
    const json_t *msg = json_object_get(c0, "delta");
    if (chat && !json_is_object(msg)) /* a full message */
        msg = json_object_get(c0, "message");
    const json_t *t = chat ? json_object_get(msg, "content") : json_object_get(c0, "text");
    const json_t *th = chat ? json_object_get(msg, "reasoning_content") : NULL;
    if (chat && !json_is_string(th))
        th = json_object_get(msg, "reasoning");
    if ((json_is_string(t) && json_string_length(t) > 0 &&
         !(out->text = strndup(json_string_value(t), json_string_length(t)))) ||
        (json_is_string(th) && json_string_length(th) > 0 &&
         !(out->thought = strndup(json_string_value(th), json_string_length(th))))) {
        json_decref(root);
        lms_remote_delta_free(out);
        return LMS_ERR_NOMEM;
    }
    out->n_text = out->text ? json_string_length(t) : 0;
    out->n_thought = out->thought ? json_string_length(th) : 0;
    if (chat && parse_calls(json_object_get(msg, "tool_calls"), out) < 0) {
        json_decref(root);
        lms_remote_delta_free(out);
        return LMS_ERR_NOMEM;
    }
    const json_t *f = json_object_get(c0, "finish_reason");
    if (json_is_string(f))
        out->finish = finish_static(json_string_value(f));
    const json_t *u = json_object_get(root, "usage");
    const json_t *pt = json_object_get(u, "prompt_tokens"), *ct = json_object_get(u, "completion_tokens");
    if (json_is_integer(pt) && json_integer_value(pt) >= 0)
        out->n_prompt = json_integer_value(pt);
    if (json_is_integer(ct) && json_integer_value(ct) >= 0)
        out->n_gen = json_integer_value(ct);
    json_decref(root);
    return 0;
}

char *lms_remote_error_message(const char *body, size_t n)
{
    json_error_t je;
    json_t *root = json_loadb(body, n, JSON_ALLOW_NUL, &je);
    char *m = json_is_object(root) ? error_of(root) : NULL;
    json_decref(root);
    return m;
}

/* ---- events ----------------------------------------------------------------------------- */

static lms_event *new_event(const rreq *q, int type)
{
    lms_event *ev = calloc(1, sizeof *ev);
    if (ev) {
        ev->type = type;
        ev->id = q->id;
        ev->user = q->user;
    }
    return ev;
}

/* A token event: a text piece of the reply (token 0) or a function call
 * (LMS_REMOTE_CALL). */
static void token_event(rreq *q, const char *text, size_t n, int32_t token)
{
    lms_event *ev = new_event(q, LMS_EV_TOKEN);
    if (!ev || !(ev->text = strndup(text, n))) {
        free(ev);
        return;
    }
    ev->text_len = n;
    ev->token = token;
    ev->prob = 1.0f;
    if (q->n_pieces++ == 0)
        q->t_first = lms_now_ms();
    q->cb(q->user, ev);
}

static void piece(rreq *q, const char *text, size_t n)
{
    token_event(q, text, n, 0);
}

/* Fails the request with a message (the first failure stays). */
static void stream_fail(rreq *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void stream_fail(rreq *q, const char *fmt, ...)
{
    char msg[240];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!q->stream_err)
        q->stream_err = strdup(msg);
}

/* Adds a piece of a function call to the call of its index. */
static void call_piece(rreq *q, const lms_remote_call_piece *p)
{
    bool oom = false;
    if (q->stream_err)
        return;
    if (p->index < 0 || p->index >= MAX_CALLS) {
        stream_fail(q, "tool call index %lld (at most %d calls are taken)",
                    (long long)p->index, MAX_CALLS);
        return;
    }
    if (!q->calls && !(q->calls = calloc(MAX_CALLS, sizeof *q->calls))) {
        stream_fail(q, "out of memory");
        return;
    }
    rcall *c = &q->calls[p->index];
    if (p->index >= q->n_calls)
        q->n_calls = (int)p->index + 1;
    if (p->name && !c->name && !(c->name = strdup(p->name)))
        oom = true;
    if (p->args && !grow_add(&c->args, &c->n_args, &c->cap_args, p->args, p->n_args, &oom) && !oom)
        stream_fail(q, "tool call %lld: its arguments are over %u bytes",
                    (long long)p->index, LMS_SSE_MAX);
    if (oom)
        stream_fail(q, "out of memory");
}

/* The calls put together, once the upstream has finished well: each
 * checked (a name, arguments that are a JSON object; none at all reads as
 * {}), then passed on after the text as LMS_REMOTE_CALL events. One that
 * fails the check fails the request, naming it; none is passed on then. */
static void pass_calls(rreq *q)
{
    json_t *calls = json_array();
    for (int i = 0; i < q->n_calls && !q->stream_err; i++) {
        const rcall *c = &q->calls[i];
        if (!c->name && !c->args) /* an index no piece used */
            continue;
        if (!c->name) {
            stream_fail(q, "tool call %d has no function name", i);
            break;
        }
        size_t k = 0;
        while (k < c->n_args && strchr(" \t\r\n", c->args[k]))
            k++;
        json_error_t je;
        json_t *a = k < c->n_args ? json_loadb(c->args, c->n_args, 0, &je) : json_object();
        if (!json_is_object(a)) {
            const bool cut = q->finish && !strcmp(q->finish, "length");
            stream_fail(q, "tool call %d ('%.48s'): its arguments are not a JSON object%s%.64s%s",
                        i, c->name, a ? "" : ": ", a ? "" : je.text,
                        cut ? " (cut at the length limit)" : "");
            json_decref(a);
            break;
        }
        if (json_array_append_new(calls, json_pack("{s:s, s:o}", "name", c->name, "arguments", a)))
            stream_fail(q, "out of memory");
    }
    if (!q->stream_err && json_array_size(calls) > 0 && q->thinking)
        piece(q, "\n</think>\n\n", 11), q->thinking = false;
    size_t i;
    const json_t *call;
    json_array_foreach(calls, i, call)
    {
        char *text = q->stream_err ? NULL : json_dumps(call, JSON_COMPACT);
        if (text)
            token_event(q, text, strlen(text), LMS_REMOTE_CALL);
        else if (!q->stream_err)
            stream_fail(q, "out of memory");
        free(text);
    }
    json_decref(calls);
}

static void on_data(void *ud, const char *d, size_t n, bool overflow)
{
    rreq *q = ud;
    lms_remote_delta dl;
    if (overflow || lms_remote_parse_chunk(d, n, q->chat, &dl) < 0) {
        if (!q->stream_err)
            q->stream_err = strdup(overflow ? "the upstream sent an event over 1 MiB"
                                            : "the upstream sent an event that is not JSON");
        return;
    }
    if (dl.error && !q->stream_err) {
        q->stream_err = dl.error;
        dl.error = NULL;
    }
    /* thoughts come as the model wrote them, in <think> ... </think>, so
     * that the serve layer takes them apart as it does a local model's */
    if (dl.thought && !q->thinking)
        piece(q, "<think>\n", 8), q->thinking = true;
    if (dl.thought)
        piece(q, dl.thought, dl.n_thought);
    if (dl.text && q->thinking)
        piece(q, "\n</think>\n\n", 11), q->thinking = false;
    if (dl.text)
        piece(q, dl.text, dl.n_text);
    for (int i = 0; i < dl.n_calls && q->tools; i++)
        call_piece(q, &dl.calls[i]);
    if (dl.finish)
        q->finish = dl.finish;
    if (dl.n_prompt >= 0)
        q->n_prompt = dl.n_prompt;
    if (dl.n_gen >= 0)
        q->n_gen = dl.n_gen;
    lms_remote_delta_free(&dl);
}

static size_t on_write(char *p, size_t size, size_t nmemb, void *ud)
{
    rreq *q = ud;
    size_t n = size * nmemb;
    if (q->status == 0) {
        const char *ct = NULL;
        curl_easy_getinfo(q->h, CURLINFO_RESPONSE_CODE, &q->status);
        curl_easy_getinfo(q->h, CURLINFO_CONTENT_TYPE, &ct);
        q->json_body = ct && !strncasecmp(ct, "application/json", 16);
    }
    bool ok = q->status >= 200 && q->status < 300;
    if (!ok || q->json_body) { /* an error body (for its message) or a whole answer */
        size_t cap = ok ? LMS_SSE_MAX : ERRBODY_MAX;
        size_t k = q->n_eb + n > cap ? cap - q->n_eb : n;
        char *nb = k ? realloc(q->eb, q->n_eb + k + 1) : q->eb;
        if (k && nb) {
            memcpy(nb + q->n_eb, p, k);
            q->n_eb += k;
            nb[q->n_eb] = '\0';
            q->eb = nb;
        }
        return n;
    }
    return lms_sse_feed(&q->sse, p, n, on_data, q) < 0 ? 0 : n;
}

/* "expert 'far' (http://h:1/v1): " */
static int prefix(const rreq *q, char *buf, size_t n)
{
    return snprintf(buf, n, "expert '%.64s' (%.100s): ", q->r->e->id, q->r->e->endpoint);
}

/* A whole JSON answer (json_body): its text as one piece, its finish
 * reason and usage, as if streamed. */
static void whole_answer(rreq *q)
{
    const char *data = q->eb ? q->eb : "";
    on_data(q, data, q->n_eb, q->n_eb >= LMS_SSE_MAX);
}

/* An upstream may quote the key it refused: never pass it on. */
static void scrub_key(const lms_expert_cfg *e, char *msg)
{
    size_t k = e->api_key ? strlen(e->api_key) : 0;
    char *p;
    while (k >= 4 && (p = strstr(msg, e->api_key)))
        memset(p, '*', k);
}

/* The END event of a request that finished (or was stopped: finish). */
static lms_event *end_event(const rreq *q, const char *finish)
{
    lms_event *ev = new_event(q, LMS_EV_END);
    if (!ev)
        return NULL;
    lms_req_stats *st = &ev->stats;
    st->n_prompt = q->n_prompt >= 0 ? (int32_t)q->n_prompt : 0;
    st->n_gen = (int32_t)(q->n_gen >= 0 ? q->n_gen : q->n_pieces);
    st->ttft_ms = q->n_pieces ? q->t_first - q->t0 : 0;
    st->total_ms = lms_now_ms() - q->t0;
    if (st->n_gen > 1 && st->total_ms > st->ttft_ms)
        st->tps = (st->n_gen - 1) * 1000.0 / (st->total_ms - st->ttft_ms);
    st->finish = finish;
    return ev;
}

/* The ERROR event of a failed transfer: what went wrong, after the
 * expert and its endpoint; `token` the upstream's status (0: none). */
static lms_event *error_event(const rreq *q, int res)
{
    lms_event *ev = new_event(q, LMS_EV_ERROR);
    if (!ev)
        return NULL;
    ev->err = LMS_ERR_IO;
    int k = prefix(q, ev->message, sizeof ev->message);
    char *m = k > 0 && (size_t)k < sizeof ev->message ? ev->message + k : ev->message;
    size_t left = sizeof ev->message - (size_t)(m - ev->message);
    bool ok_status = q->status >= 200 && q->status < 300;
    if (res == CURLE_OK && !ok_status) {
        char *em = q->eb ? lms_remote_error_message(q->eb, q->n_eb) : NULL;
        snprintf(m, left, "the upstream answered HTTP %ld%s%.160s", q->status,
                 em || q->n_eb ? ": " : "", em ? em : q->eb ? q->eb : "");
        for (char *c = m; *c; c++) /* a raw body may hold anything */
            if ((unsigned char)*c < 0x20)
                *c = ' ';
        free(em);
        ev->token = (int32_t)q->status;
    } else if (res == CURLE_OK || (res == CURLE_WRITE_ERROR && q->stream_err)) {
        snprintf(m, left, "the upstream failed: %.180s",
                 q->stream_err ? q->stream_err : "out of memory");
        ev->token = (int32_t)q->status;
    } else if (res == CURLE_OPERATION_TIMEDOUT) {
        snprintf(m, left, "no complete answer within %.0f s", q->timeout_ms / 1000.0);
        ev->err = LMS_ERR_BUSY;
    } else {
        snprintf(m, left, "cannot reach the upstream: %.160s",
                 q->curl_err[0] ? q->curl_err : curl_easy_strerror((CURLcode)res));
    }
    scrub_key(q->r->e, ev->message);
    return ev;
}

/* The request's terminal event (res: curl's result, < 0 when aborted),
 * the expert's counters, then q is freed. */
static void finish(rreq *q, int res)
{
    lms_remote *r = q->r;
    bool ok_status = q->status >= 200 && q->status < 300;
    if (res == CURLE_OK && q->json_body && ok_status)
        whole_answer(q);
    if (res == CURLE_OK && ok_status && !q->stream_err && q->n_calls)
        pass_calls(q);
    bool deadline = res == CURLE_OPERATION_TIMEDOUT && q->own_deadline && ok_status;
    lms_event *ev;
    if (res < 0)
        ev = end_event(q, "abort");
    else if (deadline)
        ev = end_event(q, "deadline");
    else if (res == CURLE_OK && ok_status && !q->stream_err)
        ev = end_event(q, q->finish && !strcmp(q->finish, "length") ? "length" : "stop");
    else
        ev = error_event(q, res);
    pthread_mutex_lock(&r->mu);
    r->st.n_requests++;
    if (!ev || ev->type == LMS_EV_ERROR)
        r->st.n_failed++;
    else if (res < 0)
        r->st.n_aborted++;
    else {
        r->st.prompt_tokens += (uint64_t)ev->stats.n_prompt;
        r->st.gen_tokens += (uint64_t)ev->stats.n_gen;
        r->st.last_tps = ev->stats.tps;
        r->st.last_ttft_ms = ev->stats.ttft_ms;
    }
    pthread_mutex_unlock(&r->mu);
    if (ev)
        q->cb(q->user, ev); /* out of memory: the event is lost, as the scheduler's would be */
    if (q->h) {
        curl_multi_remove_handle(r->multi, q->h);
        curl_easy_cleanup(q->h);
    }
    curl_slist_free_all(q->hdr);
    lms_sse_deinit(&q->sse);
    free(q->eb);
    free(q->stream_err);
    for (int i = 0; q->calls && i < q->n_calls; i++) {
        free(q->calls[i].name);
        free(q->calls[i].args);
    }
    free(q->calls);
    free(q->body);
    free(q);
}

/* ---- worker thread ------------------------------------------------------------------------ */

static int start(lms_remote *r, rreq *q)
{
    const lms_expert_cfg *e = r->e;
    char url[2200];
    snprintf(url, sizeof url, "%s/%s", e->endpoint, q->chat ? "chat/completions" : "completions");
    q->hdr = curl_slist_append(NULL, "Content-Type: application/json");
    q->hdr = q->hdr ? curl_slist_append(q->hdr, "Accept: text/event-stream") : NULL;
    if (q->hdr && e->api_key) {
        size_t n = strlen(e->api_key) + 32;
        char *auth = malloc(n);
        struct curl_slist *h = NULL;
        if (auth) {
            snprintf(auth, n, "Authorization: Bearer %s", e->api_key);
            h = curl_slist_append(q->hdr, auth);
            memset(auth, 0, n);
            free(auth);
        }
        if (!h) {
            curl_slist_free_all(q->hdr);
            q->hdr = NULL;
        }
    }
    if (!q->hdr || !(q->h = curl_easy_init()))
        return -1;
    CURL *h = q->h;
    long ms = (long)q->timeout_ms;
    curl_easy_setopt(h, CURLOPT_URL, url);
#if LIBCURL_VERSION_NUM >= 0x075500 /* 7.85 */
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(h, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, q->hdr);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, q->body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(q->body));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, q);
    curl_easy_setopt(h, CURLOPT_PRIVATE, q);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, q->curl_err);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, ms > 0 ? ms : 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, ms > 0 && ms < 10000 ? ms : 10000L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "lmserv");
    q->t0 = lms_now_ms();
    return curl_multi_add_handle(r->multi, h) == CURLM_OK ? 0 : -1;
}

/* Takes the new requests and the aborts; false once told to stop. */
static bool take_work(lms_remote *r)
{
    pthread_mutex_lock(&r->mu);
    rreq *in = r->incoming;
    r->incoming = NULL;
    size_t n_ab = r->n_aborts;
    uint64_t *ab = r->aborts;
    r->aborts = NULL;
    r->n_aborts = r->cap_aborts = 0;
    bool stop = r->stop;
    pthread_mutex_unlock(&r->mu);
    while (in) {
        rreq *q = in;
        in = q->next;
        if (start(r, q) < 0) {
            snprintf(q->curl_err, sizeof q->curl_err, "out of memory");
            finish(q, CURLE_OUT_OF_MEMORY);
            continue;
        }
        q->next = r->active;
        r->active = q;
    }
    for (size_t i = 0; i < n_ab; i++)
        for (rreq **pp = &r->active; *pp; pp = &(*pp)->next)
            if ((*pp)->id == ab[i]) {
                rreq *q = *pp;
                *pp = q->next;
                finish(q, -1);
                break;
            }
    free(ab);
    return !stop;
}

static void count_running(lms_remote *r)
{
    int32_t n = 0;
    for (const rreq *q = r->active; q; q = q->next)
        n++;
    pthread_mutex_lock(&r->mu);
    r->st.n_running = n;
    pthread_mutex_unlock(&r->mu);
}

static void *worker(void *arg)
{
    lms_remote *r = arg;
    while (take_work(r)) {
        int running = 0, left = 0;
        count_running(r);
        curl_multi_perform(r->multi, &running);
        CURLMsg *m;
        while ((m = curl_multi_info_read(r->multi, &left))) {
            if (m->msg != CURLMSG_DONE)
                continue;
            CURLcode res = m->data.result;
            for (rreq **pp = &r->active; *pp; pp = &(*pp)->next)
                if ((*pp)->h == m->easy_handle) {
                    rreq *q = *pp;
                    *pp = q->next;
                    finish(q, (int)res); /* removes the handle: m is not used again */
                    break;
                }
        }
        count_running(r);
        curl_multi_poll(r->multi, NULL, 0, 1000, NULL);
    }
    while (r->active) { /* stopping: every request ends "abort" */
        rreq *q = r->active;
        r->active = q->next;
        finish(q, -1);
    }
    return NULL;
}

/* ---- API -------------------------------------------------------------------------------- */

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static CURLcode g_curl_init;

static void curl_init_once(void)
{
    g_curl_init = curl_global_init(CURL_GLOBAL_DEFAULT);
}

int lms_remote_create(const lms_expert_cfg *e, lms_remote **out, char *err, size_t errsz)
{
    pthread_once(&g_curl_once, curl_init_once);
    if (g_curl_init != CURLE_OK)
        return lms_errf(err, errsz, LMS_ERR_IO, "libcurl cannot start: %s",
                        curl_easy_strerror(g_curl_init));
    lms_remote *r = calloc(1, sizeof *r);
    if (!r || !(r->multi = curl_multi_init())) {
        free(r);
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory");
    }
    r->e = e;
    pthread_mutex_init(&r->mu, NULL);
    if (pthread_create(&r->th, NULL, worker, r) != 0) {
        lms_remote_destroy(r);
        return lms_errf(err, errsz, LMS_ERR_IO, "cannot start the thread of expert '%s'", e->id);
    }
    r->started = true;
    *out = r;
    return 0;
}

void lms_remote_destroy(lms_remote *r)
{
    if (!r)
        return;
    if (r->started) {
        pthread_mutex_lock(&r->mu);
        r->stop = true;
        pthread_mutex_unlock(&r->mu);
        curl_multi_wakeup(r->multi);
        pthread_join(r->th, NULL);
    }
    while (r->incoming) { /* submitted after the worker's last look */
        rreq *q = r->incoming;
        r->incoming = q->next;
        finish(q, -1);
    }
    free(r->aborts);
    curl_multi_cleanup(r->multi);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* The upstream body: the caller's with "model", "stream" and
 * stream_options.include_usage set; *tools: it has tools. */
static char *upstream_body(const lms_remote *r, const char *body, size_t n, bool *tools)
{
    json_error_t je;
    json_t *o = json_loadb(body, n, 0, &je);
    char *s = NULL;
    if (json_is_object(o) &&
        json_object_set_new(o, "model", json_string(r->e->remote_model)) == 0 &&
        json_object_set_new(o, "stream", json_true()) == 0 &&
        json_object_set_new(o, "stream_options", json_pack("{s:b}", "include_usage", 1)) == 0)
        s = json_dumps(o, JSON_COMPACT);
    *tools = json_array_size(json_object_get(o, "tools")) > 0;
    json_decref(o);
    return s;
}

int lms_remote_submit(lms_remote *r, const lms_remote_request *q, uint64_t *id, char *err,
                      size_t errsz)
{
    rreq *x = calloc(1, sizeof *x);
    if (!x)
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory");
    if (!(x->body = upstream_body(r, q->body, q->n_body, &x->tools))) {
        free(x);
        return lms_errf(err, errsz, LMS_ERR_INVAL, "the request for expert '%s' is not a JSON "
                        "object", r->e->id);
    }
    x->r = r;
    x->chat = q->chat;
    x->cb = q->cb;
    x->user = q->user;
    x->timeout_ms = r->e->timeout_s * 1000.0;
    if (q->timeout_ms > 0 && q->timeout_ms < x->timeout_ms) {
        x->timeout_ms = q->timeout_ms;
        x->own_deadline = true;
    }
    x->n_prompt = x->n_gen = -1;
    lms_sse_init(&x->sse);
    x->id = REMOTE_ID_BASE + __atomic_add_fetch(&g_next_id, 1, __ATOMIC_RELAXED);
    *id = x->id; /* before the hand-off: from then on the worker owns (and may free) x */
    pthread_mutex_lock(&r->mu);
    x->next = r->incoming;
    r->incoming = x;
    pthread_mutex_unlock(&r->mu);
    curl_multi_wakeup(r->multi);
    return 0;
}

void lms_remote_abort(lms_remote *r, uint64_t id)
{
    pthread_mutex_lock(&r->mu);
    if (r->n_aborts == r->cap_aborts) {
        size_t cap = r->cap_aborts ? r->cap_aborts * 2 : 16;
        uint64_t *na = realloc(r->aborts, cap * sizeof *na);
        if (!na) { /* out of memory: it runs to its end, unread */
            pthread_mutex_unlock(&r->mu);
            return;
        }
        r->aborts = na;
        r->cap_aborts = cap;
    }
    r->aborts[r->n_aborts++] = id;
    pthread_mutex_unlock(&r->mu);
    curl_multi_wakeup(r->multi);
}

void lms_remote_get_stats(lms_remote *r, lms_remote_stats *out)
{
    pthread_mutex_lock(&r->mu);
    *out = r->st;
    pthread_mutex_unlock(&r->mu);
}
