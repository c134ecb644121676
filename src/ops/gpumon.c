/*
 * gpumon.c - GPU monitor over NVML loaded with dlopen; see gpumon.h.
 *
 * The few NVML types used are declared here from the public API (NVML's
 * enums are int-sized, returns are 0 on success); nothing from the CUDA
 * toolkit is needed to build. Device handles and names are read once at
 * create; every poll reads the changing values of every device.
 *
 * Locking: one mutex serializes polls (NVML itself is thread-safe, but a
 * poll writes the snapshot) and guards the snapshot readers copy.
 */
#include "ops/gpumon.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/timeutil.h"
#include "ops/jsonw.h"
#include "ops/log.h"

/* ---- NVML, as much as we use ------------------------------------------- */

#define NVML_DEFAULT_LIB "libnvidia-ml.so.1"
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_TEMPERATURE_GPU 0
#define NVML_CLOCK_GRAPHICS 0
#define NVML_CLOCK_SM 1
#define NVML_CLOCK_MEM 2

typedef int nvml_ret; /* nvmlReturn_t: 0 is NVML_SUCCESS */
typedef struct nvml_device_st *nvml_device;
typedef struct {
    unsigned long long total, free, used;
} nvml_memory;
typedef struct {
    unsigned int gpu, memory;
} nvml_utilization;

struct nvml_api {
    nvml_ret (*init)(void);
    nvml_ret (*shutdown)(void);
    nvml_ret (*get_count)(unsigned *n);
    nvml_ret (*get_handle)(unsigned index, nvml_device *dev);
    nvml_ret (*get_name)(nvml_device dev, char *name, unsigned len);
    nvml_ret (*get_temperature)(nvml_device dev, int sensor, unsigned *temp_c);
    nvml_ret (*get_memory)(nvml_device dev, nvml_memory *mem);
    nvml_ret (*get_power)(nvml_device dev, unsigned *milliwatts);
    nvml_ret (*get_fan)(nvml_device dev, unsigned *pct);
    nvml_ret (*get_util)(nvml_device dev, nvml_utilization *util);
    nvml_ret (*get_clock)(nvml_device dev, int type, unsigned *mhz);
    nvml_ret (*get_throttle)(nvml_device dev, unsigned long long *reasons);
};

_Static_assert(sizeof(void *) == sizeof(void (*)(void)),
               "dlsym results stored as function pointers");

static const struct nvml_sym {
    const char *name;
    size_t off;    /* in struct nvml_api */
    bool required; /* without it there is no monitor at all */
} nvml_syms[] = {
    {"nvmlInit_v2", offsetof(struct nvml_api, init), true},
    {"nvmlShutdown", offsetof(struct nvml_api, shutdown), true},
    {"nvmlDeviceGetCount_v2", offsetof(struct nvml_api, get_count), true},
    {"nvmlDeviceGetHandleByIndex_v2", offsetof(struct nvml_api, get_handle), true},
    {"nvmlDeviceGetName", offsetof(struct nvml_api, get_name), false},
    {"nvmlDeviceGetTemperature", offsetof(struct nvml_api, get_temperature), false},
    {"nvmlDeviceGetMemoryInfo", offsetof(struct nvml_api, get_memory), false},
    {"nvmlDeviceGetPowerUsage", offsetof(struct nvml_api, get_power), false},
    {"nvmlDeviceGetFanSpeed", offsetof(struct nvml_api, get_fan), false},
    {"nvmlDeviceGetUtilizationRates", offsetof(struct nvml_api, get_util), false},
    {"nvmlDeviceGetClockInfo", offsetof(struct nvml_api, get_clock), false},
    {"nvmlDeviceGetCurrentClocksThrottleReasons", offsetof(struct nvml_api, get_throttle), false},
};

/* What we learned about one device (guarded by lms_gpumon.mu). */
struct gpu_dev {
    nvml_device h;
    uint32_t last_fields; /* read at the previous poll: log a lost one once */
    uint32_t unsupported; /* NVML said NOT_SUPPORTED: never asked again. On an
                             H200 the unsupported fan query alone costs 0.5 ms
                             of CPU per call, more than all other reads. */
};

struct lms_gpumon {
    pthread_mutex_t mu;
    void *dl; /* dlopen handle; NULL when unavailable */
    struct nvml_api api;
    unsigned n_dev;
    struct gpu_dev dev[LMS_GPU_MAX];
    lms_gpu_snapshot snap; /* guarded by mu */
};

/* ---- opening ------------------------------------------------------------ */

/* Resolves the symbols; returns the first missing required name or NULL. */
static const char *resolve(void *dl, struct nvml_api *api)
{
    for (size_t i = 0; i < sizeof nvml_syms / sizeof nvml_syms[0]; i++) {
        void *sym = dlsym(dl, nvml_syms[i].name);
        if (!sym && nvml_syms[i].required)
            return nvml_syms[i].name;
        memcpy((char *)api + nvml_syms[i].off, &sym, sizeof sym);
    }
    return NULL;
}

/* dlopen + dlsym + nvmlInit; on failure fills why[] and leaves mon->dl NULL. */
static void nvml_open(lms_gpumon *mon, const char *path, char *why, size_t why_n)
{
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *e = dlerror();
        snprintf(why, why_n, "%s", e ? e : "dlopen failed");
        return;
    }
    const char *missing = resolve(dl, &mon->api);
    if (missing) {
        snprintf(why, why_n, "%s: no symbol %s", path, missing);
        dlclose(dl);
        return;
    }
    nvml_ret rc = mon->api.init();
    if (rc != 0) {
        snprintf(why, why_n, "nvmlInit_v2 returned %d", rc);
        dlclose(dl);
        return;
    }
    mon->dl = dl;
}

static void find_devices(lms_gpumon *mon)
{
    unsigned n = 0;
    if (mon->api.get_count(&n) != 0)
        n = 0;
    for (unsigned i = 0; i < n && mon->n_dev < LMS_GPU_MAX; i++) {
        nvml_device d;
        if (mon->api.get_handle(i, &d) != 0)
            continue;
        lms_gpu_info *g = &mon->snap.gpus[mon->n_dev];
        g->index = i;
        snprintf(g->name, sizeof g->name, "GPU %u", i);
        if (mon->api.get_name && mon->api.get_name(d, g->name, sizeof g->name) != 0)
            snprintf(g->name, sizeof g->name, "GPU %u", i);
        g->name[sizeof g->name - 1] = '\0';
        mon->dev[mon->n_dev++].h = d;
        lms_log(LMS_LOG_INFO, "gpu_found", "gpu", LMS_LOG_U64(i), "name", LMS_LOG_STR(g->name));
    }
    mon->snap.n_gpus = (int)mon->n_dev;
}

lms_gpumon *lms_gpumon_create(const char *lib_path)
{
    lms_gpumon *mon = calloc(1, sizeof *mon);
    if (!mon)
        return NULL;
    pthread_mutex_init(&mon->mu, NULL);
    const char *path = lib_path;
    if (!path)
        path = getenv("LMS_NVML_LIB");
    if (!path || !path[0])
        path = NVML_DEFAULT_LIB;

    char why[512] = "";
    nvml_open(mon, path, why, sizeof why);
    if (!mon->dl) {
        lms_log(LMS_LOG_INFO, "gpumon_unavailable", "lib", LMS_LOG_STR(path), "reason",
                LMS_LOG_STR(why));
        return mon;
    }
    mon->snap.available = true;
    find_devices(mon);
    lms_log(LMS_LOG_INFO, "gpumon_ready", "lib", LMS_LOG_STR(path), "n_gpus",
            LMS_LOG_U64(mon->n_dev));
    return mon;
}

void lms_gpumon_destroy(lms_gpumon *mon)
{
    if (!mon)
        return;
    if (mon->dl) {
        mon->api.shutdown();
        dlclose(mon->dl);
    }
    pthread_mutex_destroy(&mon->mu);
    free(mon);
}

bool lms_gpumon_available(const lms_gpumon *mon)
{
    return mon && mon->dl;
}

/* ---- polling ------------------------------------------------------------ */

static bool want(const struct gpu_dev *dv, bool have_fn, uint32_t field)
{
    return have_fn && !(dv->unsupported & field);
}

/* Records the outcome of one read of `field`; true when it succeeded. */
static bool got(struct gpu_dev *dv, lms_gpu_info *g, uint32_t field, nvml_ret rc)
{
    if (rc == 0) {
        g->fields |= field;
        return true;
    }
    if (rc == NVML_ERROR_NOT_SUPPORTED)
        dv->unsupported |= field;
    return false;
}

static void read_clocks(const struct nvml_api *api, struct gpu_dev *dv, lms_gpu_info *g)
{
    static const struct {
        int type;
        uint32_t field;
        size_t off;
    } clocks[] = {
        {NVML_CLOCK_GRAPHICS, LMS_GPU_HAS_CLOCK_GRAPHICS,
         offsetof(lms_gpu_info, clock_graphics_mhz)},
        {NVML_CLOCK_SM, LMS_GPU_HAS_CLOCK_SM, offsetof(lms_gpu_info, clock_sm_mhz)},
        {NVML_CLOCK_MEM, LMS_GPU_HAS_CLOCK_MEM, offsetof(lms_gpu_info, clock_mem_mhz)},
    };
    for (size_t i = 0; i < sizeof clocks / sizeof clocks[0]; i++) {
        unsigned mhz;
        if (want(dv, api->get_clock, clocks[i].field) &&
            got(dv, g, clocks[i].field, api->get_clock(dv->h, clocks[i].type, &mhz)))
            memcpy((char *)g + clocks[i].off, &mhz, sizeof mhz);
    }
}

/* Reads one device's changing values; name and index stay as they are. */
static void read_device(const struct nvml_api *api, struct gpu_dev *dv, lms_gpu_info *g)
{
    nvml_device d = dv->h;
    unsigned u;
    nvml_memory mem;
    nvml_utilization util;
    unsigned long long reasons;

    g->fields = 0;
    if (want(dv, api->get_temperature, LMS_GPU_HAS_TEMP) &&
        got(dv, g, LMS_GPU_HAS_TEMP, api->get_temperature(d, NVML_TEMPERATURE_GPU, &u)))
        g->temp_c = u;
    if (want(dv, api->get_memory, LMS_GPU_HAS_MEMORY) &&
        got(dv, g, LMS_GPU_HAS_MEMORY, api->get_memory(d, &mem))) {
        g->mem_total_bytes = mem.total;
        g->mem_used_bytes = mem.used;
        g->mem_free_bytes = mem.free;
    }
    if (want(dv, api->get_power, LMS_GPU_HAS_POWER) &&
        got(dv, g, LMS_GPU_HAS_POWER, api->get_power(d, &u)))
        g->power_w = (double)u / 1000.0; /* NVML reports milliwatts */
    if (want(dv, api->get_fan, LMS_GPU_HAS_FAN) && got(dv, g, LMS_GPU_HAS_FAN, api->get_fan(d, &u)))
        g->fan_pct = u;
    if (want(dv, api->get_util, LMS_GPU_HAS_UTIL) &&
        got(dv, g, LMS_GPU_HAS_UTIL, api->get_util(d, &util))) {
        g->util_gpu_pct = util.gpu;
        g->util_mem_pct = util.memory;
    }
    read_clocks(api, dv, g);
    if (want(dv, api->get_throttle, LMS_GPU_HAS_THROTTLE) &&
        got(dv, g, LMS_GPU_HAS_THROTTLE, api->get_throttle(d, &reasons)))
        g->throttle_reasons = reasons;
}

static const char *const field_names[] = {
    "temp", "memory", "power", "fan", "util", "clock_graphics", "clock_sm", "clock_mem", "throttle",
};

/* One line naming the fields in `mask`: lost ones (warn) or ones the device
 * does not support (info), each logged once, not every poll. */
static void log_fields(lms_log_level level, const char *event, const lms_gpu_info *g, uint32_t mask)
{
    lms_log_rec r;
    if (!lms_log_begin(&r, level, event))
        return;
    lms_log_add(&r, "gpu", LMS_LOG_U64(g->index));
    for (size_t i = 0; i < sizeof field_names / sizeof field_names[0]; i++)
        if (mask & (1u << i))
            lms_log_add(&r, field_names[i], LMS_LOG_BOOL(false));
    lms_log_end(&r);
}

int lms_gpumon_poll(lms_gpumon *mon)
{
    if (!mon || !mon->dl)
        return LMS_ERR_UNSUPPORTED;
    pthread_mutex_lock(&mon->mu);
    for (unsigned i = 0; i < mon->n_dev; i++) {
        struct gpu_dev *dv = &mon->dev[i];
        lms_gpu_info *g = &mon->snap.gpus[i];
        uint32_t was_unsupported = dv->unsupported;
        read_device(&mon->api, dv, g);
        if (dv->unsupported & ~was_unsupported)
            log_fields(LMS_LOG_INFO, "gpu_unsupported", g, dv->unsupported & ~was_unsupported);
        uint32_t lost = dv->last_fields & ~g->fields;
        if (lost)
            log_fields(LMS_LOG_WARN, "gpu_read_failed", g, lost);
        dv->last_fields = g->fields;
    }
    mon->snap.n_polls++;
    mon->snap.poll_ms = lms_now_ms();
    pthread_mutex_unlock(&mon->mu);
    return (int)mon->n_dev;
}

int lms_gpumon_poll_if_older(lms_gpumon *mon, double max_age_ms)
{
    if (!mon || !mon->dl)
        return LMS_ERR_UNSUPPORTED;
    pthread_mutex_lock(&mon->mu);
    bool fresh = mon->snap.n_polls > 0 && lms_now_ms() - mon->snap.poll_ms < max_age_ms;
    pthread_mutex_unlock(&mon->mu);
    return fresh ? (int)mon->n_dev : lms_gpumon_poll(mon);
}

void lms_gpumon_snapshot(lms_gpumon *mon, lms_gpu_snapshot *out)
{
    if (!mon) {
        memset(out, 0, sizeof *out);
        return;
    }
    pthread_mutex_lock(&mon->mu);
    *out = mon->snap;
    pthread_mutex_unlock(&mon->mu);
}

bool lms_gpu_snapshot_max_temp(const lms_gpu_snapshot *snap, double *temp_c)
{
    bool any = false;
    double hottest = 0;
    for (int i = 0; snap->available && i < snap->n_gpus; i++) {
        const lms_gpu_info *g = &snap->gpus[i];
        if (!(g->fields & LMS_GPU_HAS_TEMP))
            continue;
        if (!any || g->temp_c > hottest)
            hottest = g->temp_c;
        any = true;
    }
    if (any)
        *temp_c = hottest;
    return any;
}

static const struct {
    uint64_t bit;
    const char *name;
} throttle_names[] = {
    {LMS_GPU_THROTTLE_GPU_IDLE, "gpu_idle"},
    {LMS_GPU_THROTTLE_APP_CLOCKS, "applications_clocks_setting"},
    {LMS_GPU_THROTTLE_SW_POWER_CAP, "sw_power_cap"},
    {LMS_GPU_THROTTLE_HW_SLOWDOWN, "hw_slowdown"},
    {LMS_GPU_THROTTLE_SYNC_BOOST, "sync_boost"},
    {LMS_GPU_THROTTLE_SW_THERMAL, "sw_thermal_slowdown"},
    {LMS_GPU_THROTTLE_HW_THERMAL, "hw_thermal_slowdown"},
    {LMS_GPU_THROTTLE_HW_POWER_BRAKE, "hw_power_brake_slowdown"},
    {LMS_GPU_THROTTLE_DISPLAY_CLOCKS, "display_clock_setting"},
};
#define N_THROTTLE (sizeof throttle_names / sizeof throttle_names[0])

const char *lms_gpu_throttle_name(uint64_t bit)
{
    for (size_t i = 0; i < N_THROTTLE; i++)
        if (throttle_names[i].bit == bit)
            return throttle_names[i].name;
    return NULL;
}

/* ---- JSON --------------------------------------------------------------- */

static void json_u64(lms_jsonw *w, const char *key, bool has, uint64_t v)
{
    if (has)
        lms_jsonw_printf(w, ",\"%s\":%llu", key, (unsigned long long)v);
    else
        lms_jsonw_printf(w, ",\"%s\":null", key);
}

static void json_throttle(lms_jsonw *w, const lms_gpu_info *g)
{
    if (!(g->fields & LMS_GPU_HAS_THROTTLE)) {
        lms_jsonw_cstr(w, ",\"throttle_reasons\":null");
        return;
    }
    lms_jsonw_cstr(w, ",\"throttle_reasons\":[");
    bool first = true;
    for (size_t i = 0; i < N_THROTTLE; i++) {
        if (!(g->throttle_reasons & throttle_names[i].bit))
            continue;
        lms_jsonw_printf(w, "%s\"%s\"", first ? "" : ",", throttle_names[i].name);
        first = false;
    }
    lms_jsonw_cstr(w, "]");
}

static void json_gpu(lms_jsonw *w, const lms_gpu_info *g)
{
    uint32_t f = g->fields;
    lms_jsonw_printf(w, "{\"index\":%u,\"name\":", g->index);
    lms_jsonw_str(w, g->name, strlen(g->name));
    json_u64(w, "temp_c", f & LMS_GPU_HAS_TEMP, g->temp_c);
    json_u64(w, "vram_total_bytes", f & LMS_GPU_HAS_MEMORY, g->mem_total_bytes);
    json_u64(w, "vram_used_bytes", f & LMS_GPU_HAS_MEMORY, g->mem_used_bytes);
    json_u64(w, "vram_free_bytes", f & LMS_GPU_HAS_MEMORY, g->mem_free_bytes);
    lms_jsonw_cstr(w, ",\"power_w\":");
    lms_jsonw_f64(w, (f & LMS_GPU_HAS_POWER) ? g->power_w : (double)NAN);
    json_u64(w, "fan_pct", f & LMS_GPU_HAS_FAN, g->fan_pct);
    json_u64(w, "util_gpu_pct", f & LMS_GPU_HAS_UTIL, g->util_gpu_pct);
    json_u64(w, "util_mem_pct", f & LMS_GPU_HAS_UTIL, g->util_mem_pct);
    json_u64(w, "clock_graphics_mhz", f & LMS_GPU_HAS_CLOCK_GRAPHICS, g->clock_graphics_mhz);
    json_u64(w, "clock_sm_mhz", f & LMS_GPU_HAS_CLOCK_SM, g->clock_sm_mhz);
    json_u64(w, "clock_mem_mhz", f & LMS_GPU_HAS_CLOCK_MEM, g->clock_mem_mhz);
    json_throttle(w, g);
    lms_jsonw_cstr(w, "}");
}

int lms_gpu_snapshot_json(const lms_gpu_snapshot *snap, char *buf, size_t n)
{
    if (!buf || n == 0)
        return LMS_ERR_LIMIT;
    lms_jsonw w;
    lms_jsonw_init(&w, buf, n, n);
    lms_jsonw_printf(&w, "{\"available\":%s,\"gpus\":[", snap->available ? "true" : "false");
    for (int i = 0; snap->available && i < snap->n_gpus; i++) {
        if (i)
            lms_jsonw_cstr(&w, ",");
        json_gpu(&w, &snap->gpus[i]);
    }
    lms_jsonw_cstr(&w, "]}");
    return lms_jsonw_result(&w);
}
