/*
 * markers.h - the texts that mark a reply's structure in the chat formats
 * lmserv reads: function calls (serve/toolcall.c) and thoughts
 * (serve/reasoning.c). Vocabularies often hold them as control tokens,
 * which replies do not show; the scheduler keeps their text
 * (engine/sched.c, marker_ids), so the serve layer can find them.
 */
#ifndef LMS_MODEL_MARKERS_H
#define LMS_MODEL_MARKERS_H

#define LMS_MARK_THINK_OPEN "<think>"
#define LMS_MARK_THINK_CLOSE "</think>"
#define LMS_MARK_TOOL_OPEN "<tool_call>"   /* Hermes / Qwen */
#define LMS_MARK_TOOL_CLOSE "</tool_call>"
#define LMS_MARK_MISTRAL_CALLS "[TOOL_CALLS]"
#define LMS_MARK_MISTRAL_ARGS "[ARGS]"
#define LMS_MARK_MISTRAL_CALL_ID "[CALL_ID]"
#define LMS_MARK_PYTHON_TAG "<|python_tag|>" /* Llama 3.x */
#define LMS_MARK_GRANITE_CALL "<|tool_call|>"

/* Cohere's Command R7B and Command A: a plan (thoughts to
 * serve/reasoning.c), then the calls as a JSON array, or the answer. The response markers are not kept (sched.c):
 * every reply of these models has them, tools or not. */
#define LMS_MARK_COHERE_THINK_OPEN "<|START_THINKING|>"
#define LMS_MARK_COHERE_THINK_CLOSE "<|END_THINKING|>"
#define LMS_MARK_COHERE_ACTION_OPEN "<|START_ACTION|>"
#define LMS_MARK_COHERE_ACTION_CLOSE "<|END_ACTION|>"
#define LMS_MARK_COHERE_RESPONSE_OPEN "<|START_RESPONSE|>"
#define LMS_MARK_COHERE_RESPONSE_CLOSE "<|END_RESPONSE|>"

/* Plain text, never a control token: Functionary v3.1 and Llama 3.1's
 * custom form <function=NAME>{...}</function> (Qwen3-Coder's XML inside
 * <tool_call> opens its calls the same way), Functionary v3.2's block
 * header >>>NAME followed by a newline. */
#define LMS_MARK_FUNCTION_OPEN "<function="
#define LMS_MARK_FUNCTION_CLOSE "</function>"
#define LMS_MARK_FUNCTIONARY_BLOCK ">>>"

/* DeepSeek's, written with U+FF5C FULLWIDTH VERTICAL LINE and U+2581
 * LOWER ONE EIGHTH BLOCK: <｜tool▁calls▁begin｜> and so on. */
#define LMS_MARK_DS_(words) "<\xef\xbd\x9ctool" words "\xef\xbd\x9c>"
#define LMS_MARK_DS_SP_ "\xe2\x96\x81"
#define LMS_MARK_DS_CALLS_BEGIN LMS_MARK_DS_(LMS_MARK_DS_SP_ "calls" LMS_MARK_DS_SP_ "begin")
#define LMS_MARK_DS_CALLS_END LMS_MARK_DS_(LMS_MARK_DS_SP_ "calls" LMS_MARK_DS_SP_ "end")
#define LMS_MARK_DS_CALL_BEGIN LMS_MARK_DS_(LMS_MARK_DS_SP_ "call" LMS_MARK_DS_SP_ "begin")
#define LMS_MARK_DS_CALL_END LMS_MARK_DS_(LMS_MARK_DS_SP_ "call" LMS_MARK_DS_SP_ "end")
#define LMS_MARK_DS_SEP LMS_MARK_DS_(LMS_MARK_DS_SP_ "sep")

#endif
