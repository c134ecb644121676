/*
 * gpumon_prom.c - a GPU snapshot in the Prometheus text exposition format
 * (version 0.0.4), for GET /metrics; see gpumon.h.
 *
 * Every family is written whole (HELP, TYPE, then one sample per GPU that
 * has the value), as the format requires. The per-value families are one
 * table; throttle reasons, the name and availability are written by hand.
 */
#include <stddef.h>
#include <string.h>

#include "base/err.h"
#include "ops/gpumon.h"
#include "ops/jsonw.h"

enum prom_type { PROM_U32, PROM_U64, PROM_F64 };

static const struct prom_metric {
    const char *name;
    const char *help;
    const char *label; /* extra label pair, or NULL */
    uint32_t field;    /* LMS_GPU_HAS_* bit the value needs */
    size_t off;        /* in lms_gpu_info */
    enum prom_type type;
} metrics[] = {
    {"lmserv_gpu_temperature_celsius", "GPU core temperature.", NULL, LMS_GPU_HAS_TEMP,
     offsetof(lms_gpu_info, temp_c), PROM_U32},
    {"lmserv_gpu_memory_total_bytes", "Total GPU memory.", NULL, LMS_GPU_HAS_MEMORY,
     offsetof(lms_gpu_info, mem_total_bytes), PROM_U64},
    {"lmserv_gpu_memory_used_bytes", "Allocated GPU memory.", NULL, LMS_GPU_HAS_MEMORY,
     offsetof(lms_gpu_info, mem_used_bytes), PROM_U64},
    {"lmserv_gpu_memory_free_bytes", "Free GPU memory.", NULL, LMS_GPU_HAS_MEMORY,
     offsetof(lms_gpu_info, mem_free_bytes), PROM_U64},
    {"lmserv_gpu_power_watts", "Board power draw.", NULL, LMS_GPU_HAS_POWER,
     offsetof(lms_gpu_info, power_w), PROM_F64},
    {"lmserv_gpu_fan_speed_percent", "Intended fan speed.", NULL, LMS_GPU_HAS_FAN,
     offsetof(lms_gpu_info, fan_pct), PROM_U32},
    {"lmserv_gpu_utilization_percent", "Share of the last sample period the GPU was busy.", NULL,
     LMS_GPU_HAS_UTIL, offsetof(lms_gpu_info, util_gpu_pct), PROM_U32},
    {"lmserv_gpu_memory_utilization_percent", "Share of the last sample period memory was busy.",
     NULL, LMS_GPU_HAS_UTIL, offsetof(lms_gpu_info, util_mem_pct), PROM_U32},
    {"lmserv_gpu_clock_mhz", "Current clock frequency.", "clock=\"graphics\"",
     LMS_GPU_HAS_CLOCK_GRAPHICS, offsetof(lms_gpu_info, clock_graphics_mhz), PROM_U32},
    {"lmserv_gpu_clock_mhz", "Current clock frequency.", "clock=\"sm\"", LMS_GPU_HAS_CLOCK_SM,
     offsetof(lms_gpu_info, clock_sm_mhz), PROM_U32},
    {"lmserv_gpu_clock_mhz", "Current clock frequency.", "clock=\"memory\"", LMS_GPU_HAS_CLOCK_MEM,
     offsetof(lms_gpu_info, clock_mem_mhz), PROM_U32},
    {"lmserv_gpu_throttle_reasons", "Bit mask of NVML clock throttle reasons.", NULL,
     LMS_GPU_HAS_THROTTLE, offsetof(lms_gpu_info, throttle_reasons), PROM_U64},
};

static void header(lms_jsonw *w, const char *name, const char *help)
{
    lms_jsonw_printf(w, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
}

static void sample(lms_jsonw *w, const struct prom_metric *m, const lms_gpu_info *g)
{
    const char *base = (const char *)g + m->off;
    unsigned u32;
    uint64_t u64;
    double f64;
    lms_jsonw_printf(w, "%s{gpu=\"%u\"%s%s} ", m->name, g->index, m->label ? "," : "",
                     m->label ? m->label : "");
    switch (m->type) {
    case PROM_U32:
        memcpy(&u32, base, sizeof u32);
        lms_jsonw_printf(w, "%u\n", u32);
        break;
    case PROM_U64:
        memcpy(&u64, base, sizeof u64);
        lms_jsonw_printf(w, "%llu\n", (unsigned long long)u64);
        break;
    case PROM_F64:
        memcpy(&f64, base, sizeof f64);
        lms_jsonw_printf(w, "%.6g\n", f64);
        break;
    }
}

/* A label value: backslash, quote and newline escaped; bytes that are not
 * valid UTF-8 become '?'. */
static void label_value(lms_jsonw *w, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    lms_jsonw_raw(w, "\"", 1);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t used = lms_utf8_decode(p + i, n - i, &cp);
        if (cp == '\\' || cp == '"')
            lms_jsonw_printf(w, "\\%c", (char)cp);
        else if (cp == '\n')
            lms_jsonw_raw(w, "\\n", 2);
        else if (cp == 0xFFFD && used == 1)
            lms_jsonw_raw(w, "?", 1);
        else
            lms_jsonw_raw(w, s + i, used);
        i += used;
    }
    lms_jsonw_raw(w, "\"", 1);
}

static void throttle_family(lms_jsonw *w, const lms_gpu_snapshot *snap)
{
    header(w, "lmserv_gpu_throttled", "1 while NVML reports this clock throttle reason.");
    for (int i = 0; i < snap->n_gpus; i++) {
        const lms_gpu_info *g = &snap->gpus[i];
        if (!(g->fields & LMS_GPU_HAS_THROTTLE))
            continue;
        for (int b = 0; b < 64; b++) {
            const char *reason = lms_gpu_throttle_name(1ull << b);
            if (reason)
                lms_jsonw_printf(w, "lmserv_gpu_throttled{gpu=\"%u\",reason=\"%s\"} %d\n", g->index,
                                 reason, (g->throttle_reasons >> b) & 1 ? 1 : 0);
        }
    }
}

static void info_family(lms_jsonw *w, const lms_gpu_snapshot *snap)
{
    header(w, "lmserv_gpu_info", "Constant 1, labelled with the GPU name.");
    for (int i = 0; i < snap->n_gpus; i++) {
        lms_jsonw_printf(w, "lmserv_gpu_info{gpu=\"%u\",name=", snap->gpus[i].index);
        label_value(w, snap->gpus[i].name);
        lms_jsonw_cstr(w, "} 1\n");
    }
}

int lms_gpu_snapshot_prometheus(const lms_gpu_snapshot *snap, char *buf, size_t n)
{
    if (!buf || n == 0)
        return LMS_ERR_LIMIT;
    lms_jsonw w;
    lms_jsonw_init(&w, buf, n, n);
    header(&w, "lmserv_gpu_monitor_available", "1 when NVML is loaded and initialized.");
    lms_jsonw_printf(&w, "lmserv_gpu_monitor_available %d\n", snap->available ? 1 : 0);
    if (snap->available && snap->n_gpus > 0) {
        info_family(&w, snap);
        const char *prev = NULL;
        for (size_t m = 0; m < sizeof metrics / sizeof metrics[0]; m++) {
            if (!prev || strcmp(prev, metrics[m].name) != 0)
                header(&w, metrics[m].name, metrics[m].help);
            prev = metrics[m].name;
            for (int i = 0; i < snap->n_gpus; i++)
                if (snap->gpus[i].fields & metrics[m].field)
                    sample(&w, &metrics[m], &snap->gpus[i]);
        }
        throttle_family(&w, snap);
    }
    return lms_jsonw_result(&w);
}
