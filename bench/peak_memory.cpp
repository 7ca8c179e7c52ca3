#include "peak_memory.h"

#include "attn/internal.h"  // detail::install_scratch_cache

#include <HalideRuntime.h>

#include <atomic>
#include <cstdlib>
#include <new>

namespace {

std::atomic<int64_t> live_bytes{0}, peak_bytes{0}, allocations{0};
int64_t bytes_at_start = 0;

// Each block carries, just below the pointer its caller gets, its size and the block its
// underlying allocator returned; the caller's pointer is kHeader (or the wider alignment
// asked for) past the block, so it keeps the alignment Halide wants.
constexpr std::size_t kHeader = 128;

struct Header {
    void *block;
    std::size_t size;
};

Header &header_of(void *p) { return static_cast<Header *>(p)[-1]; }

// Counts `block` (from an underlying allocator, `offset` bytes more than `size`): writes
// the header and returns what the caller gets.
void *count_in(void *block, std::size_t size, std::size_t offset = kHeader) {
    if (!block) return nullptr;
    void *p = static_cast<char *>(block) + offset;
    header_of(p) = {block, size};
    const int64_t now = live_bytes += int64_t(size);
    int64_t peak = peak_bytes.load();
    while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
    }
    ++allocations;
    return p;
}

// The block behind a counted pointer, for its underlying allocator to free, uncounted.
void *count_out(void *p) {
    const Header header = header_of(p);
    live_bytes -= int64_t(header.size);
    return header.block;
}

void *counted_alloc(std::size_t size, std::size_t alignment = kHeader) {
    const std::size_t offset = alignment > kHeader ? alignment : kHeader;
    return count_in(std::aligned_alloc(offset, (size + 2 * offset - 1) / offset * offset), size,
                    offset);
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

// Every replaceable form, so that no block is allocated by one allocator and freed by the
// other (a sanitizer's runtime supplies whichever forms the program leaves out).
void *operator new(std::size_t size) {
    if (void *p = counted_alloc(size)) return p;
    throw std::bad_alloc();
}
void *operator new[](std::size_t size) { return operator new(size); }
void *operator new(std::size_t size, std::align_val_t alignment) {
    if (void *p = counted_alloc(size, std::size_t(alignment))) return p;
    throw std::bad_alloc();
}
void *operator new[](std::size_t size, std::align_val_t alignment) {
    return operator new(size, alignment);
}
void *operator new(std::size_t size, const std::nothrow_t &) noexcept {
    return counted_alloc(size);
}
void *operator new[](std::size_t size, const std::nothrow_t &) noexcept {
    return counted_alloc(size);
}
void *operator new(std::size_t size, std::align_val_t alignment, const std::nothrow_t &) noexcept {
    return counted_alloc(size, std::size_t(alignment));
}
void *operator new[](std::size_t size, std::align_val_t alignment,
                     const std::nothrow_t &) noexcept {
    return counted_alloc(size, std::size_t(alignment));
}
void operator delete(void *p) noexcept { counted_free(p); }
void operator delete[](void *p) noexcept { counted_free(p); }
void operator delete(void *p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void *p, std::size_t) noexcept { counted_free(p); }
void operator delete(void *p, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void *p, std::align_val_t) noexcept { counted_free(p); }
void operator delete(void *p, std::size_t, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void *p, std::size_t, std::align_val_t) noexcept { counted_free(p); }
void operator delete(void *p, const std::nothrow_t &) noexcept { counted_free(p); }
void operator delete[](void *p, const std::nothrow_t &) noexcept { counted_free(p); }
void operator delete(void *p, std::align_val_t, const std::nothrow_t &) noexcept {
    counted_free(p);
}
void operator delete[](void *p, std::align_val_t, const std::nothrow_t &) noexcept {
    counted_free(p);
}

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
