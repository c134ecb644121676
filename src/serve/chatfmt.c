/*
 * chatfmt.c - from an OpenAI `messages` array to prompt tokens: checking
 * and normalizing the messages (content parts joined into text, the
 * "developer" role read as "system", tool-call arguments given as JSON
 * strings read into objects), rendering them with the model's chat
 * template (parsed once when the model is attached), and tokenizing.
 *
 * For a remote expert the same messages go upstream instead, with the
 * request's tools (chatfmt_submit_remote), and the function calls of its
 * reply come apart from the text (route/remote.h, LMS_REMOTE_CALL):
 * chatfmt_remote_call collects them for the dialects' own emitters.
 *
 * The template comes from the model file (tokenizer.chat_template) or, for
 * models without one, the documented default (template.h). Rendering runs
 * on the event-loop thread, so its time and output are bounded tighter
 * than the library defaults.
 */
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "model/tokenizer.h"
#include "route/remote.h"
#include "serve/reasoning.h"
#include "serve/reply.h"
#include "serve/serve_int.h"
#include "serve/toolcall.h"

static const lms_template_limits render_limits = {
    .max_loop_iters = 200000,
    .max_depth = 32,
    .max_output_bytes = 8u << 20,
    .max_memory_bytes = 64u << 20,
    .max_time_ms = 1000,
};

static char *special_text(const lms_model *m, int32_t id)
{
    if (id < 0)
        return NULL;
    const char *t = lms_token_text(m->tok, id);
    return t && t[0] ? strdup(t) : NULL;
}

int chatfmt_init(chatfmt *cf, const lms_model *m, const char *override, char *err,
                 size_t errsz)
{
    memset(cf, 0, sizeof *cf);
    const char *own = NULL;
    cf->model_has_own = gguf_get_str(m->gguf, "tokenizer.chat_template", &own) >= 0 && own &&
                        own[0];
    if (override && !(cf->src = strdup(override)))
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory");
    const char *src = override ? override : chatfmt_source(m);
    if (!src)
        return lms_errf(err, errsz, LMS_ERR_NOTFOUND, "no chat template available");
    int rc = lms_template_parse(src, strlen(src), &cf->tpl, err, errsz);
    if (rc < 0) {
        free(cf->src);
        cf->src = NULL;
        return rc;
    }
    cf->bos = special_text(m, lms_tokenizer_bos(m->tok));
    cf->eos = special_text(m, lms_tokenizer_eos(m->tok));
    return 0;
}

void chatfmt_deinit(chatfmt *cf)
{
    lms_template_destroy(cf->tpl);
    free(cf->src);
    free(cf->bos);
    free(cf->eos);
    memset(cf, 0, sizeof *cf);
}

/* ---- messages ----------------------------------------------------------------- */

/* Joins the text parts of a content array; NULL with e filled on a part
 * we cannot take. */
static json_t *join_parts(const json_t *parts, const char *field, size_t idx, reqerr *e)
{
    sbuf b = {0};
    size_t i;
    const json_t *part;
    json_array_foreach(parts, i, part)
    {
        const char *type = json_string_value(json_object_get(part, "type"));
        const json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !type) {
            reqerr_set(e, 400, field, "%s[%zu].content[%zu] must be an object with a 'type'",
                       field, idx, i);
            goto fail;
        }
        if (strcmp(type, "text") != 0 || !json_is_string(text)) {
            reqerr_set(e, 400, field, "%s[%zu].content[%zu]: content parts of type '%.40s' are not "
                       "supported (only 'text' with a string 'text')", field, idx, i, type);
            goto fail;
        }
        if ((i > 0 && sbuf_add(&b, "\n", 1) < 0) ||
            sbuf_add(&b, json_string_value(text), json_string_length(text)) < 0) {
            reqerr_set(e, 503, NULL, "out of memory");
            goto fail;
        }
    }
    json_t *s = json_stringn(b.p ? b.p : "", b.n);
    sbuf_free(&b);
    return s;
fail:
    sbuf_free(&b);
    return NULL;
}

/* OpenAI clients send a call's arguments as a JSON string; templates
 * expect the object (they print it with tojson), so a string that holds an
 * object is replaced by it, as vLLM and llama-server do. */
static void parse_call_arguments(json_t *msg)
{
    size_t k;
    json_t *call;
    json_array_foreach(json_object_get(msg, "tool_calls"), k, call)
    {
        json_t *fn = json_object_get(call, "function");
        const json_t *args = json_object_get(fn, "arguments");
        if (!json_is_string(args))
            continue;
        json_t *obj = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
        if (json_is_object(obj))
            json_object_set(fn, "arguments", obj);
        json_decref(obj);
    }
}

static json_t *norm_message(const json_t *msg, const char *field, size_t i, reqerr *e)
{
    if (!json_is_object(msg)) {
        reqerr_set(e, 400, field, "%s[%zu] must be an object", field, i);
        return NULL;
    }
    const json_t *role = json_object_get(msg, "role");
    if (!json_is_string(role)) {
        reqerr_set(e, 400, field, "%s[%zu].role must be a string", field, i);
        return NULL;
    }
    const json_t *content = json_object_get(msg, "content");
    json_t *text;
    if (!content || json_is_null(content) || json_is_string(content))
        text = content ? json_copy((json_t *)content) : json_null();
    else if (json_is_array(content))
        text = join_parts(content, field, i, e);
    else {
        reqerr_set(e, 400, field, "%s[%zu].content must be a string or an array of parts",
                   field, i);
        return NULL;
    }
    if (!text)
        return NULL;
    json_t *out = json_deep_copy(msg);
    if (!out) {
        json_decref(text);
        reqerr_set(e, 503, NULL, "out of memory");
        return NULL;
    }
    json_object_set_new(out, "content", text);
    parse_call_arguments(out);
    if (!strcmp(json_string_value(role), "developer"))
        json_object_set_new(out, "role", json_string("system"));
    return out;
}

json_t *chatfmt_messages(const json_t *messages, const char *field, reqerr *e)
{
    if (!messages || json_is_null(messages)) {
        reqerr_set(e, 400, field, "'%s' is required", field);
        return NULL;
    }
    if (!json_is_array(messages)) {
        reqerr_set(e, 400, field, "'%s' must be an array of messages", field);
        return NULL;
    }
    if (json_array_size(messages) == 0) {
        reqerr_set(e, 400, field, "'%s' must not be empty", field);
        return NULL;
    }
    json_t *out = json_array();
    size_t i;
    const json_t *msg;
    json_array_foreach(messages, i, msg)
    {
        json_t *n = norm_message(msg, field, i, e);
        if (!n) {
            json_decref(out);
            return NULL;
        }
        json_array_append_new(out, n);
    }
    return out;
}

/* ---- tokens ----------------------------------------------------------------------- */

static int tokenize(const lms_model *m, const char *text, size_t len, bool add_special,
                    bool parse_special, int32_t **out, int32_t *n_out, reqerr *e)
{
    int64_t n = lms_tokenize(m->tok, text, len, add_special, parse_special, NULL, 0);
    if (n < 0)
        return reqerr_set(e, 400, NULL, "cannot tokenize the prompt: %s", lms_strerror((int)n));
    if (n > INT32_MAX / 2)
        return reqerr_set(e, 413, NULL, "the prompt is too long");
    int32_t *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v)
        return reqerr_set(e, 503, NULL, "out of memory for %lld tokens", (long long)n);
    lms_tokenize(m->tok, text, len, add_special, parse_special, v, n);
    *out = v;
    *n_out = (int32_t)n;
    return 0;
}

int chatfmt_text_tokens(const lms_model *m, const char *text, size_t len, bool add_special,
                        int32_t **out, int32_t *n_out, reqerr *e)
{
    return tokenize(m, text, len, add_special, false, out, n_out, e);
}

int chatfmt_special_tokens(const lms_model *m, const char *text, size_t len, int32_t **out,
                           int32_t *n_out, reqerr *e)
{
    return tokenize(m, text, len, false, true, out, n_out, e);
}

static int render_error(reqerr *e, int rc, const char *msg)
{
    if (rc == LMS_ERR_NOMEM)
        return reqerr_set(e, 503, NULL, "out of memory while rendering the chat template");
    if (rc == LMS_ERR_INVAL) /* the template's raise_exception: it refuses this chat */
        return reqerr_set(e, 422, "messages", "%s", msg);
    return reqerr_set(e, 422, "messages", "the chat template cannot render these messages: %s",
                      msg);
}

int chatfmt_render(const chatfmt *cf, const chat_in *in, bool add_generation_prompt,
                   char **text, size_t *len, reqerr *e)
{
    lms_template_vars vars = {
        .messages = in->messages,
        .tools = in->tools,
        .add_generation_prompt = add_generation_prompt,
        .bos_token = cf->bos,
        .eos_token = cf->eos,
        .extra = in->kwargs,
        .limits = &render_limits,
    };
    char msg[256];
    int rc = lms_template_apply(cf->tpl, &vars, text, len, msg, sizeof msg);
    return rc < 0 ? render_error(e, rc, msg) : 0;
}

int chatfmt_kwargs(const lms_server *s, const json_t *body, json_t **out, reqerr *e)
{
    *out = NULL;
    const json_t *kw = NULL;
    if (body && reqparse_obj(body, "chat_template_kwargs", &kw, e) < 0)
        return -1;
    if (!s->tpl_kwargs && !kw)
        return 0;
    json_t *o = s->tpl_kwargs ? json_deep_copy(s->tpl_kwargs) : json_object();
    if (!o || (kw && json_object_update(o, (json_t *)kw) < 0)) {
        json_decref(o);
        return reqerr_set(e, 503, NULL, "out of memory");
    }
    *out = o;
    return 0;
}

const char *chatfmt_source(const lms_model *m)
{
    const char *src = NULL;
    if (gguf_get_str(m->gguf, "tokenizer.chat_template", &src) >= 0 && src && src[0])
        return src;
    return lms_template_builtin(LMS_TEMPLATE_DEFAULT);
}

int chatfmt_tokens(const chatfmt *cf, const lms_model *m, const chat_in *in, int32_t **out,
                   int32_t *n_out, bool *think_open, reqerr *e)
{
    char *text;
    size_t len;
    int rc = chatfmt_render(cf, in, true, &text, &len, e);
    if (rc < 0)
        return rc;
    if (think_open)
        *think_open = reasoning_prompt_open(text, len);
    /* BOS unless the template already wrote it */
    bool add = lms_tokenizer_add_bos(m->tok) && cf->bos &&
               strncmp(text, cf->bos, strlen(cf->bos)) != 0;
    rc = tokenize(m, text, len, add, true, out, n_out, e);
    free(text);
    return rc;
}

int api_think_budget(conn *c, genparams *gp, bool open, reqerr *e)
{
    const int32_t srv = c->srv->p.reasoning_budget > 0 ? c->srv->p.reasoning_budget : -1;
    const int32_t budget = gp->reasoning_budget == -2 ? srv : gp->reasoning_budget;
    gp->think_open = open;
    if (budget < 0 || gp->grammar)
        return 0;
    static const char close[] = "\n</think>\n\n";
    free(gp->think_close);
    gp->think_close = NULL;
    if (tokenize(c->x->model, close, sizeof close - 1, false, true, &gp->think_close,
                 &gp->n_think_close, e) < 0)
        return -1;
    gp->reasoning_budget = budget;
    return 0;
}

json_t *chatfmt_tool(const json_t *name, const json_t *description, const json_t *parameters)
{
    json_t *fn = json_pack("{s:O}", "name", name);
    if (json_is_string(description))
        json_object_set(fn, "description", (json_t *)description);
    json_object_set_new(fn, "parameters", json_is_object(parameters)
                                              ? json_incref((json_t *)parameters)
                                              : json_object());
    return json_pack("{s:s, s:o}", "type", "function", "function", fn);
}

/* ---- remote experts' chats --------------------------------------------------------- */

/* msgs as OpenAI takes them: a copy whose calls' arguments are JSON text
 * (chatfmt_messages read them into objects for the templates). */
static json_t *upstream_messages(const json_t *msgs)
{
    json_t *out = json_deep_copy(msgs);
    size_t i, k;
    json_t *m, *call;
    json_array_foreach(out, i, m)
    {
        json_array_foreach(json_object_get(m, "tool_calls"), k, call)
        {
            json_t *fn = json_object_get(call, "function");
            const json_t *args = json_object_get(fn, "arguments");
            if (args && !json_is_string(args)) {
                char *text = json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
                json_object_set_new(fn, "arguments", json_string(text ? text : "{}"));
                free(text);
            }
        }
    }
    return out;
}

json_t *chatfmt_upstream_tools(const json_t *tools, const json_t *forced)
{
    if (!tools)
        return NULL;
    json_t *o = json_pack("{s:O}", "tools", tools);
    const json_t *name = json_object_get(json_object_get(forced, "function"), "name");
    if (json_is_string(forced))
        json_object_set(o, "tool_choice", (json_t *)forced);
    else if (json_is_string(name))
        json_object_set_new(o, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function",
                                                        "function", "name", name));
    return o;
}

task *chatfmt_submit_remote(conn *c, const json_t *msgs, const json_t *params,
                            const json_t *fields, const genparams *gp, const task_ops *ops,
                            void *state, reqerr *e)
{
    json_t *what = fields ? json_copy((json_t *)fields) : json_object();
    json_t *m = upstream_messages(msgs);
    if (!what || !m || json_object_set_new(what, "messages", json_incref(m)) < 0) {
        json_decref(what);
        json_decref(m);
        reqerr_set(e, 503, NULL, "out of memory");
        return NULL;
    }
    json_decref(m);
    return task_submit_upstream(c, what, params, gp, ops, state, e);
}

bool chatfmt_remote_call(toolcalls *calls, bool *lost, const lms_event *ev)
{
    if (ev->type != LMS_EV_TOKEN || ev->token != LMS_REMOTE_CALL)
        return false;
    json_t *o = json_loadb(ev->text, ev->text_len, 0, NULL);
    const json_t *name = json_object_get(o, "name"), *args = json_object_get(o, "arguments");
    char *nm = json_is_string(name) ? strdup(json_string_value(name)) : NULL;
    char *a = json_is_object(args) ? json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    toolcall *v = nm && a ? realloc(calls->v, (size_t)(calls->n + 1) * sizeof *v) : NULL;
    json_decref(o);
    if (!v) {
        free(nm);
        free(a);
        *lost = true;
        return true;
    }
    calls->v = v;
    v[calls->n++] = (toolcall){nm, a};
    return true;
}

void chatfmt_reply_end(reply_cut *cut, const char *text, size_t n, toolcalls *calls,
                       reply_part *w, toolcalls *tc)
{
    reply_part p;
    reply_cut_next(cut, text, n, &p, tc);
    reply_cut_whole(cut, n, w);
    chatfmt_take_calls(tc, calls);
}

chat_ev chatfmt_event(const task *t, const lms_event *ev, sbuf *text, toolcalls *calls,
                      bool *calls_lost, reqerr *e)
{
    if (chatfmt_remote_call(calls, calls_lost, ev))
        return CHAT_EV_CALL;
    if (ev->type == LMS_EV_TOKEN) {
        sbuf_add(text, ev->text, ev->text_len);
        return CHAT_EV_TEXT;
    }
    if (ev->type != LMS_EV_END && ev->type != LMS_EV_ERROR)
        return CHAT_EV_NONE;
    if (task_end_failed(t, ev, e))
        return CHAT_EV_FAILED;
    if (*calls_lost) {
        reqerr_set(e, 503, NULL, "out of memory for the upstream's tool calls");
        return CHAT_EV_FAILED;
    }
    return CHAT_EV_END;
}

void chatfmt_take_calls(toolcalls *tc, toolcalls *from)
{
    if (from->n == 0)
        return;
    toolcalls_free(tc); /* its calls only: the content's span stays */
    tc->v = from->v;
    tc->n = from->n;
    from->v = NULL;
    from->n = 0;
}
