/*
 * http.c - HTTP/1.1 transactions on libwebsockets: routing, limits and
 * authentication, the request body, and the response framing (a complete
 * body with Content-Length, or a chunked stream for SSE).
 *
 * One transaction at a time per connection (lws holds pipelined requests
 * until lws_http_transaction_completed):
 *
 *   IDLE --request--> BODY --complete--> RUNNING --reply--> DONE --flushed--> IDLE
 *     |                 |                    \--stream_begin--> STREAM --end--> DONE
 *     \--GET/error-----/--------------------------------------------------------^
 *
 * An error found before the body has arrived (unknown path, missing key,
 * declared length over the limit) is answered at once; lws then discards
 * the rest of the body before reading the next request. A body that keeps
 * growing past the limit without a declared length closes the connection
 * after the 413.
 *
 * Headers are formatted with lws's helpers into the connection's output
 * queue and go out with the body through conn_flush; lws's own
 * "no content length means close" rule is bypassed so that streams can be
 * chunked and the connection kept alive.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "serve/serve_int.h"

typedef struct route {
    const char *path;
    bool prefix;               /* path is a prefix (the rest is an argument) */
    bool is_public;            /* no API key needed */
    int (*get)(conn *c);
    int (*post)(conn *c, json_t *body);
    int (*del)(conn *c);       /* DELETE, or NULL */
} route;

static int get_models(conn *c)
{
    return api_models(c, NULL);
}

static int get_model(conn *c)
{
    const char *id = c->txn.path + strlen("/v1/models/");
    return api_models(c, id[0] ? id : NULL); /* "/v1/models/" lists them */
}

static int get_response(conn *c)
{
    return api_responses_get(c, c->txn.path + strlen("/v1/responses/"), false);
}

static int delete_response(conn *c)
{
    return api_responses_get(c, c->txn.path + strlen("/v1/responses/"), true);
}

static int get_ws(conn *c)
{
    reqerr e;
    reqerr_set(&e, 400, NULL, "/ws is a WebSocket endpoint: connect with a WebSocket client");
    return http_reply_err(c, &e);
}

/* The playground and dashboard page (web/index.html, compiled in). */
extern const unsigned char lms_web_index[];
extern const size_t lms_web_index_len;

static int get_index(conn *c)
{
    if (c->srv->p.no_web) {
        reqerr e;
        reqerr_set(&e, 404, NULL, "the web page is off (--no-webui)");
        return http_reply_err(c, &e);
    }
    return http_reply(c, 200, "text/html; charset=utf-8", (const char *)lms_web_index,
                      lms_web_index_len);
}

static const route routes[] = {
    {"/", false, true, get_index, NULL, NULL},
    {"/health", false, true, api_health, NULL, NULL},
    {"/stats", false, false, api_stats, NULL, NULL},
    {"/metrics", false, false, api_metrics, NULL, NULL},
    {"/v1/models", false, false, get_models, NULL, NULL},
    {"/v1/models/", true, false, get_model, NULL, NULL},
    {"/v1/chat/completions", false, false, NULL, api_chat, NULL},
    {"/chat/completions", false, false, NULL, api_chat, NULL},
    {"/v1/completions", false, false, NULL, api_completions, NULL},
    {"/v1/responses", false, false, NULL, api_responses, NULL},
    {"/v1/responses/", true, false, get_response, NULL, delete_response},
    {"/v1/messages", false, false, NULL, api_anthropic_messages, NULL},
    {"/v1/messages/count_tokens", false, false, NULL, api_anthropic_count, NULL},
    {"/completions", false, false, NULL, api_completions, NULL},
    {"/v1/embeddings", false, false, NULL, api_embeddings, NULL},
    {"/embeddings", false, false, NULL, api_embeddings, NULL},
    {"/embedding", false, false, NULL, api_embedding_native, NULL},
    {"/v1/rerank", false, false, NULL, api_rerank, NULL},
    {"/rerank", false, false, NULL, api_rerank, NULL},
    {"/v1/reranking", false, false, NULL, api_rerank, NULL},
    {"/reranking", false, false, NULL, api_rerank, NULL},
    {"/completion", false, false, NULL, api_native_completion, NULL},
    {"/infill", false, false, NULL, api_native_infill, NULL},
    {"/props", false, false, api_props, NULL, NULL},
    {"/slots", false, false, api_slots, NULL, NULL},
    {"/apply-template", false, false, NULL, api_apply_template, NULL},
    {"/tokenize", false, false, NULL, api_tokenize, NULL},
    {"/detokenize", false, false, NULL, api_detokenize, NULL},
    {"/api/chat", false, false, NULL, api_ollama_chat, NULL},
    {"/api/generate", false, false, NULL, api_ollama_generate, NULL},
    {"/api/show", false, false, NULL, api_ollama_show, NULL},
    {"/api/embed", false, false, NULL, api_ollama_embed, NULL},
    {"/api/embeddings", false, false, NULL, api_ollama_embeddings, NULL},
    {"/api/tags", false, false, api_ollama_tags, NULL, NULL},
    {"/api/ps", false, false, api_ollama_ps, NULL, NULL},
    {"/api/version", false, true, api_ollama_version, NULL, NULL},
    {"/api/pull", false, false, NULL, api_ollama_pull, NULL},
    {"/api/push", false, false, NULL, api_ollama_unsupported, NULL},
    {"/api/create", false, false, NULL, api_ollama_unsupported, NULL},
    {"/api/copy", false, false, NULL, api_ollama_unsupported, NULL},
    {"/lora-adapters", false, false, api_lora_list, api_lora_scales, NULL},
    {"/lora-adapters/load", false, false, NULL, api_lora_load, NULL},
    {"/lora-adapters/unload", false, false, NULL, api_lora_unload, NULL},
    {"/ws", false, false, get_ws, NULL, NULL},
};
#define N_ROUTES ((int)(sizeof routes / sizeof routes[0]))

static int find_route(const char *path)
{
    for (int i = 0; i < N_ROUTES; i++) {
        const route *r = &routes[i];
        size_t n = strlen(r->path);
        if (r->prefix ? strncmp(path, r->path, n) == 0 : strcmp(path, r->path) == 0)
            return i;
    }
    return -1;
}

/* ---- response framing ----------------------------------------------------------- */

static int put_headers(conn *c, int status, const char *ctype, int64_t len, const char *extra)
{
    struct lws *wsi = c->wsi;
    http_txn *t = &c->txn;
    unsigned char buf[1024], *p = buf, *end = buf + sizeof buf;
    if (len < 0 && t->http10)
        t->close_after = true; /* HTTP/1.0: the end of the body is the close */
    t->chunked = len < 0 && !t->http10;
    if (lws_add_http_header_status(wsi, (unsigned)status, &p, end) ||
        lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CONTENT_TYPE, (const unsigned char *)ctype,
                                     (int)strlen(ctype), &p, end) ||
        (len >= 0 && lws_add_http_header_content_length(wsi, (lws_filepos_t)len, &p, end)) ||
        (t->chunked &&
         lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_TRANSFER_ENCODING,
                                      (const unsigned char *)"chunked", 7, &p, end)) ||
        (t->close_after && lws_add_http_header_by_token(wsi, WSI_TOKEN_CONNECTION,
                                                        (const unsigned char *)"close", 5, &p,
                                                        end)) ||
        lws_add_http_header_by_name(wsi, (const unsigned char *)"access-control-allow-origin:",
                                    (const unsigned char *)"*", 1, &p, end) ||
        (len < 0 && lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CACHE_CONTROL,
                                                 (const unsigned char *)"no-cache", 8, &p, end)))
        return -1;
    if (extra) {
        size_t n = strlen(extra);
        if ((size_t)(end - p) < n + 8)
            return -1;
        memcpy(p, extra, n);
        p += n;
    }
    if (lws_finalize_http_header(wsi, &p, end))
        return -1;
    if (status >= 100 && status < 600)
        c->srv->met.http_by_code[status]++;
    t->status = status;
    return conn_out_raw(c, buf, (size_t)(p - buf));
}

static int reply_full(conn *c, int status, const char *ctype, const char *body, size_t n,
                      const char *extra)
{
    http_txn *t = &c->txn;
    if (t->state == TXN_DONE || t->state == TXN_STREAM)
        return 0; /* one response per transaction */
    t->state = TXN_DONE;
    /* a HEAD answer has the headers alone (RFC 9110 9.3.2): a body after
     * them would be read as the next response on a kept-alive connection */
    if (put_headers(c, status, ctype, (int64_t)n, extra) < 0 ||
        (t->method != LWSHUMETH_HEAD && conn_out_raw(c, body, n) < 0))
        return -1;
    return 0;
}

int http_reply(conn *c, int status, const char *ctype, const char *body, size_t n)
{
    return reply_full(c, status, ctype, body, n, NULL);
}

int http_reply_json(conn *c, int status, json_t *j)
{
    size_t n = 0;
    char *s = j ? json_dump_compact(j, &n) : NULL;
    json_decref(j);
    if (!s) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                  "\"server_error\",\"param\":null,\"code\":null}}";
        return http_reply(c, 500, "application/json", oom, sizeof oom - 1);
    }
    int rc = http_reply(c, status, "application/json", s, n);
    free(s);
    return rc;
}

int http_reply_err(conn *c, const reqerr *e)
{
    const char *extra = e->status == 401 ? "www-authenticate: Bearer\x0d\x0a" : NULL;
    /* every error of Anthropic's endpoints in its shape, those raised
     * before the handler runs (401, 413, broken JSON...) too */
    json_t *j = api_anthropic_path(c->txn.path) ? api_anthropic_error(e) : reqerr_json(e);
    size_t n = 0;
    char *s = json_dump_compact(j, &n);
    json_decref(j);
    int rc = s ? reply_full(c, e->status, "application/json", s, n, extra) : -1;
    free(s);
    return rc;
}

int http_stream_begin(conn *c, int status, const char *ctype)
{
    http_txn *t = &c->txn;
    if (t->state != TXN_RUNNING)
        return -1;
    t->state = TXN_STREAM;
    return put_headers(c, status, ctype, -1, NULL);
}

int http_stream_write(conn *c, const char *p, size_t n)
{
    if (c->txn.state != TXN_STREAM || n == 0 || c->txn.method == LWSHUMETH_HEAD)
        return c->txn.state == TXN_STREAM ? 0 : -1;
    if (!c->txn.chunked)
        return conn_out_raw(c, p, n);
    char hdr[24];
    int k = snprintf(hdr, sizeof hdr, "%zx\x0d\x0a", n);
    if (conn_out_raw(c, hdr, (size_t)k) < 0 || conn_out_raw(c, p, n) < 0)
        return -1;
    return conn_out_raw(c, "\x0d\x0a", 2);
}

/* One server-sent event: "data: " and j's compact JSON (steals j). */
int http_sse_json(conn *c, json_t *j)
{
    size_t n;
    char *s = j ? json_dump_compact(j, &n) : NULL;
    json_decref(j);
    if (!s)
        return -1;
    sbuf b = {0};
    sbuf_adds(&b, "data: ");
    sbuf_add(&b, s, n);
    sbuf_adds(&b, "\n\n");
    free(s);
    int rc = b.oom ? -1 : http_stream_write(c, b.p, b.n);
    sbuf_free(&b);
    return rc;
}

/* One named server-sent event: "event: TYPE", then o as http_sse_json
 * sends it (steals o). Anthropic's messages and Responses type each
 * event this way; one writer keeps their framing the same. */
int http_sse_event(conn *c, const char *type, json_t *o)
{
    char head[128];
    snprintf(head, sizeof head, "event: %s\n", type);
    http_stream_write(c, head, strlen(head));
    return http_sse_json(c, o);
}

int http_stream_end(conn *c)
{
    if (c->txn.state != TXN_STREAM)
        return -1;
    c->txn.state = TXN_DONE;
    if (c->txn.chunked && c->txn.method != LWSHUMETH_HEAD)
        return conn_out_raw(c, "0\x0d\x0a\x0d\x0a", 5);
    conn_want_write(c);
    return 0;
}

/* ---- request ------------------------------------------------------------------------ */

static void txn_reset(conn *c)
{
    http_txn *t = &c->txn;
    sbuf_free(&t->body);
    memset(t, 0, sizeof *t);
    t->route = -1;
}

static bool authorized(conn *c)
{
    lms_server *s = c->srv;
    if (!s->api_key)
        return true;
    char buf[512];
    /* Anthropic's clients send the key as x-api-key */
    int n = lws_hdr_custom_copy(c->wsi, buf, sizeof buf, "x-api-key:", 10);
    if (n > 0 && server_key_ok(s, buf, (size_t)n))
        return true;
    n = lws_hdr_copy(c->wsi, buf, sizeof buf, WSI_TOKEN_HTTP_AUTHORIZATION);
    if (n < 8 || strncasecmp(buf, "Bearer ", 7) != 0)
        return false;
    const char *k = buf + 7;
    while (*k == ' ')
        k++;
    return server_key_ok(s, k, strlen(k));
}

static int refuse(conn *c, int status, const char *code, const char *msg)
{
    reqerr e;
    reqerr_set(&e, status, NULL, "%s", msg);
    e.code = code;
    c->txn.discard = true; /* any body is ignored */
    return http_reply_err(c, &e);
}

/* Checks the declared body length; a refusal has been queued when false. */
static bool body_length_ok(conn *c)
{
    lms_server *s = c->srv;
    char buf[32];
    if (lws_hdr_copy(c->wsi, buf, sizeof buf, WSI_TOKEN_HTTP_CONTENT_LENGTH) <= 0) {
        /* lws would wait for a body it cannot delimit (chunked uploads are
         * not decoded by lws 4.1): refuse and close */
        c->txn.close_after = true;
        refuse(c, 411, "length_required", "a request body needs a Content-Length header");
        return false;
    }
    unsigned long long n = strtoull(buf, NULL, 10);
    if (n <= s->p.max_body_bytes)
        return true;
    if (n / 16 > s->p.max_body_bytes)
        c->txn.close_after = true; /* not worth reading to discard */
    char msg[128];
    snprintf(msg, sizeof msg, "the request body has %llu bytes; the limit is %zu", n,
             s->p.max_body_bytes);
    refuse(c, 413, "request_too_large", msg);
    return false;
}

static int dispatch(conn *c, int method)
{
    http_txn *t = &c->txn;
    const route *r = &routes[t->route];
    if (method == LWSHUMETH_OPTIONS) {
        t->discard = true;
        return reply_full(c, 204, "text/plain", "", 0,
                          "access-control-allow-methods: GET, POST, DELETE, OPTIONS\x0d\x0a"
                          "access-control-allow-headers: authorization, content-type, x-api-key, "
                          "anthropic-version\x0d\x0a");
    }
    if (method == LWSHUMETH_HEAD && r->get)
        method = LWSHUMETH_GET; /* the same answer; reply_full leaves out its body */
    if ((method == LWSHUMETH_GET && !r->get) || (method == LWSHUMETH_POST && !r->post) ||
        (method == LWSHUMETH_DELETE && !r->del) ||
        (method != LWSHUMETH_GET && method != LWSHUMETH_POST && method != LWSHUMETH_DELETE))
        return refuse(c, 405, "method_not_allowed",
                      r->get ? "this endpoint takes GET" : "this endpoint takes POST");
    if (!r->is_public && !authorized(c))
        return refuse(c, 401, "invalid_api_key",
                      "a valid API key is required (Authorization: Bearer KEY)");
    if (method == LWSHUMETH_GET)
        return r->get(c);
    if (method == LWSHUMETH_DELETE) {
        t->discard = true; /* a body, if any, is not read */
        return r->del(c);
    }
    if (body_length_ok(c))
        t->state = TXN_BODY;
    return 0;
}

/* Whether lws reads a body for the request: its rule is a Content-Length
 * above 0, whatever the method (one too long to copy counts). */
static bool has_body(conn *c)
{
    char cl[64];
    int n = lws_hdr_copy(c->wsi, cl, sizeof cl, WSI_TOKEN_HTTP_CONTENT_LENGTH);
    return n < 0 || (n > 0 && atoll(cl) > 0);
}

int http_on_request(conn *c, const char *uri)
{
    lms_server *s = c->srv;
    if (lws_get_network_wsi(c->wsi) != c->wsi) {
        /* an h2 stream (h2c upgrade): our framing is HTTP/1.1 only */
        lws_return_http_status(c->wsi, 505, NULL);
        return -1;
    }
    txn_reset(c);
    http_txn *t = &c->txn;
    t->state = TXN_RUNNING;
    char ver[16] = "";
    lws_hdr_copy(c->wsi, ver, sizeof ver, WSI_TOKEN_HTTP);
    t->http10 = strcmp(ver, "HTTP/1.0") == 0;
    snprintf(t->path, sizeof t->path, "%s", uri ? uri : "/");
    char *uri_ptr;
    int uri_len;
    int method = lws_http_get_uri_and_method(c->wsi, &uri_ptr, &uri_len);
    t->method = method;
    /* A request with a body that lws 4.1 parses from input it had already
     * read (pipelined behind an earlier request) goes through its body loop
     * over that same buffer: the body it hands over starts with the
     * request's own first line, and past the buffer's end it reads memory
     * it has freed. lws then has buffered input waiting for service, which
     * a request read fresh from the socket does not leave (only another
     * client pipelining at that very moment could make one look so). It
     * cannot be answered safely: the connection closes, as HTTP lets a
     * server do with pipelined requests it has not answered. */
    if (c->n_done > 0 && has_body(c) && lws_service_adjust_timeout(s->ctx, 1, 0) == 0)
        return -1;
    if (s->state == SRV_DRAINING) {
        t->close_after = true;
        return refuse(c, 503, "shutting_down", "the server is shutting down");
    }
    t->route = find_route(t->path);
    if (t->route < 0)
        return refuse(c, 404, "not_found", "no such endpoint");
    return dispatch(c, method);
}

int http_on_body(conn *c, const void *p, size_t n)
{
    http_txn *t = &c->txn;
    if (t->discard || t->state != TXN_BODY)
        return 0;
    if (t->body.n + n > c->srv->p.max_body_bytes) {
        sbuf_free(&t->body);
        t->close_after = true; /* no declared length to skip by */
        char msg[96];
        snprintf(msg, sizeof msg, "the request body is over the limit of %zu bytes",
                 c->srv->p.max_body_bytes);
        t->state = TXN_RUNNING;
        return refuse(c, 413, "request_too_large", msg);
    }
    if (sbuf_add(&t->body, p, n) < 0) {
        t->state = TXN_RUNNING;
        return refuse(c, 503, NULL, "out of memory");
    }
    return 0;
}

int http_on_body_done(conn *c)
{
    http_txn *t = &c->txn;
    if (t->discard || t->state != TXN_BODY) {
        /* lws 4.1 calls this again on every read of the connection until the
         * transaction completes: once a service pass, harmless. But with the
         * next request already buffered behind the body (pipelining),
         * lws_http_action loops over that buffer without end, calling this
         * each time and never returning to poll: the whole server hung there.
         * Several calls in one pass are that loop, and the only way out of it
         * is to close the connection, after sending what is ready. */
        if (t->done_pass != c->srv->n_pass) {
            t->done_pass = c->srv->n_pass;
            t->done_repeats = 0;
        }
        if (++t->done_repeats < 4)
            return 0;
        conn_flush(c);
        return -1;
    }
    t->state = TXN_RUNNING;
    lws_set_timeout(c->wsi, NO_PENDING_TIMEOUT, 0); /* generation may take a while */
    reqerr e;
    json_t *body = NULL;
    size_t lead = 0;
    while (lead < t->body.n && strchr(" \t\r\n", t->body.p[lead]))
        lead++;
    int rc;
    /* llama-server's POST /lora-adapters sends a bare array: it reaches the
     * handler as {"lora": array} */
    if (routes[t->route].post == api_lora_scales && lead < t->body.n && t->body.p[lead] == '[') {
        json_error_t je;
        json_t *arr = json_loadb(t->body.p, t->body.n, 0, &je);
        rc = arr ? 0 : reqerr_set(&e, 400, NULL, "invalid JSON at line %d, column %d: %s",
                                  je.line, je.column, je.text);
        if (arr)
            body = json_pack("{s:o}", "lora", arr);
    } else {
        rc = reqparse_body(t->body.p, t->body.n, &body, &e);
    }
    sbuf_free(&t->body);
    if (rc < 0)
        return http_reply_err(c, &e);
    rc = routes[t->route].post(c, body);
    json_decref(body);
    return rc;
}

int http_on_writable(conn *c)
{
    if (conn_flush(c) < 0)
        return -1;
    http_txn *t = &c->txn;
    if (t->state != TXN_DONE || !conn_idle_out(c))
        return 0;
    bool close = t->close_after;
    txn_reset(c);
    if (close)
        return -1;
    c->n_done++;
    return lws_http_transaction_completed(c->wsi) ? -1 : 0;
}
