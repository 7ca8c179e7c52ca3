// Where a CUDA call's time goes, kernel by kernel: a CUPTI injection library. The CUDA
// driver loads the library named by CUDA_INJECTION64_PATH when the process initializes CUDA
// and calls its InitializeInjection (NVIDIA's mechanism for tracing tools, as Nsight Systems
// uses), so any program runs unchanged under it: here attn_bench, one case per process
// (tools/gpu_machine.sh trace). CUPTI's activity API records, in the GPU's own timestamps:
// every kernel (name, grid, block, registers, shared memory, start and end), every memory
// copy and set, and every driver API call made on the host (its name, start and end: a
// cuMemAlloc, a synchronizing copy, a launch's own cost). Each record is one JSON line in the
// file ATTN_KERNEL_TRACE names; tools/gpu_trace.py turns them into per-call figures.
#include <cupti.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace {

std::FILE *out = nullptr;
std::mutex out_mutex;

void fail(const char *what, CUptiResult result) {
    const char *text = nullptr;
    cuptiGetResultString(result, &text);
    std::fprintf(stderr, "kernel_trace: %s failed: %s\n", what, text ? text : "unknown CUPTI error");
}

// A kernel's name as a JSON string (Halide's are identifiers; anything else is escaped).
std::string quoted(const char *text) {
    std::string s = "\"";
    for (const char *c = text ? text : ""; *c; ++c) {
        if (*c == '"' || *c == '\\') {
            s += '\\';
            s += *c;
        } else if (static_cast<unsigned char>(*c) < 0x20) {
            char escaped[8];
            std::snprintf(escaped, sizeof escaped, "\\u%04x", *c);
            s += escaped;
        } else {
            s += *c;
        }
    }
    return s + "\"";
}

void write_record(const CUpti_Activity *record) {
    char line[512];
    switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto *k = reinterpret_cast<const CUpti_ActivityKernel10 *>(record);
        std::snprintf(line, sizeof line,
                      "\"start\": %llu, \"end\": %llu, \"grid\": [%d, %d, %d], \"block\": [%d, %d, %d], "
                      "\"registers\": %u, \"static_shared\": %d, \"dynamic_shared\": %d, \"stream\": %u, "
                      "\"correlation\": %u",
                      (unsigned long long)k->start, (unsigned long long)k->end, k->gridX, k->gridY, k->gridZ,
                      k->blockX, k->blockY, k->blockZ, unsigned(k->registersPerThread), k->staticSharedMemory,
                      k->dynamicSharedMemory, k->streamId, k->correlationId);
        std::fprintf(out, "{\"kind\": \"kernel\", \"name\": %s, %s}\n", quoted(k->name).c_str(), line);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto *m = reinterpret_cast<const CUpti_ActivityMemcpy6 *>(record);
        // src/dst kinds (CUpti_ActivityMemoryKind: 1 pageable, 2 pinned, 3 device) and whether
        // it was asynchronous: a copy from pageable memory makes the host wait.
        std::fprintf(out,
                     "{\"kind\": \"memcpy\", \"copy_kind\": %u, \"src_kind\": %u, \"dst_kind\": %u, \"async\": %s, "
                     "\"bytes\": %llu, \"start\": %llu, \"end\": %llu, \"stream\": %u, \"correlation\": %u}\n",
                     unsigned(m->copyKind), unsigned(m->srcKind), unsigned(m->dstKind),
                     (m->flags & CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC) ? "true" : "false", (unsigned long long)m->bytes,
                     (unsigned long long)m->start, (unsigned long long)m->end, m->streamId, m->correlationId);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto *m = reinterpret_cast<const CUpti_ActivityMemset4 *>(record);
        std::fprintf(out, "{\"kind\": \"memset\", \"bytes\": %llu, \"start\": %llu, \"end\": %llu, \"correlation\": %u}\n",
                     (unsigned long long)m->bytes, (unsigned long long)m->start, (unsigned long long)m->end,
                     m->correlationId);
        break;
    }
    case CUPTI_ACTIVITY_KIND_DRIVER: {
        const auto *a = reinterpret_cast<const CUpti_ActivityAPI *>(record);
        const char *name = nullptr;
        if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, a->cbid, &name) != CUPTI_SUCCESS) name = nullptr;
        std::fprintf(out,
                     "{\"kind\": \"driver\", \"name\": %s, \"start\": %llu, \"end\": %llu, \"thread\": %u, "
                     "\"correlation\": %u}\n",
                     quoted(name ? name : ("cbid " + std::to_string(a->cbid)).c_str()).c_str(),
                     (unsigned long long)a->start, (unsigned long long)a->end, a->threadId, a->correlationId);
        break;
    }
    default:
        break;
    }
}

constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    // CUPTI asks for 8-byte alignment.
    *buffer = static_cast<uint8_t *>(std::aligned_alloc(8, kBufferBytes));
    *size = *buffer ? kBufferBytes : 0;
    *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t *buffer, size_t, size_t valid) {
    std::lock_guard<std::mutex> lock(out_mutex);
    CUpti_Activity *record = nullptr;
    CUptiResult status;
    while ((status = cuptiActivityGetNextRecord(buffer, valid, &record)) == CUPTI_SUCCESS) {
        if (out) write_record(record);
    }
    // The end of the buffer (INVALID_KIND: past its valid records, as NVIDIA's samples take it).
    if (status != CUPTI_ERROR_MAX_LIMIT_REACHED && status != CUPTI_ERROR_INVALID_KIND)
        fail("cuptiActivityGetNextRecord", status);
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS && dropped && out) {
        std::fprintf(out, "{\"kind\": \"dropped\", \"records\": %zu}\n", dropped);
    }
    if (out) std::fflush(out);
    std::free(buffer);
}

// Records still buffered when a context goes or the process ends are delivered first.
void CUPTIAPI on_resource(void *, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void *) {
    if (domain == CUPTI_CB_DOMAIN_RESOURCE && id == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING) {
        cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    }
}

void at_exit() {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    std::lock_guard<std::mutex> lock(out_mutex);
    if (out) std::fclose(out);
    out = nullptr;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
    static std::once_flag once;
    static int ok = 0;
    std::call_once(once, [] {
        const char *path = std::getenv("ATTN_KERNEL_TRACE");
        if (!path || !*path) {
            std::fprintf(stderr, "kernel_trace: set ATTN_KERNEL_TRACE to the file to write\n");
            return;
        }
        out = std::fopen(path, "w");
        if (!out) {
            std::fprintf(stderr, "kernel_trace: cannot write %s: %s\n", path, std::strerror(errno));
            return;
        }
        // The subscriber first (CUPTI's advice); its callback, a flush when a context goes,
        // is optional: without it, the flush at exit still delivers the records.
        CUpti_SubscriberHandle subscriber;
        CUptiResult r = cuptiSubscribe(&subscriber, on_resource, nullptr);
        if (r == CUPTI_SUCCESS) {
            r = cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE,
                                    CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING);
        }
        if (r != CUPTI_SUCCESS) fail("the context callback (records are still flushed at exit)", r);
        if ((r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed)) != CUPTI_SUCCESS)
            return fail("cuptiActivityRegisterCallbacks", r);
        std::atexit(at_exit);  // before any kind is enabled, so that whatever is recorded is flushed
        for (CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                        CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_DRIVER}) {
            if ((r = cuptiActivityEnable(kind)) != CUPTI_SUCCESS) return fail("cuptiActivityEnable", r);
        }
        ok = 1;
    });
    return ok;
}
