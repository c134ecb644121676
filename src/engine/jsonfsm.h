/*
 * jsonfsm.h - JSON mode: an incremental checker that accepts, byte by
 * byte, exactly the prefixes of one JSON object (RFC 8259's grammar, the
 * top-level value an object), for decoding held to valid JSON
 * (OpenAI's response_format json_object, Ollama's format "json").
 *
 * The text starts with the object's '{'. Whitespace between tokens inside
 * it is allowed in runs of at most LMS_JSON_WS_MAX bytes with at most one
 * newline and no carriage return (enough for pretty-printing), so that a
 * model cannot pad its way along; nesting is limited to
 * LMS_JSON_DEPTH_MAX. Bytes of 0x80 and above are taken as they come
 * inside strings (a token may end within a UTF-8 character). Nothing may
 * follow the closing brace of the top-level object.
 *
 * The state is a small value: copy it to try bytes without committing.
 */
#ifndef LMS_JSONFSM_H
#define LMS_JSONFSM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LMS_JSON_WS_MAX 16
#define LMS_JSON_DEPTH_MAX 64

typedef struct lms_jsonfsm {
    uint64_t objects; /* bit d: the container at depth d + 1 is an object */
    uint8_t depth;    /* open containers */
    uint8_t st;       /* where in the grammar (jsonfsm.c) */
    uint8_t sub;      /* literal: next index; \u escape: hex digits seen */
    uint8_t lit;      /* literal: which (true, false, null) */
    uint8_t ws;       /* whitespace run: bytes (bits 0-6), a newline seen (bit 7) */
    bool key;         /* the string being read is an object key */
} lms_jsonfsm;

void lms_jsonfsm_init(lms_jsonfsm *f);
/* Feeds n bytes. False when they cannot continue a JSON object; f is then
 * in an unspecified state (feed a copy to test). */
bool lms_jsonfsm_feed(lms_jsonfsm *f, const char *p, size_t n);
/* The text fed so far is a complete JSON object. */
bool lms_jsonfsm_done(const lms_jsonfsm *f);
/* a and b accept the same continuations (the same state; a cache key). */
bool lms_jsonfsm_same(const lms_jsonfsm *a, const lms_jsonfsm *b);

/* Where the checker is, in coarse terms (for the schema layer,
 * jsonschema.c): a value is expected; between tokens of a container; in a
 * key, a string value, a number or a literal; after the object. */
enum {
    LMS_JSON_PH_VALUE,
    LMS_JSON_PH_STRUCT,
    LMS_JSON_PH_KEY,
    LMS_JSON_PH_STRING,
    LMS_JSON_PH_NUMBER,
    LMS_JSON_PH_LITERAL,
    LMS_JSON_PH_DONE,
};
int lms_jsonfsm_phase(const lms_jsonfsm *f);

#endif
