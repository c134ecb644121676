/*
 * fake_nvml.c - a stand-in for libnvidia-ml.so.1, built as a shared library
 * for unit/test_gpumon and loaded by the GPU monitor through LMS_NVML_LIB.
 *
 * It exports the NVML functions gpumon resolves, with the same C signatures
 * (enums as int). The test steers the values through environment variables,
 * read at every call, so setenv() between two polls changes what the next
 * poll sees:
 *
 *   FAKE_NVML_INIT_FAIL=1   nvmlInit_v2 fails (NVML_ERROR_DRIVER_NOT_LOADED)
 *   FAKE_NVML_COUNT=n       number of devices (default 1, at most 8)
 *   FAKE_NVML_TEMP=t        temperature of device 0; device i reads t - i
 *                           (default 50)
 *   FAKE_NVML_NO_FAN=1      fan speed is NOT_SUPPORTED (passively cooled)
 *   FAKE_NVML_THROTTLE=x    throttle reason bits, hex (default 0x24)
 *
 * Fixed values per device i: name "Fake GPU i", 8 GiB total, (1 + i) GiB
 * used, 150.5 W, fan 40 %, utilization 42 % / 17 %, clocks 1500 (graphics),
 * 1600 (SM), 7000 (memory) MHz. fake_nvml_init_count() lets the test check
 * that every nvmlInit_v2 was matched by nvmlShutdown; fake_nvml_fan_calls()
 * that an unsupported value is not asked for again.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_SUCCESS 0
#define FAKE_ERROR_INVALID_ARGUMENT 2
#define FAKE_ERROR_NOT_SUPPORTED 3
#define FAKE_ERROR_DRIVER_NOT_LOADED 9
#define FAKE_MAX_DEV 8

typedef struct fake_device {
    unsigned index;
} * nvml_device;
typedef struct {
    unsigned long long total, free, used;
} nvml_memory;
typedef struct {
    unsigned int gpu, memory;
} nvml_utilization;

/* Prototypes: these are the library's exports. */
int nvmlInit_v2(void);
int nvmlShutdown(void);
int nvmlDeviceGetCount_v2(unsigned *n);
int nvmlDeviceGetHandleByIndex_v2(unsigned index, nvml_device *dev);
int nvmlDeviceGetName(nvml_device dev, char *name, unsigned len);
int nvmlDeviceGetTemperature(nvml_device dev, int sensor, unsigned *temp);
int nvmlDeviceGetMemoryInfo(nvml_device dev, nvml_memory *mem);
int nvmlDeviceGetPowerUsage(nvml_device dev, unsigned *milliwatts);
int nvmlDeviceGetFanSpeed(nvml_device dev, unsigned *pct);
int nvmlDeviceGetUtilizationRates(nvml_device dev, nvml_utilization *util);
int nvmlDeviceGetClockInfo(nvml_device dev, int type, unsigned *mhz);
int nvmlDeviceGetCurrentClocksThrottleReasons(nvml_device dev, unsigned long long *reasons);
int fake_nvml_init_count(void);
int fake_nvml_fan_calls(void);

static struct fake_device devices[FAKE_MAX_DEV];
static int init_count;
static int fan_calls;

static long env_long(const char *name, long def, int base)
{
    const char *s = getenv(name);
    return s && *s ? strtol(s, NULL, base) : def;
}

static unsigned n_devices(void)
{
    long n = env_long("FAKE_NVML_COUNT", 1, 10);
    return n < 0 ? 0 : n > FAKE_MAX_DEV ? FAKE_MAX_DEV : (unsigned)n;
}

int nvmlInit_v2(void)
{
    if (env_long("FAKE_NVML_INIT_FAIL", 0, 10))
        return FAKE_ERROR_DRIVER_NOT_LOADED;
    init_count++;
    return FAKE_SUCCESS;
}

int nvmlShutdown(void)
{
    init_count--;
    return FAKE_SUCCESS;
}

int fake_nvml_init_count(void)
{
    return init_count;
}

int fake_nvml_fan_calls(void)
{
    return fan_calls;
}

int nvmlDeviceGetCount_v2(unsigned *n)
{
    *n = n_devices();
    return FAKE_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, nvml_device *dev)
{
    if (index >= n_devices())
        return FAKE_ERROR_INVALID_ARGUMENT;
    devices[index].index = index;
    *dev = &devices[index];
    return FAKE_SUCCESS;
}

int nvmlDeviceGetName(nvml_device dev, char *name, unsigned len)
{
    snprintf(name, len, "Fake GPU %u", dev->index);
    return FAKE_SUCCESS;
}

int nvmlDeviceGetTemperature(nvml_device dev, int sensor, unsigned *temp)
{
    if (sensor != 0)
        return FAKE_ERROR_INVALID_ARGUMENT;
    *temp = (unsigned)(env_long("FAKE_NVML_TEMP", 50, 10) - (long)dev->index);
    return FAKE_SUCCESS;
}

int nvmlDeviceGetMemoryInfo(nvml_device dev, nvml_memory *mem)
{
    mem->total = 8ull << 30;
    mem->used = (1ull + dev->index) << 30;
    mem->free = mem->total - mem->used;
    return FAKE_SUCCESS;
}

int nvmlDeviceGetPowerUsage(nvml_device dev, unsigned *milliwatts)
{
    *milliwatts = 150500;
    return FAKE_SUCCESS;
}

int nvmlDeviceGetFanSpeed(nvml_device dev, unsigned *pct)
{
    fan_calls++;
    if (env_long("FAKE_NVML_NO_FAN", 0, 10))
        return FAKE_ERROR_NOT_SUPPORTED;
    *pct = 40;
    return FAKE_SUCCESS;
}

int nvmlDeviceGetUtilizationRates(nvml_device dev, nvml_utilization *util)
{
    util->gpu = 42;
    util->memory = 17;
    return FAKE_SUCCESS;
}

int nvmlDeviceGetClockInfo(nvml_device dev, int type, unsigned *mhz)
{
    static const unsigned clocks[] = {1500, 1600, 7000}; /* graphics, SM, memory */
    if (type < 0 || type > 2)
        return FAKE_ERROR_INVALID_ARGUMENT;
    *mhz = clocks[type];
    return FAKE_SUCCESS;
}

int nvmlDeviceGetCurrentClocksThrottleReasons(nvml_device dev, unsigned long long *reasons)
{
    *reasons = (unsigned long long)env_long("FAKE_NVML_THROTTLE", 0x24, 16);
    return FAKE_SUCCESS;
}
