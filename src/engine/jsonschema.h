/*
 * jsonschema.h - JSON mode held to a JSON schema (OpenAI's response_format
 * json_schema, Ollama's format given as a schema): the schema compiled into
 * one block of memory, and a checker that accepts, byte by byte, exactly
 * the prefixes of JSON objects it allows.
 *
 * What a schema may say (anything else that constrains values is refused
 * at compile time, naming the keyword):
 *   type              a name or a list: object, array, string, number,
 *                     integer, boolean, null
 *   properties        generated in the schema's order; optional ones may be
 *                     left out, no other key is generated
 *   required          those properties are never left out
 *   additionalProperties   a schema, with no properties: an object of any
 *                     keys whose values follow it (a map); otherwise ignored
 *   items, minItems, maxItems
 *   minLength, maxLength   a string's characters (code points; an escape
 *                     is one, a surrogate pair one)
 *   pattern           a regular expression the string must match (PCRE2, in
 *                     the ECMA subset schemas use; unanchored, as JSON
 *                     Schema says). One that starts with ^ (and has no |) is
 *                     also checked on every prefix (PCRE2 partial matching),
 *                     so generation never enters a string it cannot finish;
 *                     such a string has at most LMS_JS_PATTERN_TEXT bytes
 *   minimum, maximum, exclusiveMinimum, exclusiveMaximum   (numbers; the
 *                     draft-4 boolean forms too): a number is then written
 *                     without an exponent, and each prefix must still
 *                     reach an allowed value
 *   enum, const       values of any kind, matched as their compact JSON text
 *   anyOf, oneOf      alternatives told apart by the first byte of a value
 *                     (e.g. a string or null)
 *   $ref              "#/$defs/NAME" or "#/definitions/NAME" (recursion
 *                     allowed)
 *   allOf             with one schema (as generators write a described
 *                     $ref): that schema
 * Ignored: title, description, default, examples, format, $schema, $id,
 * $comment, deprecated, readOnly, writeOnly. The top-level value must be
 * an object.
 */
#ifndef LMS_JSONSCHEMA_H
#define LMS_JSONSCHEMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/jsonfsm.h"

typedef struct lms_jschema lms_jschema;

/* Compiles schema text; NULL with a message in err. Free with free(). */
lms_jschema *lms_jschema_compile(const char *text, size_t n, char *err, size_t errsz);
/* The same from a parsed schema (jansson). */
struct json_t;
lms_jschema *lms_jschema_from_json(const struct json_t *schema, char *err, size_t errsz);
/* Bytes of the block: a copy is memcpy(dst, s, lms_jschema_size(s)). */
size_t lms_jschema_size(const lms_jschema *s);

#define LMS_JS_DEPTH 16 /* nested containers the checker follows */
#define LMS_JS_PATTERN_TEXT 128 /* bytes of a string held to a pattern */

typedef struct lms_jsframe {
    uint64_t cand;  /* key being read: the properties it may still be */
    int16_t node;   /* the container's schema node */
    uint16_t count; /* array: values so far */
    uint16_t pos;   /* key being read: its bytes so far */
    uint8_t next;   /* object: the first property that may still come */
    uint8_t cur;    /* object: the property whose value is being read */
    bool obj;       /* an object (else an array) */
} lms_jsframe;

typedef struct lms_jschk {
    lms_jsonfsm f;          /* the syntax */
    const lms_jschema *sc;  /* NULL: any JSON object */
    uint64_t vcand;         /* scalar being read: enum values it may still be (a range of
                             * the sorted texts, jsonschema.c enum_range) */
    int16_t vnode;          /* its node, -1 when none is being read */
    uint16_t vpos;          /* its bytes so far */
    bool vint;              /* it must be an integer */
    /* string being read (length limits): characters so far, escape state
     * (0 none, 1 after the backslash, 2-5 the \u digits read + 2), the
     * \u value, and whether the last character was a high surrogate */
    uint32_t vlen;
    uint8_t vesc;
    bool vhi;
    uint16_t vhex;
    /* number being read (bounds): sign, digits of the integer part and of
     * the fraction (0xff: no point yet) */
    bool vneg;
    uint8_t vni, vnf;
    double vval;            /* every digit so far, as one integer */
    uint8_t vkind;          /* the scalar's kind (the schema's K_ bit) */
    /* string under a pattern: its text so far, escapes decoded (UTF-8),
     * the high half of a \u pair waiting for its low half, and whether
     * bytes came since the pattern last looked */
    uint8_t vslen;
    bool vpat_dirty;
    uint16_t vhigh;
    char vs[LMS_JS_PATTERN_TEXT];
    uint8_t depth;          /* frames in use */
    lms_jsframe fr[LMS_JS_DEPTH];
} lms_jschk;

void lms_jschk_init(lms_jschk *k, const lms_jschema *sc);
/* Feeds n bytes; false when they cannot continue an allowed object (k is
 * then in an unspecified state). */
bool lms_jschk_feed(lms_jschk *k, const char *p, size_t n);
bool lms_jschk_done(const lms_jschk *k);
/* dst = src, copying only the frames in use */
void lms_jschk_copy(lms_jschk *dst, const lms_jschk *src);
/* a and b accept the same continuations (a cache key) */
bool lms_jschk_same(const lms_jschk *a, const lms_jschk *b);

#endif
