/*
 * fuzz_template.c - libFuzzer target: any bytes as a chat template,
 * rendered over a small conversation with tight limits. Errors are
 * expected; crashes, hangs and leaks are not.
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "model/template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *msgs;
    if (!msgs)
        msgs = json_loads("[{\"role\":\"system\",\"content\":\"be brief\"},"
                          "{\"role\":\"user\",\"content\":\"hi <|x|>\"},"
                          "{\"role\":\"assistant\",\"content\":\"ok\"}]",
                          0, NULL);
    lms_template_limits lim = {.max_loop_iters = 10000, .max_depth = 16,
                               .max_output_bytes = 1 << 16, .max_memory_bytes = 8 << 20,
                               .max_time_ms = 200};
    lms_template_vars v = {.messages = msgs, .add_generation_prompt = true, .bos_token = "<s>",
                           .eos_token = "</s>", .limits = &lim, .now_text = "26 Nov 2026"};
    char *out = NULL, err[256];
    size_t n;
    if (lms_template_render((const char *)data, size, &v, &out, &n, err, sizeof err) == 0)
        free(out);
    return 0;
}
