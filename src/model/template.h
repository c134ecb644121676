/*
 * template.h - chat templates: a Jinja2 subset that turns a conversation
 * (OpenAI-style messages) into the prompt text a model was trained on.
 *
 * Models ship their template as Jinja source (GGUF key
 * `tokenizer.chat_template`, or `chat_template` in tokenizer_config.json).
 * The reference behaviour is Hugging Face transformers'
 * `apply_chat_template`: jinja2 with trim_blocks and lstrip_blocks, the
 * loopcontrols extension, a sandbox that forbids mutating lists and dicts,
 * `tojson` as json.dumps(ensure_ascii=False), and the globals
 * raise_exception(msg) and strftime_now(fmt).
 *
 * Templates are untrusted input: parsing and rendering never crash, and
 * every render is bounded in loop iterations, macro depth, output size,
 * memory and time (lms_template_limits). Errors name the template line and
 * column: "template:12:5: unknown filter 'foo'".
 *
 * A parsed lms_template is immutable; any number of threads may render it
 * at once.
 */
#ifndef LMS_TEMPLATE_H
#define LMS_TEMPLATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct lms_template lms_template;

/* Bounds of one render; a zero field takes the default shown. */
typedef struct lms_template_limits {
    int64_t max_loop_iters;  /* for-loop iterations in all, default 1000000 */
    int max_depth;           /* nested macro calls, default 64 */
    size_t max_output_bytes; /* rendered text, default 16 MiB */
    size_t max_memory_bytes; /* values made while rendering, default 256 MiB */
    int64_t max_time_ms;     /* wall clock, default 5000 */
} lms_template_limits;

/* What a template sees. Pointers are borrowed for the call. */
typedef struct lms_template_vars {
    const json_t *messages;            /* array of message objects (role, content,
                                        * tool_calls, ...); NULL = empty list */
    const json_t *tools;               /* array, or NULL to leave `tools` undefined */
    bool add_generation_prompt;        /* end with the assistant turn header */
    const char *bos_token;             /* NULL leaves the variable undefined */
    const char *eos_token;             /* NULL leaves the variable undefined */
    const json_t *extra;               /* object of more variables (enable_thinking,
                                        * documents, reasoning_effort, ...) or NULL;
                                        * these override the ones above */
    int64_t now;                       /* time for strftime_now() in seconds since
                                        * the epoch, local time; 0 = the real clock */
    const char *now_text;              /* if set, strftime_now() returns this text
                                        * whatever its format (golden tests) */
    const lms_template_limits *limits; /* NULL = defaults */
} lms_template_vars;

/* Parses template source (n bytes, need not be NUL-terminated). On failure
 * returns LMS_ERR_FORMAT (syntax) or LMS_ERR_NOMEM / LMS_ERR_LIMIT with a
 * message in err, and leaves *out untouched. */
int lms_template_parse(const char *src, size_t n, lms_template **out, char *err, size_t errsz);
void lms_template_destroy(lms_template *t); /* NULL is a no-op */

/*
 * Renders t with vars. On success *out is a malloc'd, NUL-terminated string
 * of *out_len bytes (the caller frees it). On failure nothing is returned
 * and err holds the reason:
 *
 *   LMS_ERR_INVAL   the template called raise_exception(msg): it rejects this
 *                   conversation. err holds msg verbatim (no location), so a
 *                   server can pass it on to its client.
 *   LMS_ERR_FORMAT  a runtime error in the template (type error, undefined
 *                   attribute, unknown filter, ...): "template:L:C: ...".
 *   LMS_ERR_RANGE   integer arithmetic overflowed 64 bits (Python has big ints).
 *   LMS_ERR_LIMIT   a bound of lms_template_limits was exceeded.
 *   LMS_ERR_NOMEM   out of memory.
 *
 * Recursion (nested expressions, blocks, macro calls) is bounded, so a
 * render fits in well under 1 MiB of thread stack.
 */
int lms_template_apply(const lms_template *t, const lms_template_vars *vars, char **out,
                       size_t *out_len, char *err, size_t errsz);

/* Parse + apply in one call. */
int lms_template_render(const char *tpl, size_t tpl_len, const lms_template_vars *vars, char **out,
                        size_t *out_len, char *err, size_t errsz);

/* The template switches a user sets on the command line (llama-server's
 * --chat-template-kwargs JSON and --reasoning on|off|auto): kwargs_json a
 * JSON object or NULL, reasoning "on" / "off" (enable_thinking true /
 * false) or "auto" / NULL (left to the template). *out: the variables
 * object (new reference), or NULL when neither sets anything. Returns
 * LMS_ERR_INVAL with a message naming the bad value. */
int lms_template_switches(const char *kwargs_json, const char *reasoning, json_t **out,
                          char *err, size_t errsz);

/*
 * Templates shipped with lmserv, by name: "chatml", "llama2", "llama3",
 * "mistral", "phi3", "gemma", "zephyr", "deepseek". Returns the Jinja
 * source (static storage) or NULL for an unknown name.
 *
 * A model without a chat template gets LMS_TEMPLATE_DEFAULT (ChatML: the
 * most widely trained format, and harmless as plain text for base models).
 */
#define LMS_TEMPLATE_DEFAULT "chatml"
const char *lms_template_builtin(const char *name);
/* NULL-terminated list of the built-in names. */
const char *const *lms_template_builtin_names(void);

#endif
