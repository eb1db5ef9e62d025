// A fake CUDA driver (built as libcuda.so.1 by tests/test_gpu_mock.py) that lets the runtime's
// plumbing run on a machine without a GPU: symbol binding, contexts, allocations and bounds,
// copies, streams, graph capture and replay, events, kernel lookup in the real fatbins, the
// parameter list, and launch-argument marshalling. "Device" memory is host memory. The one
// kernel it can run is strata_smoke_axpb, executed in C with cuda/smoke.cuh's math. It is
// compiled against the real cuda.h, so every definition below has the driver's exact
// prototype (a mismatch is a compile error). The real check is the device suite.
// With STRATA_MOCK_NOOP_KERNELS=1 (tests/test_gpu_hybrid_mock.py) every other kernel launch
// succeeds and does nothing, and device memory starts zeroed: a whole model's host-side control
// flow runs (its values are zeros: the router routes every token to expert 0).
#include <cuda.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OK CUDA_SUCCESS
static int g_init = 0;
static int g_ctx_token = 1;  // the primary context's handle is &g_ctx_token
static int g_live_allocs = 0;
static int noop_kernels(void) {
    const char* v = getenv("STRATA_MOCK_NOOP_KERNELS");
    return v != NULL && strcmp(v, "1") == 0;
}

// ---- init, device, context ------------------------------------------------------------------
CUresult CUDAAPI cuInit(unsigned int flags) { g_init = 1; return flags == 0 ? OK : CUDA_ERROR_INVALID_VALUE; }
CUresult CUDAAPI cuDriverGetVersion(int* v) { *v = 13000; return OK; }
CUresult CUDAAPI cuGetErrorName(CUresult e, const char** s) {
    switch (e) {
        case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; return OK;
        case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
        case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; return OK;
        case CUDA_ERROR_NOT_READY: *s = "CUDA_ERROR_NOT_READY"; return OK;
        case CUDA_ERROR_INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; return OK;
        case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: *s = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"; return OK;
        case CUDA_ERROR_NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; return OK;
        default: *s = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
}
CUresult CUDAAPI cuGetErrorString(CUresult e, const char** s) {
    const char* name;
    if (cuGetErrorName(e, &name) != OK) { *s = NULL; return CUDA_ERROR_INVALID_VALUE; }
    *s = "mock driver error";
    return OK;
}
CUresult CUDAAPI cuDeviceGetCount(int* n) { if (!g_init) return CUDA_ERROR_NOT_INITIALIZED; *n = 1; return OK; }
CUresult CUDAAPI cuDeviceGet(CUdevice* d, int ordinal) { if (ordinal != 0) return CUDA_ERROR_INVALID_VALUE; *d = 0; return OK; }
CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice d) { (void)d; snprintf(name, (size_t)len, "Mock GPU"); return OK; }
CUresult CUDAAPI cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
    (void)d;
    switch (a) {
        case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 4; return OK;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; return OK;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; return OK;
        case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 232448; return OK;
        case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *v = 50 << 20; return OK;
        case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: *v = 1; return OK;
        default: return CUDA_ERROR_INVALID_VALUE;
    }
}
CUresult CUDAAPI cuDeviceTotalMem(size_t* b, CUdevice d) { (void)d; *b = (size_t)2 << 30; return OK; }
CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) { (void)d; *c = (CUcontext)&g_ctx_token; return OK; }
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice d) { (void)d; return OK; }
static CUcontext g_current = NULL;
CUresult CUDAAPI cuCtxSetCurrent(CUcontext c) { g_current = c; return OK; }
CUresult CUDAAPI cuCtxGetCurrent(CUcontext* c) { *c = g_current; return OK; }
CUresult CUDAAPI cuCtxPushCurrent(CUcontext c) { g_current = c; return OK; }
CUresult CUDAAPI cuCtxPopCurrent(CUcontext* c) { if (c) *c = g_current; return OK; }
CUresult CUDAAPI cuCtxSynchronize(void) { return OK; }
#define NEED_CTX() do { if (g_current != (CUcontext)&g_ctx_token) return CUDA_ERROR_INVALID_CONTEXT; } while (0)

// ---- modules and functions ------------------------------------------------------------------
typedef struct { const unsigned char* image; size_t size; } Module;
typedef struct { char name[128]; } Function;

CUresult CUDAAPI cuModuleLoadData(CUmodule* m, const void* image) {
    NEED_CTX();
    const unsigned char* p = (const unsigned char*)image;
    if (((uintptr_t)p & 15) != 0) return CUDA_ERROR_INVALID_IMAGE;   // we embed 16-aligned
    if (!(p[0] == 0x50 && p[1] == 0xed && p[2] == 0x55 && p[3] == 0xba)) return CUDA_ERROR_INVALID_IMAGE;
    uint64_t body;  // fatbin header: magic u32, version u16, header size u16, body size u64
    uint16_t hsize;
    memcpy(&hsize, p + 6, 2);
    memcpy(&body, p + 8, 8);
    Module* mod = (Module*)calloc(1, sizeof(Module));
    mod->image = p;
    mod->size = hsize + body;
    *m = (CUmodule)mod;
    return OK;
}
CUresult CUDAAPI cuModuleUnload(CUmodule m) { free(m); return OK; }
CUresult CUDAAPI cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
    NEED_CTX();
    Module* mod = (Module*)m;
    size_t n = strlen(name) + 1;  // the name with its NUL, as in the fatbin's string tables
    if (n > sizeof(((Function*)0)->name)) return CUDA_ERROR_NOT_FOUND;
    // memchr finds candidate starts quickly (a byte loop over every image is slow when a
    // model resolves its hundred kernels)
    const unsigned char* at = mod->image;
    const unsigned char* end = mod->image + mod->size;
    while ((size_t)(end - at) >= n) {
        at = (const unsigned char*)memchr(at, name[0], (size_t)(end - at) - n + 1);
        if (at == NULL) break;
        if (memcmp(at, name, n) == 0 && (at == mod->image || at[-1] == 0)) {
            Function* fn = (Function*)calloc(1, sizeof(Function));
            memcpy(fn->name, name, n);
            *f = (CUfunction)fn;
            return OK;
        }
        ++at;
    }
    return CUDA_ERROR_NOT_FOUND;
}
static int is_smoke(CUfunction f) { return strcmp(((Function*)f)->name, "strata_smoke_axpb") == 0; }
static const size_t SMOKE_PARAMS[5] = {8, 8, 4, 4, 4};
CUresult CUDAAPI cuFuncGetParamInfo(CUfunction f, size_t i, size_t* off, size_t* size) {
    if (!is_smoke(f) || i >= 5) return CUDA_ERROR_INVALID_VALUE;
    static const size_t offs[5] = {0, 8, 16, 20, 24};
    *off = offs[i];
    *size = SMOKE_PARAMS[i];
    return OK;
}
CUresult CUDAAPI cuFuncGetAttribute(int* v, CUfunction_attribute a, CUfunction f) { (void)a; (void)f; *v = 16; return OK; }
CUresult CUDAAPI cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
    (void)f;
    return (a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES && v <= 232448) ? OK : CUDA_ERROR_INVALID_VALUE;
}

// ---- memory ---------------------------------------------------------------------------------
CUresult CUDAAPI cuMemGetInfo(size_t* fr, size_t* tot) { *tot = (size_t)2 << 30; *fr = *tot - ((size_t)g_live_allocs << 20); return OK; }
CUresult CUDAAPI cuMemAlloc(CUdeviceptr* p, size_t n) {
    NEED_CTX();
    if (n == 0) return CUDA_ERROR_INVALID_VALUE;  // the real driver refuses 0 too
    void* m = malloc(n);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    memset(m, noop_kernels() ? 0 : 0xA5, n);  // uninitialised device memory is garbage
    ++g_live_allocs;
    *p = (CUdeviceptr)(uintptr_t)m;
    return OK;
}
CUresult CUDAAPI cuMemFree(CUdeviceptr p) { NEED_CTX(); free((void*)(uintptr_t)p); --g_live_allocs; return OK; }
CUresult CUDAAPI cuMemHostAlloc(void** p, size_t n, unsigned int flags) { (void)flags; *p = malloc(n); return *p ? OK : CUDA_ERROR_OUT_OF_MEMORY; }
CUresult CUDAAPI cuMemFreeHost(void* p) { free(p); return OK; }
/* host memory "registered": device pointers are host pointers here */
CUresult CUDAAPI cuMemHostRegister(void* p, size_t n, unsigned int flags) { (void)flags; return p && n ? OK : CUDA_ERROR_INVALID_VALUE; }
CUresult CUDAAPI cuMemHostUnregister(void* p) { (void)p; return OK; }
CUresult CUDAAPI cuMemHostGetDevicePointer(CUdeviceptr* d, void* p, unsigned int flags) { (void)flags; *d = (CUdeviceptr)(uintptr_t)p; return OK; }
CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr d, const void* s, size_t n) { memcpy((void*)(uintptr_t)d, s, n); return OK; }
CUresult CUDAAPI cuMemcpyDtoH(void* d, CUdeviceptr s, size_t n) { memcpy(d, (void*)(uintptr_t)s, n); return OK; }
CUresult CUDAAPI cuMemcpyDtoD(CUdeviceptr d, CUdeviceptr s, size_t n) { memmove((void*)(uintptr_t)d, (void*)(uintptr_t)s, n); return OK; }
CUresult CUDAAPI cuMemsetD8(CUdeviceptr d, unsigned char c, size_t n) { memset((void*)(uintptr_t)d, c, n); return OK; }

// ---- streams, capture, graphs ---------------------------------------------------------------
enum { OP_COPY, OP_SET, OP_SMOKE };
typedef struct { int kind; uint64_t dst, src; size_t n; unsigned char byte; float a, b; } Op;
// A stream joins another's capture by waiting on an event recorded there (`into`: the origin
// whose graph its work goes to, as the driver's cross-stream capture); it leaves when the
// origin waits on an event it recorded after its work (joined back). `forked`: the origin's
// side streams not yet joined back (ending the capture with one is an error, as the driver's
// CUDA_ERROR_STREAM_CAPTURE_UNJOINED).
typedef struct Stream { int capturing; Op* ops; size_t n_ops, cap; struct Stream* into; int forked; } Stream;
typedef struct { Op* ops; size_t n_ops; } Graph;

static void run_op(const Op* o) {
    if (o->kind == OP_COPY) memmove((void*)(uintptr_t)o->dst, (const void*)(uintptr_t)o->src, o->n);
    else if (o->kind == OP_SET) memset((void*)(uintptr_t)o->dst, o->byte, o->n);
    else {
        const float* x = (const float*)(uintptr_t)o->src;
        float* y = (float*)(uintptr_t)o->dst;
        for (size_t i = 0; i < o->n; ++i) { volatile float p = o->a * x[i]; y[i] = p + o->b; }
    }
}
// Runs `o` now, or records it when `s` is capturing.
static CUresult submit(CUstream hs, Op o) {
    Stream* s = (Stream*)hs;
    if (s && s->into) s = s->into;
    if (s && s->capturing) {
        if (s->n_ops == s->cap) { s->cap = s->cap ? 2 * s->cap : 8; s->ops = (Op*)realloc(s->ops, s->cap * sizeof(Op)); }
        s->ops[s->n_ops++] = o;
        return OK;
    }
    run_op(&o);
    return OK;
}
static int capturing(CUstream hs) { return hs && (((Stream*)hs)->capturing || ((Stream*)hs)->into); }
// The stream whose capture `hs`'s work goes to (NULL: not capturing).
static Stream* origin(CUstream hs) {
    Stream* s = (Stream*)hs;
    return !s ? NULL : s->into ? s->into : s->capturing ? s : NULL;
}

CUresult CUDAAPI cuStreamCreate(CUstream* s, unsigned int flags) { (void)flags; NEED_CTX(); *s = (CUstream)calloc(1, sizeof(Stream)); return OK; }
CUresult CUDAAPI cuStreamDestroy(CUstream s) { if (s) { free(((Stream*)s)->ops); free(s); } return OK; }
CUresult CUDAAPI cuStreamSynchronize(CUstream s) { return capturing(s) ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : OK; }
CUresult CUDAAPI cuStreamQuery(CUstream s) { (void)s; return OK; }
CUresult CUDAAPI cuStreamWaitEvent(CUstream s, CUevent e, unsigned int f);
CUresult CUDAAPI cuStreamBeginCapture(CUstream hs, CUstreamCaptureMode mode) {
    Stream* s = (Stream*)hs;
    if (!s || s->capturing || mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) return CUDA_ERROR_INVALID_VALUE;
    s->capturing = 1;
    s->n_ops = 0;
    return OK;
}
CUresult CUDAAPI cuStreamEndCapture(CUstream hs, CUgraph* g) {
    Stream* s = (Stream*)hs;
    if (!s || !s->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    if (s->forked) {
        free(s->ops);
        s->ops = NULL; s->n_ops = s->cap = 0; s->capturing = 0; s->forked = 0;
        return CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
    }
    Graph* gr = (Graph*)calloc(1, sizeof(Graph));
    gr->ops = s->ops;
    gr->n_ops = s->n_ops;
    s->ops = NULL; s->n_ops = s->cap = 0; s->capturing = 0;
    *g = (CUgraph)gr;
    return OK;
}
CUresult CUDAAPI cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* st) {
    *st = capturing(s) ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return OK;
}
CUresult CUDAAPI cuGraphInstantiate(CUgraphExec* e, CUgraph g, unsigned long long flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    Graph* src = (Graph*)g;
    Graph* ex = (Graph*)calloc(1, sizeof(Graph));
    ex->n_ops = src->n_ops;
    ex->ops = (Op*)malloc((src->n_ops + 1) * sizeof(Op));
    memcpy(ex->ops, src->ops, src->n_ops * sizeof(Op));
    *e = (CUgraphExec)ex;
    return OK;
}
CUresult CUDAAPI cuGraphUpload(CUgraphExec e, CUstream s) { (void)e; (void)s; return OK; }
CUresult CUDAAPI cuGraphLaunch(CUgraphExec e, CUstream s) {
    if (capturing(s)) return CUDA_ERROR_INVALID_VALUE;
    Graph* g = (Graph*)e;
    for (size_t i = 0; i < g->n_ops; ++i) run_op(&g->ops[i]);
    return OK;
}
CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec e) { free(((Graph*)e)->ops); free(e); return OK; }
CUresult CUDAAPI cuGraphDestroy(CUgraph g) { free(((Graph*)g)->ops); free(g); return OK; }

// ---- async copies and launches ----------------------------------------------------------------
CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr d, const void* s, size_t n, CUstream st) {
    Op o = {OP_COPY, d, (uint64_t)(uintptr_t)s, n, 0, 0, 0};
    return submit(st, o);
}
CUresult CUDAAPI cuMemcpyDtoHAsync(void* d, CUdeviceptr s, size_t n, CUstream st) {
    Op o = {OP_COPY, (uint64_t)(uintptr_t)d, s, n, 0, 0, 0};
    return submit(st, o);
}
CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
    Op o = {OP_COPY, d, s, n, 0, 0, 0};
    return submit(st, o);
}
CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr d, unsigned char c, size_t n, CUstream st) {
    Op o = {OP_SET, d, 0, n, c, 0, 0};
    return submit(st, o);
}
CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                CUstream st, void** params, void** extra) {
    NEED_CTX();
    if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 || bx * by * bz > 1024) return CUDA_ERROR_INVALID_VALUE;
    if (extra != NULL || shmem > 232448) return CUDA_ERROR_INVALID_VALUE;
    if (!is_smoke(f)) return noop_kernels() ? OK : CUDA_ERROR_INVALID_VALUE;
    // Read each parameter the way the driver does: SMOKE_PARAMS[i] bytes from params[i].
    uint64_t x, y;
    float a, b;
    uint32_t n;
    memcpy(&x, params[0], 8);
    memcpy(&y, params[1], 8);
    memcpy(&a, params[2], 4);
    memcpy(&b, params[3], 4);
    memcpy(&n, params[4], 4);
    if ((uint64_t)gx * bx < 1) return CUDA_ERROR_INVALID_VALUE;
    Op o = {OP_SMOKE, y, x, n, 0, a, b};
    return submit(st, o);
}

// ---- events -----------------------------------------------------------------------------------
// `cap`: recorded into a capture (that origin stream), from `side` (a side stream of it).
typedef struct { int timing; int recorded; double t_ms; Stream* cap; Stream* side; } Event;
static double now_ms(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
CUresult CUDAAPI cuEventCreate(CUevent* e, unsigned int flags) {
    Event* ev = (Event*)calloc(1, sizeof(Event));
    ev->timing = !(flags & CU_EVENT_DISABLE_TIMING);
    *e = (CUevent)ev;
    return OK;
}
CUresult CUDAAPI cuEventRecord(CUevent e, CUstream s) {
    Event* ev = (Event*)e;
    ev->cap = origin(s);
    ev->side = ev->cap && ev->cap != (Stream*)s ? (Stream*)s : NULL;
    if (ev->cap) return OK;  // a node of the capture: nothing happens now
    ((Event*)e)->recorded = 1;
    ((Event*)e)->t_ms = now_ms();
    return OK;
}
CUresult CUDAAPI cuEventQuery(CUevent e) { return ((Event*)e)->cap ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : OK; }
CUresult CUDAAPI cuEventSynchronize(CUevent e) { return ((Event*)e)->cap ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : OK; }
CUresult CUDAAPI cuStreamWaitEvent(CUstream hs, CUevent e, unsigned int f) {
    Stream* s = (Stream*)hs;
    Event* ev = (Event*)e;
    (void)f;
    if (!s || !ev->cap) return OK;  // eager: the mock runs every stream in call order
    Stream* o = origin(hs);
    if (!o) {  // a fork: s joins the capture of the event's stream
        if (ev->side) return CUDA_ERROR_INVALID_VALUE;  // (a fork from a side stream: unused)
        s->into = ev->cap;
        ev->cap->forked++;
        return OK;
    }
    if (o != ev->cap) return CUDA_ERROR_INVALID_VALUE;  // two captures mixed
    if (s == o && ev->side && ev->side->into == o) {  // a side stream joined back
        ev->side->into = NULL;
        o->forked--;
    }
    return OK;
}
CUresult CUDAAPI cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
    Event *s = (Event*)a, *e = (Event*)b;
    if (!s->timing || !e->timing || !s->recorded || !e->recorded) return CUDA_ERROR_INVALID_HANDLE;
    *ms = (float)(e->t_ms - s->t_ms);
    return OK;
}
CUresult CUDAAPI cuEventDestroy(CUevent e) { free(e); return OK; }
