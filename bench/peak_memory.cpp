#include "peak_memory.h"

#include "attn/internal.h"  // detail::install_scratch_cache

#include <HalideRuntime.h>

#include <atomic>
#include <cstdlib>
#include <new>

namespace {

std::atomic<int64_t> live_bytes{0}, peak_bytes{0}, allocations{0};
int64_t bytes_at_start = 0;

// Each block carries its size in a header as wide as the alignment Halide wants.
constexpr std::size_t kHeader = 128;

// Counts `block` (from an underlying allocator, kHeader bytes more than `size`): writes
// its header and returns what the caller gets.
void *count_in(void *block, std::size_t size) {
    if (!block) return nullptr;
    *static_cast<std::size_t *>(block) = size;
    const int64_t now = live_bytes += int64_t(size);
    int64_t peak = peak_bytes.load();
    while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
    }
    ++allocations;
    return static_cast<char *>(block) + kHeader;
}

// The block behind a counted pointer, for its underlying allocator to free, uncounted.
void *count_out(void *p) {
    void *block = static_cast<char *>(p) - kHeader;
    live_bytes -= int64_t(*static_cast<std::size_t *>(block));
    return block;
}

void *counted_alloc(std::size_t size) {
    return count_in(std::aligned_alloc(kHeader, (size + 2 * kHeader - 1) / kHeader * kHeader), size);
}

void counted_free(void *p) {
    if (p) std::free(count_out(p));
}

// Halide's allocations go through the library's allocator (its scratch cache), as in an
// application, counted on the way.
halide_malloc_t library_malloc = nullptr;
halide_free_t library_free = nullptr;
extern "C" void *halide_counted_malloc(void *user_context, size_t size) {
    return count_in(library_malloc(user_context, size + kHeader), size);
}
extern "C" void halide_counted_free(void *user_context, void *p) {
    if (p) library_free(user_context, count_out(p));
}

}  // namespace

void *operator new(std::size_t size) {
    if (void *p = counted_alloc(size)) return p;
    throw std::bad_alloc();
}
void *operator new[](std::size_t size) { return operator new(size); }
void operator delete(void *p) noexcept { counted_free(p); }
void operator delete[](void *p) noexcept { counted_free(p); }
void operator delete(void *p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void *p, std::size_t) noexcept { counted_free(p); }

namespace attn::bench {

PeakMemory::PeakMemory() {
    static const bool installed = [] {  // once: a second wrapper would wrap the first
        attn::detail::install_scratch_cache();
        library_free = halide_set_custom_free(halide_counted_free);
        library_malloc = halide_set_custom_malloc(halide_counted_malloc);
        return true;
    }();
    (void)installed;
}

void PeakMemory::Start() {
    bytes_at_start = live_bytes.load();
    peak_bytes = bytes_at_start;
    allocations = 0;
}

void PeakMemory::Stop(Result &result) {
    // Peak above what was live at Start: what one iteration needs beyond its inputs.
    result.num_allocs = allocations.load();
    result.max_bytes_used = peak_bytes.load() - bytes_at_start;
}

int64_t PeakMemory::measure(const std::function<void()> &run) {
    Start();
    run();
    return peak_bytes.load() - bytes_at_start;
}

}  // namespace attn::bench
