/*
 * prompt.h - from user text to prompt tokens: plain text, or one chat turn
 * rendered through the model's template.
 */
#ifndef LMS_APP_PROMPT_H
#define LMS_APP_PROMPT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

/* Template source for the model: its own, or the documented default.
 * `override` (a built-in name or a file path) wins when not NULL. Returns
 * a malloc'd string or NULL with a message in err. */
char *app_chat_template(const lms_model *m, const char *override, char *err, size_t errsz);

/* Renders messages (a JSON array) with the model's template and tokenizes
 * the result with special tokens parsed. kwargs (NULL: none): extra
 * template variables (chat_template_kwargs, e.g. enable_thinking); *open
 * (when not NULL): whether the rendered prompt ends inside an opened
 * <think>, so the reply starts with thoughts. */
int app_chat_tokens(const lms_model *m, const char *tpl, const json_t *messages,
                    const json_t *kwargs, int32_t **out, int32_t *n_out, bool *open, char *err,
                    size_t errsz);

/* chat: [system?, user: text] through the template (the model's, or tpl: a
 * built-in name or a file, when not NULL; with the variables kwargs, NULL
 * for none; *open as app_chat_tokens's, when not NULL); else the plain
 * text (with BOS when add_bos and the vocab wants one). */
int app_prompt_tokens(const lms_model *m, const char *text, const char *system, bool chat,
                      bool add_bos, const char *tpl, const json_t *kwargs, int32_t **out,
                      int32_t *n_out, bool *open, char *err, size_t errsz);

/* Tokenizes into a malloc'd array. */
int app_tokenize(const lms_model *m, const char *text, size_t len, bool add_special,
                 bool parse_special, int32_t **out, int32_t *n_out, char *err, size_t errsz);

#endif
