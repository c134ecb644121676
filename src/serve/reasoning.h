/*
 * reasoning.h - separates a reply's thoughts from its answer, for models
 * that think in the open before they answer: DeepSeek-R1 and its distills,
 * Qwen3 / Qwen3.5, SmolLM3, QwQ write
 *
 *     <think>
 *     ...thoughts...
 *     </think>
 *
 *     answer
 *
 * and several templates (DeepSeek-R1, Qwen3.5 with thinking on) end the
 * prompt with the opening tag, so the reply starts inside the thoughts
 * ("open"). Cohere's Command R7B and Command A write their plan the same
 * way between `<|START_THINKING|>` and `<|END_THINKING|>`; each opening
 * tag is closed by its own closing tag only (the other pair's is text).
 * The thoughts become OpenAI's `reasoning_content` (llama-server and
 * vLLM), Ollama's `thinking`, a Responses API `reasoning` item, an
 * Anthropic `thinking` block.
 *
 * The thoughts are trimmed of surrounding whitespace, the answer of leading
 * whitespace; a reply cut before its closing tag is all thoughts. A reply
 * that does not start with an opening tag (leading whitespace aside) and
 * whose prompt did not open one is all answer, byte for byte. With
 * reasoning_format "none" the callers take nothing apart: either pair
 * stays in the content as written.
 *
 * Streaming: reasoning_feed is given the reply so far each time it grows
 * and says how much of each part is certain: a partial tag at the end, or
 * whitespace that may turn out to be trailing, is held back until the next
 * piece (or the end) decides it. Concatenating what it releases gives
 * exactly what the whole reply gives.
 *
 * Pure functions over text: no I/O, no allocation.
 */
#ifndef LMS_SERVE_REASONING_H
#define LMS_SERVE_REASONING_H

#include <stdbool.h>
#include <stddef.h>

/* What to do with thoughts (llama-server's --reasoning-format). */
typedef enum reasoning_format {
    REASONING_NONE = 0,   /* "none": left in the content as written */
    REASONING_DEEPSEEK,   /* "deepseek" (and "auto"): thoughts apart, content without them */
    REASONING_LEGACY,     /* "deepseek-legacy": thoughts apart and the content as written */
} reasoning_format;

/* "none", "auto", "deepseek", "deepseek-legacy"; -1 for anything else. */
int reasoning_format_parse(const char *name);

/* Whether a rendered prompt ends inside an opened `<think>` (trailing
 * whitespace aside), so the reply starts with thoughts (closed by
 * `</think>`; Cohere's templates never open the plan themselves). */
bool reasoning_prompt_open(const char *prompt, size_t len);

typedef struct reasoning {
    int phase;         /* 0: not known yet, 1: in the thoughts, 2: in the answer */
    int tag;           /* the pair that opened them: 0 <think>, 1 Cohere's */
    bool lead;         /* leading whitespace of the current part still skipped */
    size_t r0, r1;     /* the thoughts certain so far: text[r0, r1) */
    size_t c0;         /* phase 2: the answer is text[c0, len) */
    size_t scan;       /* phase 1: where the search for `</think>` resumes */
} reasoning;

void reasoning_init(reasoning *rs, bool open);
/* Advances over the reply so far, text[0, len) (a longer version of the
 * text of the previous call); final: the reply is complete. Afterwards
 * text[rs->r0, rs->r1) are the thoughts known for sure, and
 * reasoning_answer() where the answer starts. */
void reasoning_feed(reasoning *rs, const char *text, size_t len, bool final);
/* Offset of the answer in the text last fed: len when none is known yet. */
size_t reasoning_answer(const reasoning *rs, size_t len);

#endif
