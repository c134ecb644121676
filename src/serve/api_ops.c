/*
 * api_ops.c - the operator endpoints: GET /health (503 while the model
 * loads, 200 when it serves), GET /stats (JSON), GET /metrics (Prometheus
 * text format 0.0.4).
 */
#include <string.h>

#include "serve/serve_int.h"

int api_health(conn *c)
{
    lms_server *s = c->srv;
    json_t *o = json_object();
    bool ok = s->state == SRV_READY;
    const char *status = ok ? "ok" : s->state == SRV_LOADING ? "loading" : "unavailable";
    if (ok && s->p.thermal) { /* hot: still serving, but slowed or paused */
        lms_thermal_out th;
        lms_thermal_get(s->p.thermal, &th);
        if (th.state != LMS_THERMAL_NORMAL)
            status = "degraded";
        json_object_set_new(o, "thermal", json_string(lms_thermal_state_name(th.state)));
    }
    json_object_set_new(o, "status", json_string(status));
    if (ok) {
        json_object_set_new(o, "model", xid_json(server_default_expert(s)));
        json_object_set_new(o, "models_loaded", json_integer(lms_registry_n_loaded(s->reg)));
        json_object_set_new(o, "engine_restarts", json_integer((json_int_t)s->n_restarts));
    }
    return http_reply_json(c, ok ? 200 : 503, o);
}

int api_stats(conn *c)
{
    return http_reply_json(c, 200, metrics_stats_json(c->srv));
}

int api_metrics(conn *c)
{
    sbuf b = {0};
    metrics_render_prom(c->srv, &b);
    int rc;
    if (b.oom) {
        reqerr e;
        reqerr_set(&e, 503, NULL, "out of memory");
        rc = http_reply_err(c, &e);
    } else {
        rc = http_reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", b.p ? b.p : "", b.n);
    }
    sbuf_free(&b);
    return rc;
}
