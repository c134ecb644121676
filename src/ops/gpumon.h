/*
 * gpumon.h - GPU monitor: NVIDIA's NVML loaded at run time with dlopen.
 *
 * There is no build dependency on CUDA or NVML: lms_gpumon_create() opens
 * the library, resolves the dozen functions it uses and initializes NVML.
 * Where NVML is absent (CPU-only hosts, containers without the driver) the
 * monitor reports available = false, logs one info line and nothing else.
 *
 * Library path, in order:
 *   1. the lib_path argument of lms_gpumon_create, if not NULL;
 *   2. the environment variable LMS_NVML_LIB (tests point it at a fake
 *      NVML; operators may use it for a driver installed off the loader path);
 *   3. "libnvidia-ml.so.1" through the normal dynamic loader search.
 *
 * Sampling is timer-driven, not a thread: whoever owns a periodic timer
 * (the server's 1-second timer on the I/O thread) calls lms_gpumon_poll(),
 * which reads every device and replaces the snapshot; readers on any
 * thread take a copy with lms_gpumon_snapshot(). No extra thread exists.
 *
 * Cost, and the idle budget: NVML reads are ioctls into the driver.
 * Measured on an H200 (one GPU, driver idle): a full poll costs 0.01 ms of
 * CPU back to back, but polls a second apart find the driver path cold and
 * a 1 Hz timer doing poll + thermal update + JSON costs about 9 ms of CPU
 * per minute - nearly all of the 10 ms an idle server may spend. (Before
 * unsupported values were skipped, the fan query alone - unsupported on
 * that card - made it 38 ms per minute.) So:
 *   - poll every second only while there is work (requests in flight) or
 *     someone watches (metrics subscribers), and once when work arrives,
 *     so thermal protection sees a fresh temperature before the first step;
 *   - while idle, do not poll; HTTP /metrics and /stats call
 *     lms_gpumon_poll_if_older(mon, 1000), which polls only if the
 *     snapshot is older than that.
 * Thermal protection loses nothing: an idle server does not heat the GPU.
 *
 * Values NVML cannot give on a device (fan speed on passively cooled data
 * centre cards, power on some consumer cards) are simply absent: each
 * lms_gpu_info says which fields it holds in `fields`. A value NVML calls
 * NOT_SUPPORTED is logged once (info) and never asked for again; a value
 * that read before and then fails is logged once (warn), not every poll.
 */
#ifndef LMS_OPS_GPUMON_H
#define LMS_OPS_GPUMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LMS_GPU_MAX 16      /* devices beyond this are ignored */
#define LMS_GPU_NAME_MAX 96 /* NVML names are at most 96 bytes with the NUL */

/* lms_gpu_info.fields bits: which values were read this poll. */
enum lms_gpu_field {
    LMS_GPU_HAS_TEMP = 1u << 0,
    LMS_GPU_HAS_MEMORY = 1u << 1,
    LMS_GPU_HAS_POWER = 1u << 2,
    LMS_GPU_HAS_FAN = 1u << 3,
    LMS_GPU_HAS_UTIL = 1u << 4,
    LMS_GPU_HAS_CLOCK_GRAPHICS = 1u << 5,
    LMS_GPU_HAS_CLOCK_SM = 1u << 6,
    LMS_GPU_HAS_CLOCK_MEM = 1u << 7,
    LMS_GPU_HAS_THROTTLE = 1u << 8,
};

/* Throttle reason bits as NVML reports them (nvmlClocksThrottleReason*). */
enum lms_gpu_throttle {
    LMS_GPU_THROTTLE_GPU_IDLE = 0x1,
    LMS_GPU_THROTTLE_APP_CLOCKS = 0x2,
    LMS_GPU_THROTTLE_SW_POWER_CAP = 0x4,
    LMS_GPU_THROTTLE_HW_SLOWDOWN = 0x8,
    LMS_GPU_THROTTLE_SYNC_BOOST = 0x10,
    LMS_GPU_THROTTLE_SW_THERMAL = 0x20,
    LMS_GPU_THROTTLE_HW_THERMAL = 0x40,
    LMS_GPU_THROTTLE_HW_POWER_BRAKE = 0x80,
    LMS_GPU_THROTTLE_DISPLAY_CLOCKS = 0x100,
};

/* One device at one poll. Values are meaningful only where `fields` says. */
typedef struct lms_gpu_info {
    unsigned index;              /* NVML device index */
    char name[LMS_GPU_NAME_MAX]; /* "NVIDIA GeForce GTX 1060 3GB" */
    uint32_t fields;             /* LMS_GPU_HAS_* */
    unsigned temp_c;             /* GPU core temperature, Celsius */
    uint64_t mem_total_bytes;    /* VRAM */
    uint64_t mem_used_bytes;
    uint64_t mem_free_bytes;
    double power_w;        /* board power draw, watts */
    unsigned fan_pct;      /* intended fan speed, percent */
    unsigned util_gpu_pct; /* busy time over the driver's last window */
    unsigned util_mem_pct; /* memory controller busy time */
    unsigned clock_graphics_mhz;
    unsigned clock_sm_mhz;
    unsigned clock_mem_mhz;
    uint64_t throttle_reasons; /* lms_gpu_throttle bits */
} lms_gpu_info;

/* Everything the monitor knows, copied out whole (about 3 KiB). */
typedef struct lms_gpu_snapshot {
    bool available;   /* NVML loaded and initialized */
    int n_gpus;       /* devices in gpus[] */
    uint64_t n_polls; /* polls so far; 0: no data yet */
    double poll_ms;   /* monotonic time (lms_now_ms) of the last poll */
    lms_gpu_info gpus[LMS_GPU_MAX];
} lms_gpu_snapshot;

typedef struct lms_gpumon lms_gpumon;

/* Opens NVML (see the path order above). Returns NULL only when out of
 * memory: a monitor without NVML is a valid monitor with available=false.
 * lib_path is not kept. */
lms_gpumon *lms_gpumon_create(const char *lib_path);

/* Shuts NVML down and closes the library. NULL is a no-op. */
void lms_gpumon_destroy(lms_gpumon *mon);

bool lms_gpumon_available(const lms_gpumon *mon);

/* Reads every device now and replaces the snapshot. Thread-safe (polls are
 * serialized). Returns the number of devices read, or LMS_ERR_UNSUPPORTED
 * when NVML is not available. */
int lms_gpumon_poll(lms_gpumon *mon);

/* lms_gpumon_poll unless the snapshot is younger than max_age_ms; returns
 * the number of devices either way (or LMS_ERR_UNSUPPORTED). For request
 * handlers that want fresh-enough values without polling per request. */
int lms_gpumon_poll_if_older(lms_gpumon *mon, double max_age_ms);

/* Copies the latest snapshot. Thread-safe; never calls NVML. */
void lms_gpumon_snapshot(lms_gpumon *mon, lms_gpu_snapshot *out);

/* Hottest temperature over the devices that have one; false if none. Feed
 * this to lms_thermal_update(). */
bool lms_gpu_snapshot_max_temp(const lms_gpu_snapshot *snap, double *temp_c);

/* snake_case name of one throttle bit ("sw_thermal_slowdown"), or NULL for
 * a bit this code does not know. */
const char *lms_gpu_throttle_name(uint64_t bit);

/* Renders the snapshot as one JSON object into buf[n]:
 *
 *   {"available":true,"gpus":[{"index":0,"name":"...","temp_c":63,
 *    "vram_total_bytes":..,"vram_used_bytes":..,"vram_free_bytes":..,
 *    "power_w":71.5,"fan_pct":40,"util_gpu_pct":97,"util_mem_pct":60,
 *    "clock_graphics_mhz":1980,"clock_sm_mhz":1980,"clock_mem_mhz":2619,
 *    "throttle_reasons":["sw_power_cap"]}]}
 *
 * Values a device lacks are null, so the shape never changes. Returns the
 * length written (NUL excluded) or LMS_ERR_LIMIT when buf is too small
 * (about 700 bytes per GPU is enough). */
int lms_gpu_snapshot_json(const lms_gpu_snapshot *snap, char *buf, size_t n);

/* Writes the Prometheus text exposition of the snapshot into buf[n] (for
 * GET /metrics): HELP and TYPE lines, then one sample per GPU, e.g.
 *
 *   lmserv_gpu_temperature_celsius{gpu="0"} 63
 *   lmserv_gpu_memory_used_bytes{gpu="0"} 1073741824
 *   lmserv_gpu_throttled{gpu="0",reason="sw_power_cap"} 1
 *
 * plus lmserv_gpu_monitor_available and lmserv_gpu_info{gpu,name} 1. Returns
 * the length written or LMS_ERR_LIMIT (about 2.5 KiB + 2 KiB per GPU). */
int lms_gpu_snapshot_prometheus(const lms_gpu_snapshot *snap, char *buf, size_t n);

#endif
