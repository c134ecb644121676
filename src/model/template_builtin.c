/*
 * template_builtin.c - chat templates shipped with lmserv, for models whose
 * files carry no template (or a broken one) and for `--template NAME`.
 *
 * Each is our own Jinja text for a well-known prompt format. They share a
 * `text(content)` macro so that content given as a list of parts
 * ([{"type": "text", "text": ...}, ...]) renders as its text parts. A
 * leading system message is kept where the format has a place for it and
 * folded into the first user turn where it has none (Llama 2, Mistral,
 * Gemma).
 */
#include "model/template.h"

#include <string.h>

/* Content as text: strings as is, lists of parts joined, none as "". */
#define TEXT_MACRO                                                                                 \
    "{%- macro text(c) -%}"                                                                        \
    "{%- if c is string -%}{{- c -}}"                                                              \
    "{%- elif c is mapping -%}{{- c.get('text', '') -}}"                                           \
    "{%- elif c is iterable -%}"                                                                   \
    "{%- for p in c if p is mapping and p.get('type', 'text') == 'text' -%}"                       \
    "{{- p.get('text', '') -}}"                                                                    \
    "{%- endfor -%}"                                                                               \
    "{%- elif c is not none -%}{{- c | string -}}"                                                 \
    "{%- endif -%}"                                                                                \
    "{%- endmacro -%}"

/* Splits off a leading system message: sets `system` and `turns`. */
#define SPLIT_SYSTEM                                                                               \
    "{%- if messages and messages[0]['role'] == 'system' -%}"                                      \
    "{%- set system = text(messages[0]['content']) -%}"                                            \
    "{%- set turns = messages[1:] -%}"                                                             \
    "{%- else -%}"                                                                                 \
    "{%- set system = '' -%}"                                                                      \
    "{%- set turns = messages -%}"                                                                 \
    "{%- endif -%}"

/* Generic "header + content + end marker" formats: (start, end, prompt). */
#define ROLE_TURNS(open, close, prompt)                                                            \
    TEXT_MACRO                                                                                     \
    "{%- for m in messages -%}"                                                                    \
    "{{- " open " + text(m['content']) + " close " -}}"                                            \
    "{%- endfor -%}"                                                                               \
    "{%- if add_generation_prompt -%}{{- " prompt " -}}{%- endif -%}"

static const char k_chatml[] = ROLE_TURNS("'<|im_start|>' + m['role'] + '\\n'", "'<|im_end|>\\n'",
                                          "'<|im_start|>assistant\\n'");

static const char k_phi3[] =
    ROLE_TURNS("'<|' + m['role'] + '|>\\n'", "'<|end|>\\n'", "'<|assistant|>\\n'");

static const char k_zephyr[] =
    ROLE_TURNS("'<|' + m['role'] + '|>\\n'",
               "(eos_token if eos_token is defined else '</s>') + '\\n'", "'<|assistant|>\\n'");

static const char k_llama3[] =
    TEXT_MACRO "{{- bos_token if bos_token is defined else '<|begin_of_text|>' -}}"
               "{%- for m in messages -%}"
               "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' -}}"
               "{{- text(m['content']) | trim -}}{{- '<|eot_id|>' -}}"
               "{%- endfor -%}"
               "{%- if add_generation_prompt -%}"
               "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}"
               "{%- endif -%}";

static const char k_llama2[] = TEXT_MACRO SPLIT_SYSTEM
    "{%- for m in turns -%}"
    "{%- if m['role'] == 'user' -%}"
    "{%- set sys = '<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' if loop.first and system else '' -%}"
    "{{- (bos_token if bos_token is defined else '<s>') + '[INST] ' + sys -}}"
    "{{- text(m['content']) | trim -}}{{- ' [/INST]' -}}"
    "{%- elif m['role'] == 'assistant' -%}"
    "{{- ' ' + text(m['content']) | trim + ' ' -}}"
    "{{- eos_token if eos_token is defined else '</s>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}";

static const char k_mistral[] = TEXT_MACRO SPLIT_SYSTEM
    "{{- bos_token if bos_token is defined else '<s>' -}}"
    "{%- for m in turns -%}"
    "{%- if m['role'] == 'user' -%}"
    "{%- set sys = system + '\\n\\n' if loop.first and system else '' -%}"
    "{{- '[INST] ' + sys + text(m['content']) + ' [/INST]' -}}"
    "{%- elif m['role'] == 'assistant' -%}"
    "{{- text(m['content']) + (eos_token if eos_token is defined else '</s>') -}}"
    "{%- endif -%}"
    "{%- endfor -%}";

static const char k_gemma[] = TEXT_MACRO SPLIT_SYSTEM
    "{{- bos_token if bos_token is defined else '<bos>' -}}"
    "{%- for m in turns -%}"
    "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}"
    "{%- set sys = system + '\\n\\n' if loop.first and system else '' -%}"
    "{{- '<start_of_turn>' + role + '\\n' + sys + text(m['content']) | trim + '<end_of_turn>\\n' "
    "-}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}";

static const char k_deepseek[] =
    TEXT_MACRO SPLIT_SYSTEM "{{- bos_token if bos_token is defined else '' -}}{{- system -}}"
                            "{%- for m in turns -%}"
                            "{%- if m['role'] == 'user' -%}"
                            "{{- '<\xef\xbd\x9c"
                            "User\xef\xbd\x9c>' + text(m['content']) -}}"
                            "{%- elif m['role'] == 'assistant' -%}"
                            "{%- set content = text(m['content']) -%}"
                            "{%- if '</think>' in content -%}{%- set content = "
                            "content.split('</think>')[-1] -%}{%- endif -%}"
                            "{{- '<\xef\xbd\x9c"
                            "Assistant\xef\xbd\x9c>' + content -}}"
                            "{{- eos_token if eos_token is defined else '' -}}"
                            "{%- endif -%}"
                            "{%- endfor -%}"
                            "{%- if add_generation_prompt -%}"
                            "{{- '<\xef\xbd\x9c"
                            "Assistant\xef\xbd\x9c><think>\\n' -}}"
                            "{%- endif -%}";

/* Names and sources, in the same order; the names list ends with NULL. */
static const char *const k_names[] = {"chatml", "llama2", "llama3",   "mistral", "phi3",
                                      "gemma",  "zephyr", "deepseek", NULL};
static const char *const k_sources[] = {k_chatml, k_llama2, k_llama3, k_mistral,
                                        k_phi3,   k_gemma,  k_zephyr, k_deepseek};

_Static_assert(sizeof k_names / sizeof k_names[0] == sizeof k_sources / sizeof k_sources[0] + 1,
               "one source per built-in name");

const char *lms_template_builtin(const char *name)
{
    for (size_t k = 0; name && k_names[k]; k++)
        if (strcmp(k_names[k], name) == 0)
            return k_sources[k];
    return NULL;
}

const char *const *lms_template_builtin_names(void) { return k_names; }
