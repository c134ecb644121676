/*
 * ws.c - WebSocket connections at /ws (RFC 6455 through libwebsockets):
 * admission (path, API key, shutdown), message reassembly within the frame
 * limit, and dispatch to one of the two dialects by the message's first
 * key, "op" (ws_op.c) or "type" (ws_type.c). See docs/DESIGN.md.
 *
 * lws does the framing: fragmentation, masking, ping/pong, close codes,
 * and (LWS_SERVER_OPTION_VALIDATE_UTF8) closes with 1007 on text that is
 * not UTF-8. What remains hostile here is the content: oversized messages
 * (error, then close 1009), binary messages, bad JSON, wrong types, and
 * unknown operations, each answered with an error message in the
 * connection's dialect; the connection stays open unless it must not.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "serve/serve_int.h"

/* ---- admission ------------------------------------------------------------------- */

/* Writes a plain HTTP refusal on the not-yet-upgraded socket. */
static int refuse(conn *c, int status, const char *reason, const char *msg)
{
    reqerr e;
    reqerr_set(&e, status, NULL, "%s", msg);
    json_t *j = reqerr_json(&e);
    size_t n = 0;
    char *body = json_dump_compact(j, &n);
    json_decref(j);
    sbuf b = {0};
    char pre[LWS_PRE];
    memset(pre, 0, sizeof pre);
    sbuf_add(&b, pre, sizeof pre);
    sbuf_addf(&b, "HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %zu\r\n"
              "%sconnection: close\r\n\r\n%s", status, reason, n,
              status == 401 ? "www-authenticate: Bearer\r\n" : "", body ? body : "");
    free(body);
    if (!b.oom && b.n > LWS_PRE)
        lws_write(c->wsi, (unsigned char *)b.p + LWS_PRE, b.n - LWS_PRE, LWS_WRITE_HTTP);
    sbuf_free(&b);
    if (status < 600)
        c->srv->met.http_by_code[status]++;
    return 1;
}

static bool ws_authorized(conn *c)
{
    lms_server *s = c->srv;
    if (!s->api_key)
        return true;
    char buf[512];
    int n = lws_hdr_copy(c->wsi, buf, sizeof buf, WSI_TOKEN_HTTP_AUTHORIZATION);
    if (n > 7 && strncasecmp(buf, "Bearer ", 7) == 0) {
        const char *k = buf + 7;
        while (*k == ' ')
            k++;
        if (server_key_ok(s, k, strlen(k)))
            return true;
    }
    const char *q = lws_get_urlarg_by_name(c->wsi, "api_key=", buf, sizeof buf);
    return q && server_key_ok(s, q, strlen(q));
}

int ws_filter(conn *c)
{
    char path[256] = "";
    if (lws_hdr_copy(c->wsi, path, sizeof path, WSI_TOKEN_GET_URI) <= 0 ||
        (strcmp(path, "/ws") != 0 && strcmp(path, "/ws/") != 0))
        return refuse(c, 404, "Not Found", "WebSocket connections go to /ws");
    if (c->srv->state == SRV_DRAINING)
        return refuse(c, 503, "Service Unavailable", "the server is shutting down");
    if (!ws_authorized(c))
        return refuse(c, 401, "Unauthorized",
                      "a valid API key is required (Authorization: Bearer KEY or ?api_key=KEY)");
    return 0;
}

int ws_on_open(conn *c)
{
    c->role = CONN_WS;
    c->srv->n_ws++;
    ws_op_hello(c);
    return 0;
}

/* ---- messages ------------------------------------------------------------------------ */

void ws_send_error(conn *c, const char *session_id, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *o = json_object();
    if (c->dialect != DIALECT_TYPE)
        json_object_set_new(o, "op", json_string("error"));
    if (c->dialect != DIALECT_OP)
        json_object_set_new(o, "type", json_string("error"));
    json_object_set_new(o, "message", json_string_lossy(msg, strlen(msg)));
    if (session_id)
        json_object_set_new(o, "session_id", json_string_lossy(session_id, strlen(session_id)));
    conn_out_ws_json(c, o);
}

/* "op" or "type", whichever key comes first; DIALECT_NONE if neither. */
static int dialect_of(json_t *msg)
{
    const char *key;
    json_t *v;
    json_object_foreach(msg, key, v)
    {
        if (!strcmp(key, "op"))
            return DIALECT_OP;
        if (!strcmp(key, "type"))
            return DIALECT_TYPE;
    }
    return DIALECT_NONE;
}

static void on_message(conn *c, const char *p, size_t n)
{
    if (c->rx_binary) {
        ws_send_error(c, NULL, "binary messages are not supported: send JSON as text");
        return;
    }
    json_error_t je;
    json_t *msg = json_loadb(p ? p : "", n, 0, &je);
    if (!msg) {
        ws_send_error(c, NULL, "invalid JSON at line %d, column %d: %s", je.line, je.column,
                      je.text);
        return;
    }
    int d = json_is_object(msg) ? dialect_of(msg) : DIALECT_NONE;
    if (!json_is_object(msg))
        ws_send_error(c, NULL, "a message must be a JSON object");
    else if (d == DIALECT_NONE)
        ws_send_error(c, NULL, "a message needs an \"op\" or a \"type\" field");
    else {
        c->dialect = d;
        if (d == DIALECT_OP)
            ws_op_handle(c, msg);
        else
            ws_type_handle(c, msg);
    }
    json_decref(msg);
}

int ws_on_receive(conn *c, const void *in, size_t len)
{
    lms_server *s = c->srv;
    if (!c->rx_active) {
        c->rx_active = true;
        c->rx.n = 0;
        c->rx_binary = lws_frame_is_binary(c->wsi);
        c->rx_too_big = false;
    }
    if (!c->rx_too_big && c->rx.n + len > s->p.max_frame_bytes) {
        c->rx_too_big = true;
        sbuf_free(&c->rx);
    }
    if (!c->rx_too_big && sbuf_add(&c->rx, in, len) < 0)
        c->rx_too_big = true;
    if (!lws_is_final_fragment(c->wsi) || lws_remaining_packet_payload(c->wsi) > 0)
        return 0;
    c->rx_active = false;
    s->met.ws_messages_in++;
    if (c->rx_too_big) {
        ws_send_error(c, NULL, "the message is over the limit of %zu bytes", s->p.max_frame_bytes);
        c->close_code = LWS_CLOSE_STATUS_MESSAGE_TOO_LARGE;
        conn_want_write(c);
        return 0;
    }
    on_message(c, c->rx.p, c->rx.n);
    if (c->rx.cap > (64u << 10))
        sbuf_free(&c->rx);
    return 0;
}

int ws_on_writable(conn *c)
{
    if (conn_flush(c) < 0)
        return -1;
    if (c->close_code && conn_idle_out(c)) {
        lws_close_reason(c->wsi, (enum lws_close_status)c->close_code, NULL, 0);
        return -1;
    }
    return 0;
}
