// The host scratch cache: Halide allocates a pipeline's compute_root intermediates with
// halide_malloc on every call and frees them on return. Large blocks come from the kernel
// (mmap) and go back to it (munmap), so every call pays a page fault and a page of zeroing
// per 4 KiB it touches: 65 ms of a 300 ms packed BERT-base call of 5940 tokens (six
// buffers of 18-38 MiB). Keeping freed large blocks for the next call, as ONNX Runtime's
// arena does (and halide_reuse_device_allocations for device memory), takes that away.
// Small blocks go to the C allocator, which reuses them already.
#include "attn/attention.h"
#include "attn/internal.h"

#include <HalideRuntime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>

namespace attn {
namespace {

constexpr std::size_t kCachedFrom = std::size_t(1) << 20;  // blocks below 1 MiB go to the C allocator
constexpr std::size_t kCacheLimit = std::size_t(1) << 30;  // at most 1 GiB kept unused

// Capacities in eighths of a power of two, so that a call on slightly different shapes
// (another packed batch's token count) finds the blocks of the previous one.
std::size_t size_class(std::size_t bytes) {
    std::size_t power = kCachedFrom;
    while (power * 2 <= bytes) power *= 2;
    const std::size_t step = power / 8;
    return (bytes + step - 1) / step * step;
}

// Which large blocks are handed out, readable without the lock: one bit per hash of an
// address, set while a block of that hash is in use. A free whose bit is clear is a small
// block (thousands per call, from threads working in parallel) and takes no lock.
class InUseFilter {
public:
    void add(void *block) { word(block).fetch_or(bit(block), std::memory_order_release); }
    bool may_hold(void *block) const { return word(block).load(std::memory_order_acquire) & bit(block); }
    // Under the cache's lock, once `block` has left `in_use`: clears its bit unless
    // another block in use shares it.
    void remove(void *block, const std::unordered_map<void *, std::size_t> &in_use) {
        for (const auto &entry : in_use) {
            if (slot(entry.first) == slot(block)) return;
        }
        word(block).fetch_and(~bit(block), std::memory_order_relaxed);
    }

private:
    static constexpr int kSlotBits = 12;  // 4096 bits: a few dozen blocks in use share few
    static std::size_t slot(const void *p) {
        return std::size_t((uint64_t(uintptr_t(p)) >> 7) * 0x9E3779B97F4A7C15ull >> (64 - kSlotBits));
    }
    static uint64_t bit(const void *p) { return uint64_t(1) << (slot(p) % 64); }
    std::atomic<uint64_t> &word(const void *p) { return words_[slot(p) / 64]; }
    const std::atomic<uint64_t> &word(const void *p) const { return words_[slot(p) / 64]; }
    std::atomic<uint64_t> words_[(1 << kSlotBits) / 64] = {};
};

struct Cache {
    std::mutex mutex;
    std::unordered_map<void *, std::size_t> in_use;  // large blocks handed out, with their capacity
    InUseFilter in_use_filter;                       // in_use, for frees without the lock
    std::multimap<std::size_t, void *> kept;         // large blocks freed, by capacity
    std::size_t kept_bytes = 0;
    detail::ScratchStats stats;
};
Cache &cache() {
    static Cache *c = new Cache;  // never destroyed: Halide's threads may free during exit
    return *c;
}

extern "C" void *scratch_malloc(void *user_context, std::size_t bytes) {
    if (bytes < kCachedFrom) return halide_default_malloc(user_context, bytes);
    const std::size_t capacity = size_class(bytes);
    Cache &c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    void *block = nullptr;
    // The smallest kept block that fits, unless a quarter or more of it would go unused.
    auto it = c.kept.lower_bound(capacity);
    if (it != c.kept.end() && it->first <= capacity + capacity / 4) {
        block = it->second;
        c.kept_bytes -= it->first;
        c.in_use.emplace(block, it->first);
        c.in_use_filter.add(block);
        c.kept.erase(it);
        ++c.stats.reused;
        return block;
    }
    // halide_malloc_alignment() is at most 128 on every target.
    block = std::aligned_alloc(128, capacity);
    if (block) {
        c.in_use.emplace(block, capacity);
        c.in_use_filter.add(block);
        ++c.stats.allocated;
    }
    return block;
}

extern "C" void scratch_free(void *user_context, void *block) {
    if (!block) return;
    Cache &c = cache();
    if (c.in_use_filter.may_hold(block)) {
        std::lock_guard<std::mutex> lock(c.mutex);
        auto it = c.in_use.find(block);
        if (it != c.in_use.end()) {
            const std::size_t capacity = it->second;
            c.in_use.erase(it);
            c.in_use_filter.remove(block, c.in_use);
            if (c.kept_bytes + capacity <= kCacheLimit) {
                c.kept.emplace(capacity, block);
                c.kept_bytes += capacity;
            } else {
                std::free(block);
            }
            return;
        }
    }
    // A small block, or one allocated before the cache was installed.
    halide_default_free(user_context, block);
}

}  // namespace

std::size_t release_scratch_memory() {
    Cache &c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    const std::size_t released = c.kept_bytes;
    for (auto &kept : c.kept) std::free(kept.second);
    c.kept.clear();
    c.kept_bytes = 0;
    return released;
}

namespace detail {

void install_scratch_cache() {
    // The free first: it takes any block, ours or not. An allocator the application
    // installed stays.
    static const bool installed = [] {
        if (!install_hook(halide_set_custom_free, scratch_free, halide_default_free)) return false;
        install_hook(halide_set_custom_malloc, scratch_malloc, halide_default_malloc);
        return true;
    }();
    (void)installed;
}

ScratchStats scratch_stats() {
    Cache &c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    ScratchStats s = c.stats;
    s.kept_bytes = c.kept_bytes;
    return s;
}

}  // namespace detail
}  // namespace attn
