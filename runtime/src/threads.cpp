// The kernels' CPU threads: a thread pool for Halide's parallel loops, shared by every CPU
// variant. Halide's own pool parks a worker the moment it finds no task, and parks the caller
// while the last tasks of a loop finish, so each of a layer's 6-13 parallel loops pays two
// wake-ups through the kernel (tens of µs each on a VM, where a parked vCPU halts). Here the
// workers spin while a kernel call runs and park kLinger after the last, and a caller spins
// for its loop's last tasks, as ONNX Runtime's and OpenMP's pools do, so the loops of one
// call, and back-to-back calls, find the workers awake.
#include "attn/attention.h"
#include "attn/internal.h"

#include <HalideRuntime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <new>
#include <pthread.h>
#include <string>
#include <thread>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace attn {
namespace {

// A worker parks once no kernel call has run for kLinger: longer than the gap between the
// calls of one forward (a layer's stages) and between back-to-back calls; short, so that the
// cores go back to the application (PyTorch's operators between two layers) soon after.
constexpr auto kLinger = std::chrono::microseconds(100);
// A caller whose loop's last tasks run on other threads yields its core after spinning this
// long (more threads than cores: the task it waits for needs one).
constexpr auto kSpin = std::chrono::microseconds(100);
using Clock = std::chrono::steady_clock;

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

// The thread's place in the pool: 0 for any thread not the pool's (the application's), i for
// its worker i (1 to threads - 1).
thread_local int pool_slot = 0;

// One parallel loop of a kernel. Its tasks are dealt in contiguous runs, one a thread of the
// pool up to the loop's task count, as OpenMP's static schedule deals them: a thread runs the
// run of its slot (pool_slot % runs) from the front, then takes what is left of the others'
// from their backs (a thread that is late has its run taken by the others). So where two
// loops' task counts divide alike (a projection's panels and the core's heads, both of the
// hidden features), the tasks of the same features fall to the same thread, which then reads
// what it computed in the loop before from its own cache: the heads of Q, K and V a thread's
// projection panels computed are the heads its core tasks read. Claimed in turn from one
// counter, half of them came from the other core's cache: on the Intel Xeon VM at two
// threads, MiniLM's core loop ran at 0.78 of twice its one-thread speed and its projections
// at 0.87; in runs 0.88 and 0.96.
struct Loop {
    static constexpr int kMaxRuns = 64;  // threads past it share runs (slot % runs)
    // A run's tasks still to claim, [front, back), in 32 bits each of one word; each run on a
    // cache line of its own, apart from the fields every task reads, so that threads claiming
    // from their own runs do not take the line from each other.
    struct alignas(64) Run {
        std::atomic<uint64_t> ends;
    };
    void *user_context;
    halide_task_t task;
    uint8_t *closure;
    int min, size;
    int runs = 1;
    Run run[kMaxRuns];
    alignas(64) std::atomic<int> helpers{0};  // workers working on it (added under the pool's lock)
    std::atomic<int> status{0};               // the first failing task's code

    // size > 0 (pool_do_par_for runs no loop of none).
    Loop(void *user_context, halide_task_t task, uint8_t *closure, int min, int size, int threads)
        : user_context(user_context),
          task(task),
          closure(closure),
          min(min),
          size(size),
          runs(std::max(1, std::min({threads, size, kMaxRuns}))) {
        for (int r = 0; r < runs; ++r) {
            const uint64_t front = uint64_t(size) * r / runs, back = uint64_t(size) * (r + 1) / runs;
            run[r].ends.store(back << 32 | front, std::memory_order_relaxed);
        }
    }

    bool open() const {
        for (int r = 0; r < runs; ++r) {
            const uint64_t e = run[r].ends.load(std::memory_order_relaxed);
            if (uint32_t(e) < uint32_t(e >> 32)) return true;
        }
        return false;
    }
    // No further task starts (one failed).
    void close() {
        for (int r = 0; r < runs; ++r) run[r].ends.store(0, std::memory_order_relaxed);
    }
    // The next task of run r, from its front (the threads whose run it is) or its back (the
    // others); -1 when none is left.
    int claim(int r, bool front) {
        uint64_t e = run[r].ends.load(std::memory_order_relaxed);
        for (;;) {
            const uint32_t f = uint32_t(e), b = uint32_t(e >> 32);
            if (f >= b) return -1;
            const uint64_t claimed = front ? (uint64_t(b) << 32 | (f + 1)) : (uint64_t(b - 1) << 32 | f);
            if (run[r].ends.compare_exchange_weak(e, claimed, std::memory_order_relaxed)) return int(front ? f : b - 1);
        }
    }
    // Runs tasks until none is left to claim: this thread's run, then the others'. Halide's
    // halide_do_task runs each, so an application's (or a test's) do_task hook sees them as
    // under Halide's own pool.
    void work() {
        const int own = pool_slot % runs;
        for (int k = 0; k < runs; ++k) {
            const int r = (own + k) % runs;
            for (int i = claim(r, k == 0); i >= 0; i = claim(r, k == 0)) {
                const int failed = halide_do_task(user_context, task, min + i, closure);
                if (failed != 0) {
                    int none = 0;
                    status.compare_exchange_strong(none, failed);
                    close();
                }
            }
        }
    }
};

// Halide's thread count and the pool's size, changed together (set_num_threads and a first
// call may race), and never across a fork.
std::mutex thread_count_mutex;

// Never destroyed (pool()): a thread may still run a kernel while the process exits, and
// its workers, parked or spinning, end with the process.
class Pool {
public:
    // fork(): no thread holds the pool's locks then, and the child, which has the forking
    // thread alone, forgets the parent's workers (they do not exist there: joining them would
    // fail) and starts its own at its first call (detail::KernelCall). The condition
    // variable is made anew: the parked workers are counted in it as waiters, which in the
    // child would never leave (its destruction, or a later notify, would wait for them).
    void before_fork() {
        thread_count_mutex.lock();
        mutex_.lock();
    }
    void after_fork_in_parent() {
        mutex_.unlock();
        thread_count_mutex.unlock();
    }
    void after_fork_in_child() {
        static auto *forgotten = new std::vector<std::thread>();  // never joined nor destroyed
        for (std::thread &worker : workers_) forgotten->push_back(std::move(worker));
        workers_.clear();
        loops_.clear();
        loops_offered_.store(0);
        calls_running_.store(0);
        sleeping_.store(0);
        threads_.store(1);
        new (&wake_) std::condition_variable();  // the parent's, with its waiters, is abandoned
        mutex_.unlock();
        thread_count_mutex.unlock();
    }

    // Runs every task of `loop`, the caller working too. A task may run a loop of its own
    // (nested parallelism): that loop is offered to idle workers the same way.
    int run(Loop &loop) {
        if (threads_.load(std::memory_order_relaxed) <= 1 || loop.size <= 1) {
            loop.work();
            return loop.status.load();
        }
        {
            std::lock_guard<std::mutex> lock(mutex_);
            loops_.push_back(&loop);
            loops_offered_.store(int(loops_.size()), std::memory_order_release);
            for (int i = std::min(sleeping_.load(), loop.size - 1); i > 0; --i) wake_.notify_one();
        }
        loop.work();
        {
            std::lock_guard<std::mutex> lock(mutex_);
            withdraw(&loop);
        }
        // The workers still on it are running its last tasks.
        const Clock::time_point yield_from = Clock::now() + kSpin;
        for (int polls = 1; loop.helpers.load(std::memory_order_acquire) != 0; ++polls) {
            cpu_relax();
            if (polls % 64 == 0 && Clock::now() > yield_from) std::this_thread::yield();
        }
        return loop.status.load();
    }

    // Kernel calls running (Call::run's CPU kernels): the workers spin while there are any,
    // and the first call wakes those parked, so that they are up by its first loop.
    void call_starts() {
        calls_running_.fetch_add(1);  // sequentially consistent with a parking worker's sleeping_
        if (sleeping_.load() > 0) {
            std::lock_guard<std::mutex> lock(mutex_);
            wake_.notify_all();
        }
    }
    void call_ends() { calls_running_.fetch_sub(1); }

    int threads() const { return threads_.load(std::memory_order_relaxed); }

    // Under thread_count_mutex: `threads` - 1 workers (the caller is the other). Workers of
    // the previous count finish the loop they work on (they claim its tasks until none is
    // left) and leave; a loop running meanwhile finishes with the threads it has.
    void set_threads(int threads) {
        if (threads == threads_.load()) return;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            generation_.fetch_add(1, std::memory_order_release);
            wake_.notify_all();
        }
        for (std::thread &worker : workers_) worker.join();
        workers_.clear();
        const unsigned generation = generation_.load();
        for (int i = 1; i < threads; ++i) {
            workers_.emplace_back([this, generation, i] {
                pool_slot = i;
                worker(generation);
            });
        }
        threads_.store(threads);
    }

private:
    // Under mutex_: takes the loop off the list of those offered.
    void withdraw(Loop *loop) {
        loops_.erase(std::remove(loops_.begin(), loops_.end(), loop), loops_.end());
        loops_offered_.store(int(loops_.size()), std::memory_order_release);
    }

    // Under mutex_: the newest loop offered with a task to claim (a nested loop before the
    // loop it runs in), now with one more helper; loops with none left are withdrawn.
    Loop *join_loop() {
        while (!loops_.empty()) {
            Loop *loop = loops_.back();
            if (loop->open()) {
                loop->helpers.fetch_add(1, std::memory_order_relaxed);
                return loop;
            }
            withdraw(loop);
        }
        return nullptr;
    }

    void worker(unsigned generation) {
        const auto current = [&] { return generation_.load(std::memory_order_acquire) == generation; };
        std::unique_lock<std::mutex> lock(mutex_);
        while (current()) {
            if (Loop *loop = join_loop()) {
                lock.unlock();
                loop->work();
                loop->helpers.fetch_sub(1, std::memory_order_release);
                lock.lock();
                continue;
            }
            lock.unlock();
            const bool offered = spin(generation);
            // Many workers see an offer at once: they spin for the lock rather than sleep on
            // it in the kernel, one after another.
            for (int tries = 0; !lock.try_lock(); ++tries) {
                if (tries == 1000) {
                    lock.lock();
                    break;
                }
                cpu_relax();
            }
            if (offered) continue;
            sleeping_.fetch_add(1);
            wake_.wait(lock, [&] { return !loops_.empty() || calls_running_.load() > 0 || !current(); });
            sleeping_.fetch_sub(1);
        }
    }

    // A worker without a task: spins until a loop is offered or its generation is over
    // (true), or until no call has run for kLinger (false: it parks). Past kSpin it lets
    // other threads have the core in turn.
    bool spin(unsigned generation) {
        const Clock::time_point spinning_since = Clock::now();
        Clock::time_point linger_until = spinning_since + kLinger;
        for (int polls = 1;; ++polls) {
            if (loops_offered_.load(std::memory_order_acquire) > 0 || generation_.load() != generation) return true;
            cpu_relax();
            if (polls % 64 != 0) continue;
            const Clock::time_point now = Clock::now();
            if (calls_running_.load(std::memory_order_relaxed) > 0) {
                linger_until = now + kLinger;
            } else if (now > linger_until) {
                return false;
            }
            if (now > spinning_since + kSpin) std::this_thread::yield();
        }
    }

    std::mutex mutex_;         // guards loops_, sleeping_ and the wake-ups
    std::condition_variable wake_;
    std::vector<Loop *> loops_;              // loops offered to the workers, newest last
    std::atomic<int> loops_offered_{0};      // loops_.size(), for spinning workers
    std::atomic<unsigned> generation_{0};    // a worker of an older generation leaves
    std::atomic<int> threads_{1};
    std::atomic<int> calls_running_{0};
    std::atomic<int> sleeping_{0};           // workers parked on wake_ (changed under mutex_)
    std::vector<std::thread> workers_;
};

Pool &pool() {
    static Pool &instance = *new Pool();
    static const bool fork_handlers = (pthread_atfork([] { pool().before_fork(); }, [] { pool().after_fork_in_parent(); },
                                                      [] { pool().after_fork_in_child(); }),
                                       true);
    (void)fork_handlers;
    return instance;
}

int pool_do_par_for(void *user_context, halide_task_t task, int min, int size, uint8_t *closure) {
    if (size <= 0) return 0;  // as Halide's own do_par_for: a loop of no task runs none
    Loop loop(user_context, task, closure, min, size, pool().threads());
    return pool().run(loop);
}

// Whether the kernels run on this pool: installed by the first call or thread count set,
// unless the application installed its own do_par_for before (it keeps it).
bool pool_installed() {
    static const bool installed =
        detail::install_hook(halide_set_custom_do_par_for, pool_do_par_for, halide_default_do_par_for);
    return installed;
}

// Under thread_count_mutex: the pool sized to Halide's count, the one in force (the
// schedules read it when they run: schedules/cpu_manual.cpp); 0 until set, then one per
// core or $HL_NUM_THREADS.
void size_pool() {
    if (!pool_installed()) return;
    if (halide_get_num_threads() == 0) halide_set_num_threads(0);
    if (pool().threads() != halide_get_num_threads()) pool().set_threads(halide_get_num_threads());
}

}  // namespace

namespace detail {
KernelCall::KernelCall() {
    {
        std::lock_guard<std::mutex> lock(thread_count_mutex);
        size_pool();
    }
    pool().call_starts();
}
KernelCall::~KernelCall() { pool().call_ends(); }
}  // namespace detail

int set_num_threads(int threads) {
    if (threads < 0 || threads > kMaxThreads) {
        throw Error("threads", "expected 0 (one per CPU core) to " + std::to_string(kMaxThreads) + ", got " +
                                   std::to_string(threads));
    }
    std::lock_guard<std::mutex> lock(thread_count_mutex);
    const int previous = halide_set_num_threads(threads);
    size_pool();
    return previous;
}

int num_threads() { return halide_get_num_threads(); }

}  // namespace attn
