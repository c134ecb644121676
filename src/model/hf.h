/*
 * hf.h - Hugging Face model folders read as if they were GGUF files.
 *
 * A folder (or its config.json) of a LlamaForCausalLM, MistralForCausalLM,
 * Qwen2ForCausalLM or Qwen3ForCausalLM checkpoint becomes the same
 * in-memory gguf_file that llama.cpp's converter (convert_hf_to_gguf.py)
 * would have written, so that everything after opening (model.c, the
 * tokenizer, `lmserv info`) is shared with GGUF:
 *
 *   file                             read for
 *   -------------------------------  ---------------------------------------
 *   config.json                      architecture and hyper-parameters
 *   model.safetensors, or            tensors (F32, F16, BF16), mapped; the
 *   model.safetensors.index.json     index's weight_map names the shards
 *     + the shards it names
 *   tokenizer.json                   byte-level BPE vocab, merges, added
 *                                    tokens, pre-tokenizer regexes
 *   tokenizer_config.json            bos / eos / pad tokens, add_bos_token,
 *                                    add_eos_token, chat_template
 *   chat_template.jinja              chat template, when tokenizer_config.json
 *                                    has none
 *   generation_config.json           eos_token_id when tokenizer_config.json
 *                                    names no eos token
 *
 * Tensor data stays in the mapped safetensors files except where the
 * converter changes values: q/k rows permuted for llama's RoPE (llama,
 * mistral), 1-D tensors (norms, biases) converted to F32, and Llama 3's
 * rope scaling computed into a rope_freqs tensor. Everything in the folder
 * is untrusted; errors name the file and the field or tensor.
 */
#ifndef LMS_HF_H
#define LMS_HF_H

#include <stdbool.h>
#include <stddef.h>

#include "model/gguf.h"

/* Flags of hf_open. */
enum {
    HF_OPEN_NO_TENSORS = 1 << 0,   /* metadata only (config and tokenizer): no safetensors read */
    HF_OPEN_NO_TOKENIZER = 1 << 1, /* no tokenizer keys (tokenizer files not read) */
};

/* Whether path names a Hugging Face folder: a directory, or a file named
 * config.json (its folder is read). */
bool hf_is_model_path(const char *path);

/* Reads the folder at path into a gguf_file (closed with gguf_close). On
 * failure returns < 0 with a message naming the file and field, and
 * leaves *out untouched. */
int hf_open(const char *path, unsigned flags, gguf_file **out, char *err, size_t errsz);

/* hf_open for a Hugging Face folder, else gguf_open (flags unused). */
int hf_open_any(const char *path, unsigned flags, gguf_file **out, char *err, size_t errsz);

#endif
