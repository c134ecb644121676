/*
 * gguf.h - reader (and writer) of GGUF v2/v3 model files.
 *
 * The file is mapped read-only; tensor data is used in place. Every count,
 * size and offset is checked before use; a damaged file gives LMS_ERR_FORMAT
 * with a message naming the field and its byte offset.
 *
 * File layout (little-endian):
 *
 *   offset  field
 *   ------  ---------------------------------------------------------
 *   0       u32 magic "GGUF"
 *   4       u32 version (2 or 3)
 *   8       u64 n_tensors
 *   16      u64 n_kv
 *   24      n_kv x { string key; u32 vtype; value }
 *           n_tensors x { string name; u32 n_dims; u64 ne[n_dims];
 *                         u32 type; u64 offset }
 *           padding to general.alignment (default 32)
 *           tensor data (each tensor at data_start + offset)
 *
 *   string = u64 length + bytes (not NUL-terminated)
 *   value  = scalar of vtype, or for ARRAY: u32 elem_type, u64 n, n elems
 *
 * All strings exposed by this API are copies owned by the gguf_file and are
 * NUL-terminated (p[n] == 0), though they may contain interior NULs.
 */
#ifndef LMS_GGUF_H
#define LMS_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum gguf_vtype {
    GGUF_VT_U8 = 0,
    GGUF_VT_I8 = 1,
    GGUF_VT_U16 = 2,
    GGUF_VT_I16 = 3,
    GGUF_VT_U32 = 4,
    GGUF_VT_I32 = 5,
    GGUF_VT_F32 = 6,
    GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8,
    GGUF_VT_ARRAY = 9,
    GGUF_VT_U64 = 10,
    GGUF_VT_I64 = 11,
    GGUF_VT_F64 = 12,
    GGUF_VT_COUNT
};

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

typedef struct gguf_str {
    const char *p; /* NUL-terminated copy, owned by the gguf_file */
    size_t n;      /* length in bytes, excluding the terminator */
} gguf_str;

typedef struct gguf_kv {
    gguf_str key;
    int type;            /* enum gguf_vtype */
    int arr_type;        /* element type when type == ARRAY, else -1 */
    uint64_t n;          /* number of elements (1 for a scalar) */
    union {              /* scalar value, widened */
        uint64_t u;      /* U8/U16/U32/U64/BOOL */
        int64_t i;       /* I8/I16/I32/I64 (also set for unsigned types) */
        double f;        /* F32/F64 */
        gguf_str s;      /* STRING */
    } v;
    const void *arr;     /* numeric array: raw little-endian elements in the
                          * mapping (n x size of arr_type), may be unaligned */
    gguf_str *strs;      /* string array: n owned strings; NULL otherwise */
    uint64_t file_offset; /* where the value starts, for messages */
} gguf_kv;

typedef struct gguf_tensor {
    gguf_str name;
    int type;                 /* enum lms_type (kernels/qtypes.h) */
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the fastest dimension; unused = 1 */
    uint64_t offset;          /* relative to the data section */
    size_t n_bytes;
    const void *data;         /* in the mapping (NULL for vocab-only views) */
} gguf_tensor;

typedef struct gguf_file {
    uint32_t version;
    uint64_t n_kv;
    gguf_kv *kv;
    uint64_t n_tensors;
    gguf_tensor *tensors;
    uint32_t alignment;
    uint64_t data_offset;     /* start of the tensor data section */
    const uint8_t *base;      /* the mapping (or the caller's buffer) */
    size_t size;              /* its size in bytes */
    bool is_mapped;
    bool resident;            /* tensor data moved to anonymous memory (gguf_make_resident) */
    char *path;               /* owned copy, NULL for memory files */
    /* Other memory the views point into (a Hugging Face folder's mapped
     * safetensors files and converted tensors, model/hf.c): gguf_close
     * calls release(release_ctx) last. NULL for GGUF files. */
    void (*release)(void *ctx);
    void *release_ctx;
    /* private */
    void *strpool;
} gguf_file;

/* Maps and parses a file. On failure returns < 0, writes a message naming
 * the field and offset to err, and leaves *out untouched. */
int gguf_open(const char *path, gguf_file **out, char *err, size_t errsz);
/* Parses a caller-owned buffer that must outlive the gguf_file (fuzzing,
 * tests). */
int gguf_open_mem(const void *buf, size_t n, gguf_file **out, char *err, size_t errsz);
void gguf_close(gguf_file *f); /* NULL is a no-op */
/* Copies the tensor data of a mapped file into anonymous memory at the
 * same addresses, with transparent huge pages asked for: faster streaming
 * of the weights (fewer TLB misses) at the cost of the page cache sharing.
 * Not done (returns 0) when LMS_MMAP=1, without THP, or when the data
 * exceeds 80% of MemAvailable; 1 when done. Never fails the caller. */
int gguf_make_resident(gguf_file *f);

/* Lookups: NULL / -1 when absent. */
const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Typed getters. Return 0 and set *out when the key exists with a
 * compatible type (any integer type for ints, with range check; F32/F64 for
 * floats; BOOL or integer for bools); LMS_ERR_NOTFOUND when absent (out
 * untouched); LMS_ERR_FORMAT when the type is wrong. */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out);
int gguf_get_f32(const gguf_file *f, const char *key, float *out);
int gguf_get_bool(const gguf_file *f, const char *key, bool *out);
int gguf_get_str(const gguf_file *f, const char *key, const char **out);
/* Array element access for numeric arrays (any integer / float element
 * type; i < kv->n required). */
int64_t gguf_arr_i64(const gguf_kv *kv, uint64_t i);
double gguf_arr_f64(const gguf_kv *kv, uint64_t i);

const char *gguf_vtype_name(int vtype);
size_t gguf_vtype_size(int vtype); /* 0 for STRING/ARRAY/unknown */

/* ---- writer ----------------------------------------------------------------
 * Builds a GGUF v3 file: metadata copied from a reader or set one by one,
 * tensors added with their data, then written in one pass. */
typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_create(void);
void gguf_writer_destroy(gguf_writer *w);
/* Copies every key of src except those for which skip(key) returns true
 * (skip may be NULL). */
int gguf_writer_copy_kv(gguf_writer *w, const gguf_file *src, bool (*skip)(const char *key));
int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
int gguf_writer_set_bool(gguf_writer *w, const char *key, bool v);
int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v);
/* Array of n strings / of n numbers of element type vt (raw LE bytes). */
int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n);
int gguf_writer_set_arr(gguf_writer *w, const char *key, int vt, const void *data, uint64_t n);
/* Adds a tensor; data (n_bytes, must equal the size implied by type and ne)
 * is copied unless `borrow` is true, in which case it must stay valid until
 * gguf_writer_write returns. */
int gguf_writer_add_tensor(gguf_writer *w, const char *name, int type, int n_dims,
                           const int64_t *ne, const void *data, size_t n_bytes, bool borrow);
int gguf_writer_write(gguf_writer *w, const char *path, char *err, size_t errsz);

#endif
