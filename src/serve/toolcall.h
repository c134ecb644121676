/*
 * toolcall.h - finds the function calls in a model's reply, for the
 * OpenAI `tools` API (`message.tool_calls`, finish_reason "tool_calls").
 *
 * Chat templates teach models one of a few written forms; the ones read
 * here are:
 *   - tags: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one
 *     block per call, possibly after some text (Qwen2/2.5/3, Hermes,
 *     SmolLM3; the closing tag may be missing at the end of the reply);
 *     inside the tags also the XML form of Qwen3-Coder and Qwen3.5,
 *     `<function=NAME>` then `<parameter=KEY>\nVALUE\n</parameter>` per
 *     argument and `</function>` (a value that reads as JSON other than a
 *     string is taken as that value, any other text as a string);
 *   - a bare JSON object `{"name": ..., "parameters"|"arguments": {...}}`
 *     (Llama 3.x; several may follow each other, separated by `;`);
 *   - a JSON array of such objects, optionally after `[TOOL_CALLS]`
 *     (Mistral Nemo), or Mistral's newer `[TOOL_CALLS]NAME[ARGS]{...}`
 *     (Mistral Small 3.x, Magistral, Devstral; `[CALL_ID]ID` before
 *     `[ARGS]` allowed), one per `[TOOL_CALLS]`;
 *   - after `<|python_tag|>` (Llama 3.x) an object or objects as above,
 *     after `<|tool_call|>` (Granite) a JSON array;
 *   - DeepSeek's blocks between `<｜tool▁calls▁begin｜>` and
 *     `<｜tool▁calls▁end｜>` (U+FF5C and U+2581 in the markers), each
 *     `<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>`: V3 and R1 write
 *     `function<｜tool▁sep｜>NAME\n```json\n{...}\n```` ("function" may be
 *     missing, the fence too), V3.1 `NAME<｜tool▁sep｜>{...}`; a reply that
 *     ends without `<｜tool▁calls▁end｜>` counts when every call is closed;
 *   - Functionary v3.1 and Llama 3.1's custom form
 *     `<function=NAME>{...}</function>`, one block per call;
 *   - Functionary v3.2: blocks `>>>NAME\n{...}`, one per call, after
 *     `all\n` or `>>>all\n` and the content, or with the first call
 *     written without `>>>` (the generation prompt ends with it). Such a
 *     first call `NAME\n{...}` is told from text by the request's
 *     function names: given them (names, NULL-terminated), NAME must be
 *     one of them, and a single call is the whole reply; without them it
 *     is taken only where a `>>>` block follows it, so a single call
 *     stays content;
 *   - Cohere's Command R7B and Command A: `<|START_ACTION|>[{"tool_call_id":
 *     ..., "tool_name": NAME, "parameters": {...}}, ...]<|END_ACTION|>`,
 *     after a plan `<|START_THINKING|>...<|END_THINKING|>` that
 *     serve/reasoning takes apart as thoughts (with reasoning_format
 *     "none" it stays content before the calls, as `<think>` does); an
 *     answer `<|START_RESPONSE|>...<|END_RESPONSE|>` at the start is the
 *     content inside.
 * Most markers are control tokens: the scheduler keeps their text in the
 * reply (sched.c, marker_ids). Text before the first marker is content; a
 * bare object or array without a marker counts only when it is the whole
 * reply; text after the last call is dropped. Anything that does not
 * parse completely is plain content, never an error; the wrappers around
 * the content (Cohere's response markers, Functionary's `all` block
 * header) are not content either way.
 *
 * Pure functions over text: no I/O, no global state.
 */
#ifndef LMS_SERVE_TOOLCALL_H
#define LMS_SERVE_TOOLCALL_H

#include <jansson.h>
#include <stddef.h>

typedef struct toolcall {
    char *name;      /* function name */
    char *arguments; /* the arguments as JSON text (an object) */
} toolcall;

typedef struct toolcalls {
    toolcall *v;
    int n;
    size_t content_from; /* the content is text[content_from, content_from + content_len): */
    size_t content_len;  /* up to the first call, trailing space trimmed; n = 0: all of it */
} toolcalls;

/* Reads the calls of a finished reply into *out (n = 0: none, the text is
 * content). names: the request's function names, NULL-terminated, or NULL
 * where not known (borrowed). Returns 0, or < 0 when out of memory. */
int toolcall_parse(const char *text, size_t len, const char *const *names, toolcalls *out);
void toolcalls_free(toolcalls *tc);

/* While streaming: the content of the reply so far that is certain, i.e.
 * cannot belong to a call that is still being written (nor be whitespace
 * that a call after it would trim), is text[*from, return value). Neither
 * decreases as text is appended, *from never passes the final
 * content_from, and once the value returned passes *from, *from stays. */
size_t toolcall_safe_len(const char *text, size_t len, const char *const *names, size_t *from);

/* The function names of a request's tools array (OpenAI's, Ollama's
 * {"function": {"name"}}, Responses' and Anthropic's {"name"}), as a
 * NULL-terminated list in one allocation (free it with free()); NULL when
 * tools is not an array or out of memory. Entries without a name are left
 * out. */
char **toolcall_names(const json_t *tools);

#endif
