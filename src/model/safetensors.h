/*
 * safetensors.h - reader for Hugging Face .safetensors files: read into
 * memory (PEFT LoRA adapters, small) or mapped (checkpoints, model/hf.c).
 *
 * Format facts relied on:
 *
 *   bytes        meaning
 *   -----------  -----------------------------------------------------------
 *   0..7         N, the header length (u64, little-endian)
 *   8..8+N       JSON object: tensor name -> {"dtype": "F32"|"F16"|"BF16",
 *                "shape": [d0, d1, ...], "data_offsets": [begin, end]},
 *                plus an optional "__metadata__" object of strings
 *   8+N..        the data section; begin/end are relative to its start
 *
 * Shapes are row-major (d0 slowest, the HF/PyTorch convention), values
 * little-endian. Everything is checked: N within the file, every field's
 * type, end - begin equal to the element count times the dtype size,
 * end within the data section. Other dtypes (I64, F64, ...) are refused.
 */
#ifndef LMS_SAFETENSORS_H
#define LMS_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LMS_ST_MAX_DIMS 4

typedef struct lms_st_tensor {
    char *name;                    /* owned by the file */
    int type;                      /* LMS_TYPE_F32, LMS_TYPE_F16 or LMS_TYPE_BF16 */
    int n_dims;
    int64_t shape[LMS_ST_MAX_DIMS]; /* shape[0] is the slowest dimension */
    const uint8_t *data;           /* into the file's buffer */
    size_t n_bytes;
} lms_st_tensor;

typedef struct lms_st_file {
    uint8_t *buf;                  /* the whole file (owned: malloc'd or mapped) */
    size_t size;
    int is_mapped;                 /* buf is a read-only mapping (lms_st_map) */
    int32_t n_tensors;
    lms_st_tensor *tensors;        /* [n_tensors], in header order */
} lms_st_file;

/* Reads and checks the file at path; on failure returns < 0 with a message
 * naming the tensor or field. */
int lms_st_open(const char *path, lms_st_file **out, char *err, size_t errsz);
/* Same, with the file mapped read-only instead of read (tensor data stays
 * in the page cache; for checkpoints). */
int lms_st_map(const char *path, lms_st_file **out, char *err, size_t errsz);
/* Same from a caller's buffer (copied). */
int lms_st_open_mem(const void *buf, size_t n, lms_st_file **out, char *err, size_t errsz);
void lms_st_close(lms_st_file *f);
/* The tensor named name, or NULL. */
const lms_st_tensor *lms_st_find(const lms_st_file *f, const char *name);

/* A new malloc'd copy of the 2-D tensor t's data (rows = shape[0], F32,
 * F16 or BF16), transposed (transpose), or with llama's RoPE row order
 * within each of n_h heads: the order llama.cpp's converter gives
 * attn_q/attn_k of models whose RoPE rotates adjacent pairs (new row
 * h*hd + 2i + j = HF row h*hd + j*hd/2 + i, hd = rows / n_h; rows must be
 * a multiple of 2 n_h). NULL when out of memory. */
void *lms_st_reorder(const lms_st_tensor *t, bool transpose, int32_t n_h);

#endif
