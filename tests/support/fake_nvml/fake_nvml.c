/*
 * A scripted stand-in for NVIDIA's libnvidia-ml.so.1, for tests on machines without a GPU.
 *
 * It exports the NVML entry points that lmperf (through nvml-wrapper 0.13) calls, with the
 * struct layouts of the public nvml.h (nvml-wrapper-sys 0.10's bindings are the reference),
 * and answers them from a JSON script named in LMPERF_FAKE_NVML_SCRIPT: devices and their
 * values as functions of the time since the process's first nvmlInit, per-call faults (an
 * error code, a sleep), XID events at times, processes. See README.md for the format.
 *
 * Build: build.sh DIR [SYMBOL...] (cargo xtask fake-nvml DIR, lmperf_e2e::fake_nvml::library in
 * tests): cc -shared -fPIC, -z nodelete (the state outlives nvml-wrapper's dlclose), and a
 * version script exporting nvml* only, minus the SYMBOLs (an older driver; README.md).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "vendor/cjson/cJSON.h"

#define EXPORT __attribute__((visibility("default")))

/* ---- nvml.h types (layouts as in nvml.h / nvml-wrapper-sys bindings.rs) ---- */
typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

struct fake_device;
typedef struct fake_device *nvmlDevice_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define NVML_MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

struct fake_event_set;
typedef struct fake_event_set *nvmlEventSet_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

#define NVML_EVENT_TYPE_XID_CRITICAL_ERROR 0x8ULL
#define NVML_VALUE_NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFULL
#define NO_INSTANCE 0xFFFFFFFFu

/* Layout checks: a wrong layout here would hide the bugs this library exists to find. */
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t (v2/v3)");
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "nvmlProcessUtilizationSample_t");
_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t");

/* ---- script state ---- */
#define MAX_DEVICES 16
#define MAX_XIDS 256
#define MAX_FAULTS 64

struct fake_device {
    int index; /* a MIG device carries its parent's */
    cJSON *json;
    int mig_first, mig_n; /* a GPU's MIG devices: migs[mig_first .. mig_first + mig_n) */
};

struct xid {
    int device;
    double at;
    unsigned long long code;
    int delivered;
};

struct fault {
    const char *call; /* "*" matches every call */
    int device;       /* -1: any */
    double from, until;
    nvmlReturn_t error; /* NVML_SUCCESS: only sleep */
    double sleep_s;
    long count; /* calls it still applies to; -1: unlimited */
};

struct fake_event_set {
    unsigned long long mask[MAX_DEVICES];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int loaded;
static cJSON *script;
static struct fake_device devices[MAX_DEVICES];
static int device_count;
#define MAX_MIGS 64
static struct fake_device migs[MAX_MIGS];
static int mig_count;
static struct xid xids[MAX_XIDS];
static int xid_count;
static struct fault faults[MAX_FAULTS];
static int fault_count;
static int init_refs;
static struct timespec t0;
static int t0_set;

static void logf_(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("fake-nvml: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (!t0_set) return 0.0;
    return (double)(ts.tv_sec - t0.tv_sec) + (double)(ts.tv_nsec - t0.tv_nsec) / 1e9;
}

static unsigned long long unix_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL;
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

static const struct {
    const char *name;
    nvmlReturn_t code;
} ERRORS[] = {
    {"SUCCESS", NVML_SUCCESS},
    {"UNINITIALIZED", NVML_ERROR_UNINITIALIZED},
    {"INVALID_ARGUMENT", NVML_ERROR_INVALID_ARGUMENT},
    {"NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED},
    {"NO_PERMISSION", NVML_ERROR_NO_PERMISSION},
    {"NOT_FOUND", NVML_ERROR_NOT_FOUND},
    {"INSUFFICIENT_SIZE", NVML_ERROR_INSUFFICIENT_SIZE},
    {"DRIVER_NOT_LOADED", NVML_ERROR_DRIVER_NOT_LOADED},
    {"TIMEOUT", NVML_ERROR_TIMEOUT},
    {"FUNCTION_NOT_FOUND", NVML_ERROR_FUNCTION_NOT_FOUND},
    {"GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST},
    {"ARGUMENT_VERSION_MISMATCH", NVML_ERROR_ARGUMENT_VERSION_MISMATCH},
    {"UNKNOWN", NVML_ERROR_UNKNOWN},
};

static int parse_error(const cJSON *e, nvmlReturn_t *out) {
    if (cJSON_IsNumber(e)) {
        *out = (nvmlReturn_t)e->valuedouble;
        return 1;
    }
    if (cJSON_IsString(e)) {
        const char *s = e->valuestring;
        if (strncmp(s, "NVML_ERROR_", 11) == 0) s += 11;
        for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++) {
            if (strcmp(ERRORS[i].name, s) == 0) {
                *out = ERRORS[i].code;
                return 1;
            }
        }
    }
    return 0;
}

static double num_or(const cJSON *o, const char *key, double dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* Device fields the library reads (README.md); any other key is a typo, reported on stderr. */
static const char *DEVICE_KEYS[] = {
    "name", "uuid", "pci_bus_id", "mig_mode", "utilization_gpu_pct", "utilization_memory_pct", "memory_total_bytes",
    "memory_used_bytes", "power_mw", "power_limit_mw", "energy_mj", "temperature_c", "clock_graphics_mhz", "clock_sm_mhz",
    "clock_memory_mhz", "clock_video_mhz", "max_clock_graphics_mhz", "max_clock_sm_mhz", "max_clock_memory_mhz",
    "max_clock_video_mhz", "throttle_reasons", "pcie_tx_kb_s", "pcie_rx_kb_s", "pcie_replays", "ecc_corrected",
    "ecc_uncorrected", "processes", "process_sample_period_s", "xids", "lost", "mig_devices", "comment", NULL,
};

static void check_keys(const cJSON *obj, const char *where) {
    const cJSON *k;
    cJSON_ArrayForEach(k, obj) {
        int known = 0;
        for (const char **p = DEVICE_KEYS; *p; p++) known |= strcmp(*p, k->string) == 0;
        if (!known) logf_("%s.%s: unknown field (ignored; see README.md)", where, k->string);
    }
}

/* Reads and checks the script once; 0 on success. Errors go to stderr with the field. */
static int load_script(void) {
    if (loaded) return script ? 0 : -1;
    loaded = 1;
    const char *path = getenv("LMPERF_FAKE_NVML_SCRIPT");
    if (!path || !*path) {
        logf_("LMPERF_FAKE_NVML_SCRIPT is not set: nvmlInit answers DRIVER_NOT_LOADED");
        return -1;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        logf_("cannot open the script %s: %s", path, strerror(errno));
        return -1;
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *p = realloc(text, cap);
            if (!p) {
                free(text);
                fclose(f);
                return -1;
            }
            text = p;
        }
        size_t n = fread(text + len, 1, 4096, f);
        len += n;
        if (n == 0) break;
    }
    fclose(f);
    text[len] = 0;
    cJSON *root = cJSON_Parse(text);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        logf_("the script %s is not valid JSON near: %.40s", path, at ? at : "?");
        free(text);
        return -1;
    }
    free(text);
    const cJSON *devs = cJSON_GetObjectItemCaseSensitive(root, "devices");
    if (!cJSON_IsArray(devs)) {
        logf_("the script %s has no \"devices\" array", path);
        cJSON_Delete(root);
        return -1;
    }
    const cJSON *d;
    cJSON_ArrayForEach(d, devs) {
        if (device_count == MAX_DEVICES) {
            logf_("more than %d devices in the script: the rest are ignored", MAX_DEVICES);
            break;
        }
        if (!cJSON_IsObject(d)) {
            logf_("devices[%d] is not an object", device_count);
            cJSON_Delete(root);
            return -1;
        }
        char where[64];
        snprintf(where, sizeof where, "devices[%d]", device_count);
        check_keys(d, where);
        devices[device_count].index = device_count;
        devices[device_count].json = (cJSON *)d;
        devices[device_count].mig_first = mig_count;
        devices[device_count].mig_n = 0;
        const cJSON *ms = cJSON_GetObjectItemCaseSensitive(d, "mig_devices");
        const cJSON *m;
        cJSON_ArrayForEach(m, ms) {
            if (mig_count == MAX_MIGS) break;
            snprintf(where, sizeof where, "devices[%d].mig_devices[%d]", device_count, devices[device_count].mig_n);
            check_keys(m, where);
            migs[mig_count].index = device_count;
            migs[mig_count].json = (cJSON *)m;
            migs[mig_count].mig_first = 0;
            migs[mig_count].mig_n = 0;
            mig_count++;
            devices[device_count].mig_n++;
        }
        const cJSON *xs = cJSON_GetObjectItemCaseSensitive(d, "xids");
        const cJSON *x;
        cJSON_ArrayForEach(x, xs) {
            if (xid_count == MAX_XIDS) break;
            xids[xid_count].device = device_count;
            xids[xid_count].at = num_or(x, "at", 0);
            xids[xid_count].code = (unsigned long long)num_or(x, "code", 999);
            xids[xid_count].delivered = 0;
            xid_count++;
        }
        device_count++;
    }
    check_keys(cJSON_GetObjectItemCaseSensitive(root, "defaults"), "defaults");
    const cJSON *fs = cJSON_GetObjectItemCaseSensitive(root, "faults");
    const cJSON *fa;
    int i = 0;
    cJSON_ArrayForEach(fa, fs) {
        if (fault_count == MAX_FAULTS) break;
        struct fault *ft = &faults[fault_count];
        const cJSON *call = cJSON_GetObjectItemCaseSensitive(fa, "call");
        if (!cJSON_IsString(call)) {
            logf_("faults[%d].call is missing (an NVML function name, or \"*\")", i);
            cJSON_Delete(root);
            return -1;
        }
        ft->call = call->valuestring;
        ft->device = (int)num_or(fa, "device", -1);
        ft->from = num_or(fa, "from", 0);
        ft->until = num_or(fa, "until", INFINITY);
        ft->sleep_s = num_or(fa, "sleep_s", 0);
        ft->count = (long)num_or(fa, "count", -1);
        ft->error = NVML_SUCCESS;
        const cJSON *err = cJSON_GetObjectItemCaseSensitive(fa, "error");
        if (err && !parse_error(err, &ft->error)) {
            logf_("faults[%d].error: unknown error %s", i, cJSON_IsString(err) ? err->valuestring : "(not a string)");
            cJSON_Delete(root);
            return -1;
        }
        fault_count++;
        i++;
    }
    script = root;
    return 0;
}

/*
 * A value at time t: a number (constant); {"steps": [[t, v], ...]} (v of the last step at or
 * before t, the first one's before it); {"ramp": {"t0", "v0", "t1", "v1"}} (linear, held
 * outside); {"rate": {"start", "per_s"}} (start + per_s × t); {"file": PATH, "default": v}
 * (the number in PATH at the call, else default).
 */
static int eval(const cJSON *v, double t, double *out) {
    if (cJSON_IsNumber(v)) {
        *out = v->valuedouble;
        return 1;
    }
    if (!cJSON_IsObject(v)) return 0;
    const cJSON *k;
    if ((k = cJSON_GetObjectItemCaseSensitive(v, "steps"))) {
        int found = 0;
        const cJSON *p;
        cJSON_ArrayForEach(p, k) {
            const cJSON *pt = cJSON_GetArrayItem(p, 0), *pv = cJSON_GetArrayItem(p, 1);
            if (!cJSON_IsNumber(pt) || !cJSON_IsNumber(pv)) continue;
            if (!found || pt->valuedouble <= t) {
                *out = pv->valuedouble;
                found = 1;
            }
        }
        return found;
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(v, "ramp"))) {
        double a = num_or(k, "t0", 0), b = num_or(k, "t1", 0), va = num_or(k, "v0", 0), vb = num_or(k, "v1", 0);
        if (t <= a || b <= a) *out = t <= a ? va : vb;
        else if (t >= b) *out = vb;
        else *out = va + (vb - va) * (t - a) / (b - a);
        return 1;
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(v, "rate"))) {
        *out = num_or(k, "start", 0) + num_or(k, "per_s", 0) * t;
        return 1;
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(v, "file"))) {
        *out = num_or(v, "default", 0);
        if (cJSON_IsString(k)) {
            FILE *f = fopen(k->valuestring, "r");
            if (f) {
                double x;
                if (fscanf(f, "%lf", &x) == 1) *out = x;
                fclose(f);
            }
        }
        return 1;
    }
    return 0;
}

/* A device field: the device's, else the script's "defaults"; 0 when neither has it. */
static const cJSON *field_json(const struct fake_device *d, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(d->json, name);
    if (!v) v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(script, "defaults"), name);
    return v;
}

/* The field's value now: NVML_SUCCESS, or NOT_SUPPORTED when the script does not give it. */
static nvmlReturn_t field(const struct fake_device *d, const char *name, double *out) {
    const cJSON *v = field_json(d, name);
    if (!v || !eval(v, now_s(), out)) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

static int within(const cJSON *o, double t) {
    return t >= num_or(o, "from", 0) && t < num_or(o, "until", INFINITY);
}

static int device_lost(const struct fake_device *d, double t) {
    const cJSON *l = field_json(d, "lost");
    const cJSON *w;
    cJSON_ArrayForEach(w, l) {
        if (within(w, t)) return 1;
    }
    return 0;
}

static int valid_device(nvmlDevice_t d) {
    return (d >= devices && d < devices + device_count) || (d >= migs && d < migs + mig_count);
}

/*
 * Every entry point starts here: initialized?, the faults scripted for this call (a sleep
 * first, then an error), a lost device. `dev` is -1 for calls about no device.
 */
static nvmlReturn_t enter(const char *call, int dev) {
    pthread_mutex_lock(&lock);
    if (init_refs == 0) {
        pthread_mutex_unlock(&lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    double t = now_s();
    double sleep_for = 0;
    nvmlReturn_t err = NVML_SUCCESS;
    for (int i = 0; i < fault_count; i++) {
        struct fault *f = &faults[i];
        if (f->count == 0) continue;
        if (strcmp(f->call, "*") != 0 && strcmp(f->call, call) != 0) continue;
        if (f->device >= 0 && f->device != dev) continue;
        if (t < f->from || t >= f->until) continue;
        if (f->count > 0) f->count--;
        if (f->sleep_s > sleep_for) sleep_for = f->sleep_s;
        if (f->error != NVML_SUCCESS && err == NVML_SUCCESS) err = f->error;
    }
    if (err == NVML_SUCCESS && dev >= 0 && device_lost(&devices[dev], t)) err = NVML_ERROR_GPU_IS_LOST;
    pthread_mutex_unlock(&lock);
    if (sleep_for > 0) sleep_s(sleep_for);
    return err;
}

#define ENTER_DEV(call, d)                               \
    do {                                                 \
        if (!valid_device(d)) return NVML_ERROR_INVALID_ARGUMENT; \
        nvmlReturn_t r_ = enter(call, (d)->index);       \
        if (r_ != NVML_SUCCESS) return r_;               \
    } while (0)

static nvmlReturn_t copy_str(const char *s, char *buf, unsigned int len) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

static const char *str_field(const struct fake_device *d, const char *name, const char *dflt) {
    const cJSON *v = field_json(d, name);
    return cJSON_IsString(v) ? v->valuestring : dflt;
}

/* A numeric field into an unsigned int / unsigned long long out-parameter. */
static nvmlReturn_t uint_field(nvmlDevice_t d, const char *call, const char *name, unsigned int *out) {
    ENTER_DEV(call, d);
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    double v;
    nvmlReturn_t r = field(d, name, &v);
    if (r == NVML_SUCCESS) *out = v <= 0 ? 0 : (unsigned int)llround(v);
    return r;
}

static nvmlReturn_t ull_field(nvmlDevice_t d, const char *call, const char *name, unsigned long long *out) {
    ENTER_DEV(call, d);
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    double v;
    nvmlReturn_t r = field(d, name, &v);
    if (r == NVML_SUCCESS) *out = v <= 0 ? 0 : (unsigned long long)llround(v);
    return r;
}

/* ---- init, system ---- */
static nvmlReturn_t do_init(void) {
    pthread_mutex_lock(&lock);
    int ok = load_script() == 0;
    if (ok) {
        if (!t0_set) {
            clock_gettime(CLOCK_MONOTONIC, &t0);
            t0_set = 1;
            const char *log = getenv("LMPERF_FAKE_NVML_LOG");
            if (log && *log) {
                FILE *f = fopen(log, "a");
                if (f) {
                    fprintf(f, "init_unix_us %llu\n", unix_us());
                    fclose(f);
                }
            }
        }
        init_refs++;
    }
    pthread_mutex_unlock(&lock);
    if (!ok) return NVML_ERROR_DRIVER_NOT_LOADED;
    nvmlReturn_t r = enter("nvmlInit_v2", -1);
    if (r != NVML_SUCCESS) {
        pthread_mutex_lock(&lock);
        init_refs--;
        pthread_mutex_unlock(&lock);
    }
    return r;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInit(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return do_init();
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t r = init_refs > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (init_refs > 0) init_refs--;
    pthread_mutex_unlock(&lock);
    return r;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++) {
        if (ERRORS[i].code == result) return ERRORS[i].name;
    }
    return "Unknown Error";
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t r = enter("nvmlSystemGetDriverVersion", -1);
    if (r != NVML_SUCCESS) return r;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(script, "driver_version");
    return copy_str(cJSON_IsString(v) ? v->valuestring : "550.54.15", version, length);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    nvmlReturn_t r = enter("nvmlSystemGetNVMLVersion", -1);
    if (r != NVML_SUCCESS) return r;
    return copy_str("12.550.54.15", version, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    nvmlReturn_t r = enter("nvmlDeviceGetCount_v2", -1);
    if (r != NVML_SUCCESS) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)device_count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (index >= (unsigned int)device_count) {
        nvmlReturn_t r = enter("nvmlDeviceGetHandleByIndex_v2", -1);
        return r != NVML_SUCCESS ? r : NVML_ERROR_INVALID_ARGUMENT;
    }
    nvmlReturn_t r = enter("nvmlDeviceGetHandleByIndex_v2", (int)index);
    if (r != NVML_SUCCESS) return r;
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

/* ---- identity ---- */
EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
    ENTER_DEV("nvmlDeviceGetIndex", d);
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)d->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    ENTER_DEV("nvmlDeviceGetName", d);
    return copy_str(str_field(d, "name", "NVIDIA H200"), name, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    ENTER_DEV("nvmlDeviceGetUUID", d);
    char dflt[64];
    snprintf(dflt, sizeof dflt, "GPU-fa4e0000-0000-4000-8000-%012d", d->index);
    return copy_str(str_field(d, "uuid", dflt), uuid, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    ENTER_DEV("nvmlDeviceGetPciInfo_v3", d);
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    char dflt[32];
    snprintf(dflt, sizeof dflt, "00000000:%02X:00.0", 0x17 + d->index);
    const char *id = str_field(d, "pci_bus_id", dflt);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", id);
    unsigned int dom = 0, bus = 0, dev = 0, fn = 0;
    if (sscanf(id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) == 4) {
        pci->domain = dom;
        pci->bus = bus;
        pci->device = dev;
    }
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", dom & 0xFFFF, bus, dev, fn);
    pci->pciDeviceId = 0x233510DE;
    pci->pciSubSystemId = 0x18BF10DE;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    ENTER_DEV("nvmlDeviceGetMigMode", d);
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    double v;
    nvmlReturn_t r = field(d, "mig_mode", &v);
    if (r != NVML_SUCCESS) return r;
    *current = *pending = v != 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
    ENTER_DEV("nvmlDeviceGetMaxMigDeviceCount", d);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)d->mig_n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *mig) {
    ENTER_DEV("nvmlDeviceGetMigDeviceHandleByIndex", d);
    if (!mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= (unsigned int)d->mig_n) return NVML_ERROR_NOT_FOUND;
    *mig = &migs[d->mig_first + (int)index];
    return NVML_SUCCESS;
}

/* ---- values ---- */
EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    ENTER_DEV("nvmlDeviceGetUtilizationRates", d);
    if (!u) return NVML_ERROR_INVALID_ARGUMENT;
    double g, m;
    nvmlReturn_t r = field(d, "utilization_gpu_pct", &g);
    if (r == NVML_SUCCESS) r = field(d, "utilization_memory_pct", &m);
    if (r != NVML_SUCCESS) return r;
    u->gpu = (unsigned int)llround(g);
    u->memory = (unsigned int)llround(m);
    return NVML_SUCCESS;
}

static nvmlReturn_t memory_now(nvmlDevice_t d, unsigned long long *total, unsigned long long *used) {
    double t, u;
    nvmlReturn_t r = field(d, "memory_total_bytes", &t);
    if (r == NVML_SUCCESS) r = field(d, "memory_used_bytes", &u);
    if (r != NVML_SUCCESS) return r;
    *total = (unsigned long long)llround(t);
    *used = u <= 0 ? 0 : (unsigned long long)llround(u);
    if (*used > *total) *used = *total;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    ENTER_DEV("nvmlDeviceGetMemoryInfo", d);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long total, used;
    nvmlReturn_t r = memory_now(d, &total, &used);
    if (r != NVML_SUCCESS) return r;
    m->total = total;
    m->used = used;
    m->free = total - used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    ENTER_DEV("nvmlDeviceGetMemoryInfo_v2", d);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != NVML_MEMORY_V2_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total, used;
    nvmlReturn_t r = memory_now(d, &total, &used);
    if (r != NVML_SUCCESS) return r;
    m->total = total;
    m->reserved = 0;
    m->used = used;
    m->free = total - used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    return uint_field(d, "nvmlDeviceGetPowerUsage", "power_mw", mw);
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) {
    return uint_field(d, "nvmlDeviceGetEnforcedPowerLimit", "power_limit_mw", mw);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t d, unsigned int *mw) {
    return uint_field(d, "nvmlDeviceGetPowerManagementLimit", "power_limit_mw", mw);
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj) {
    return ull_field(d, "nvmlDeviceGetTotalEnergyConsumption", "energy_mj", mj);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *c) {
    if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    return uint_field(d, "nvmlDeviceGetTemperature", "temperature_c", c);
}

/* nvmlClockType_t: 0 graphics, 1 SM, 2 memory, 3 video. */
static const char *CLOCKS[] = {"clock_graphics_mhz", "clock_sm_mhz", "clock_memory_mhz", "clock_video_mhz"};
static const char *MAX_CLOCKS[] = {"max_clock_graphics_mhz", "max_clock_sm_mhz", "max_clock_memory_mhz", "max_clock_video_mhz"};

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
    if (type < 0 || type > 3) return NVML_ERROR_INVALID_ARGUMENT;
    return uint_field(d, "nvmlDeviceGetClockInfo", CLOCKS[type], mhz);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
    if (type < 0 || type > 3) return NVML_ERROR_INVALID_ARGUMENT;
    return uint_field(d, "nvmlDeviceGetMaxClockInfo", MAX_CLOCKS[type], mhz);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *bits) {
    return ull_field(d, "nvmlDeviceGetCurrentClocksThrottleReasons", "throttle_reasons", bits);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *bits) {
    return ull_field(d, "nvmlDeviceGetCurrentClocksEventReasons", "throttle_reasons", bits);
}

/* nvmlPcieUtilCounter_t: 0 TX, 1 RX; KB/s. */
EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *kbs) {
    if (counter != 0 && counter != 1) return NVML_ERROR_INVALID_ARGUMENT;
    return uint_field(d, "nvmlDeviceGetPcieThroughput", counter == 0 ? "pcie_tx_kb_s" : "pcie_rx_kb_s", kbs);
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t d, unsigned int *n) {
    return uint_field(d, "nvmlDeviceGetPcieReplayCounter", "pcie_replays", n);
}

/* nvmlMemoryErrorType_t: 0 corrected, 1 uncorrected; counter 0 volatile, 1 aggregate. */
EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter, unsigned long long *n) {
    if ((type != 0 && type != 1) || (counter != 0 && counter != 1)) return NVML_ERROR_INVALID_ARGUMENT;
    return ull_field(d, "nvmlDeviceGetTotalEccErrors", type == 0 ? "ecc_corrected" : "ecc_uncorrected", n);
}

/* ---- processes ---- */
static int live_processes(nvmlDevice_t d, const cJSON **out, int max) {
    const cJSON *ps = field_json(d, "processes"), *p;
    double t = now_s();
    int n = 0;
    cJSON_ArrayForEach(p, ps) {
        if (!within(p, t)) continue;
        if (n < max) out[n] = p;
        n++;
    }
    return n;
}

#define MAX_PROCS 256

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    ENTER_DEV("nvmlDeviceGetComputeRunningProcesses_v3", d);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    const cJSON *ps[MAX_PROCS];
    int n = live_processes(d, ps, MAX_PROCS);
    if (n > MAX_PROCS) n = MAX_PROCS;
    if (!infos || *count < (unsigned int)n) {
        *count = (unsigned int)n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    double t = now_s();
    for (int i = 0; i < n; i++) {
        infos[i].pid = (unsigned int)num_or(ps[i], "pid", 0);
        double used;
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(ps[i], "used_memory_bytes");
        infos[i].usedGpuMemory = u && eval(u, t, &used) ? (unsigned long long)llround(used) : NVML_VALUE_NOT_AVAILABLE_ULL;
        infos[i].gpuInstanceId = NO_INSTANCE;
        infos[i].computeInstanceId = NO_INSTANCE;
    }
    *count = (unsigned int)n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *samples, unsigned int *count,
                                                    unsigned long long last_seen) {
    ENTER_DEV("nvmlDeviceGetProcessUtilization", d);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    const cJSON *ps[MAX_PROCS];
    int n = live_processes(d, ps, MAX_PROCS);
    if (n > MAX_PROCS) n = MAX_PROCS;
    /*
     * One sample per process, stamped now; or, with "process_sample_period_s", stamped at the
     * driver's last sampling instant (t0 + k × period), as NVML buffers them. Nothing newer
     * than last_seen means NOT_FOUND, as NVML.
     */
    unsigned long long ts = unix_us();
    double period;
    if (field(d, "process_sample_period_s", &period) == NVML_SUCCESS && period > 0) {
        double t = now_s();
        double since_last = t - floor(t / period) * period;
        ts -= (unsigned long long)(since_last * 1e6);
    }
    if (n == 0 || ts <= last_seen) return NVML_ERROR_NOT_FOUND;
    if (!samples || *count < (unsigned int)n) {
        *count = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    double t = now_s();
    for (int i = 0; i < n; i++) {
        double sm = 0, mem = 0;
        const cJSON *v;
        if ((v = cJSON_GetObjectItemCaseSensitive(ps[i], "sm_pct"))) eval(v, t, &sm);
        if ((v = cJSON_GetObjectItemCaseSensitive(ps[i], "memory_pct"))) eval(v, t, &mem);
        samples[i].pid = (unsigned int)num_or(ps[i], "pid", 0);
        samples[i].timeStamp = ts;
        samples[i].smUtil = (unsigned int)llround(sm);
        samples[i].memUtil = (unsigned int)llround(mem);
        samples[i].encUtil = 0;
        samples[i].decUtil = 0;
    }
    *count = (unsigned int)n;
    return NVML_SUCCESS;
}

/* ---- events (XID) ---- */
EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    nvmlReturn_t r = enter("nvmlEventSetCreate", -1);
    if (r != NVML_SUCCESS) return r;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof **set);
    return *set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    ENTER_DEV("nvmlDeviceGetSupportedEventTypes", d);
    if (!types) return NVML_ERROR_INVALID_ARGUMENT;
    *types = NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    ENTER_DEV("nvmlDeviceRegisterEvents", d);
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~NVML_EVENT_TYPE_XID_CRITICAL_ERROR) return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&lock);
    set->mask[d->index] |= types;
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

/* Waits up to timeout_ms for an XID whose time has come on a registered device. */
EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    nvmlReturn_t r = enter("nvmlEventSetWait_v2", -1);
    if (r != NVML_SUCCESS) return r;
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    double deadline = now_s() + timeout_ms / 1000.0;
    for (;;) {
        pthread_mutex_lock(&lock);
        if (init_refs == 0) {
            pthread_mutex_unlock(&lock);
            return NVML_ERROR_UNINITIALIZED;
        }
        double t = now_s();
        for (int i = 0; i < xid_count; i++) {
            struct xid *x = &xids[i];
            if (x->delivered || x->at > t || !(set->mask[x->device] & NVML_EVENT_TYPE_XID_CRITICAL_ERROR)) continue;
            x->delivered = 1;
            data->device = &devices[x->device];
            data->eventType = NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
            data->eventData = x->code;
            data->gpuInstanceId = NO_INSTANCE;
            data->computeInstanceId = NO_INSTANCE;
            pthread_mutex_unlock(&lock);
            return NVML_SUCCESS;
        }
        pthread_mutex_unlock(&lock);
        if (t >= deadline) return NVML_ERROR_TIMEOUT;
        sleep_s(fmin(0.01, deadline - t));
    }
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    free(set);
    return NVML_SUCCESS;
}
