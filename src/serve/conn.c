/*
 * conn.c - one accepted socket for its whole life (HTTP transactions, then
 * perhaps a WebSocket): its tasks and its output queue.
 *
 * A conn is created at LWS_CALLBACK_SERVER_NEW_CLIENT_INSTANTIATED and
 * freed at LWS_CALLBACK_WSI_DESTROY; lws keeps the pointer as the wsi's opaque user
 * data. Output is only ever queued here; bytes reach the socket in
 * conn_flush, called from the writable callback, writing while the socket
 * takes them (lws_send_pipe_choked) and asking for another callback when
 * it does not.
 *
 * Back-pressure: a client that stops reading while tokens keep coming
 * would grow the queue without bound. Past MAX_PENDING_OUT the connection
 * is closed (its requests are aborted like any other close).
 */
#include <stdlib.h>
#include <string.h>

#include "serve/serve_int.h"

#define MAX_PENDING_OUT (8u << 20)
#define WRITE_SLICE 16384

conn *conn_create(lms_server *s, struct lws *wsi)
{
    conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->srv = s;
    c->wsi = wsi;
    c->cid = ++s->next_cid;
    c->txn.route = -1;
    lws_get_peer_simple(wsi, c->peer, sizeof c->peer);
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->n_conns++;
    return c;
}

void conn_cancel_tasks(conn *c)
{
    pick_drop_conn(c);
    api_lora_drop_conn(c);
    while (c->tasks)
        task_cancel(c->tasks);
}

void conn_destroy(conn *c)
{
    lms_server *s = c->srv;
    conn_cancel_tasks(c);
    lms_lora_release(c->lora);
    sbuf_free(&c->txn.body);
    sbuf_free(&c->out);
    sbuf_free(&c->rx);
    while (c->wq_head) {
        wsmsg *m = c->wq_head;
        c->wq_head = m->next;
        free(m);
    }
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->n_conns--;
    if (c->role == CONN_WS)
        s->n_ws--;
    free(c);
}

void conn_want_write(conn *c)
{
    if (!c->closed)
        lws_callback_on_writable(c->wsi);
}

static int over_limit(conn *c)
{
    if (c->out_bytes <= MAX_PENDING_OUT)
        return 0;
    c->kill = true; /* the client does not read: close it */
    conn_want_write(c);
    return -1;
}

int conn_out_raw(conn *c, const void *p, size_t n)
{
    if (c->closed || c->kill)
        return -1;
    if (sbuf_add(&c->out, p, n) < 0) {
        c->kill = true;
        conn_want_write(c);
        return -1;
    }
    c->out_bytes += n;
    conn_want_write(c);
    return over_limit(c);
}

int conn_out_ws(conn *c, const char *p, size_t n)
{
    if (c->closed || c->kill)
        return -1;
    wsmsg *m = malloc(sizeof *m + LWS_PRE + n);
    if (!m) {
        c->kill = true;
        conn_want_write(c);
        return -1;
    }
    m->next = NULL;
    m->n = n;
    memcpy(m->data + LWS_PRE, p, n);
    if (c->wq_tail)
        c->wq_tail->next = m;
    else
        c->wq_head = m;
    c->wq_tail = m;
    c->out_bytes += n;
    conn_want_write(c);
    return over_limit(c);
}

int conn_out_ws_json(conn *c, json_t *j)
{
    size_t n;
    char *s = j ? json_dump_compact(j, &n) : NULL;
    json_decref(j);
    if (!s)
        return -1;
    int rc = conn_out_ws(c, s, n);
    free(s);
    return rc;
}

bool conn_idle_out(const conn *c)
{
    return !c->wq_head && c->out_off >= c->out.n;
}

static int flush_ws(conn *c)
{
    while (c->wq_head) {
        if (lws_send_pipe_choked(c->wsi))
            return 1;
        wsmsg *m = c->wq_head;
        if (lws_write(c->wsi, m->data + LWS_PRE, m->n, LWS_WRITE_TEXT) < (int)m->n)
            return -1;
        c->wq_head = m->next;
        if (!c->wq_head)
            c->wq_tail = NULL;
        c->out_bytes -= m->n;
        c->srv->met.ws_messages_out++;
        free(m);
    }
    return 0;
}

static int flush_raw(conn *c)
{
    while (c->out_off < c->out.n) {
        if (lws_send_pipe_choked(c->wsi))
            return 1;
        size_t k = c->out.n - c->out_off;
        if (k > WRITE_SLICE)
            k = WRITE_SLICE;
        if (lws_write(c->wsi, (unsigned char *)c->out.p + c->out_off, k, LWS_WRITE_HTTP) < 0)
            return -1;
        c->out_off += k;
        c->out_bytes -= k;
    }
    c->out.n = c->out_off = 0;
    if (c->out.cap > (1u << 20)) /* do not keep a big buffer on an idle connection */
        sbuf_free(&c->out);
    return 0;
}

int conn_flush(conn *c)
{
    if (c->kill || c->closed)
        return -1;
    int rc = flush_ws(c);
    if (rc == 0)
        rc = flush_raw(c);
    if (rc < 0)
        return -1;
    if (rc > 0)
        lws_callback_on_writable(c->wsi);
    return 0;
}
