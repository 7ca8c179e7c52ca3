// Properties that hold whatever the numerics: probability rows sum to 1 (0 when fully
// masked), the same input gives the same output, causal outputs ignore future tokens,
// real tokens ignore padded content, threads sharing one Attention get what one thread gets,
// the kernels use at most the threads set, and the host scratch cache hands back kept
// blocks without changing a result.
#include "attn/function_calls.h"
#include "attn/generated/manifest.h"
#include "attn/internal.h"  // detail::scratch_stats
#include "support/variant_param.h"

#include <HalideRuntime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace attn::testing {
namespace {

class PropertyTest : public ::testing::TestWithParam<VariantInfo> {};

// The layer's output, or nothing when the variant does not provide the function
// (see ran_or_refused in support/variant_param.h).
std::optional<std::vector<float>> run_layer(const VariantInfo &variant, const LayerData &data,
                                            std::vector<float> *probs = nullptr) {
    const Problem &p = data.problem;
    std::vector<float> y(std::size_t(p.batch * p.s_q * p.hidden));
    Attention layer(p.config(), data.weights(), variant.name);
    MutableTensor probs_view;
    if (probs) {
        probs->assign(std::size_t(p.batch * p.heads * p.s_q * p.s_k), 0.0f);
        probs_view = view(*probs, {p.batch, p.heads, p.s_q, p.s_k});
    }
    if (!ran_or_refused(variant, layer_function(probs != nullptr), [&] {
            layer.forward(data.inputs(), view(y, {p.batch, p.s_q, p.hidden}), probs_view);
        })) {
        return std::nullopt;
    }
    return y;
}

TEST_P(PropertyTest, ProbabilityRowsSumToOneOrZeroWhenFullyMasked) {
    ATTN_SKIP_IF_NOT_RUNNABLE(GetParam());
    Problem p;
    p.batch = 3, p.s_q = p.s_k = 113, p.hidden = 160, p.heads = 2, p.causal = true, p.mask = Mask::empty_batch;
    const LayerData data(p);
    std::vector<float> probs;
    if (!run_layer(GetParam(), data, &probs)) return;
    for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t h = 0; h < p.heads; ++h)
            for (int64_t i = 0; i < p.s_q; ++i) {
                double sum = 0;
                for (int64_t j = 0; j < p.s_k; ++j)
                    sum += probs[std::size_t(((b * p.heads + h) * p.s_q + i) * p.s_k + j)];
                const double expected = b == 0 ? 0.0 : 1.0;  // batch 0 has no real key
                ASSERT_NEAR(sum, expected, 1e-5) << "row b=" << b << " h=" << h << " i=" << i;
            }
}

// The outputs of `kept` elements (a token's whole row) must not change when other
// tokens change (`before` on `original`, `after` on the changed data): bit for bit for a
// reproducible schedule; for one that is not (VariantInfo::bitwise_reproducible), `after` must
// still match the reference of the original data on those elements, by the accuracy rule.
void expect_kept_unchanged(const VariantInfo &variant, const LayerData &original, const std::vector<float> &before,
                           const std::vector<float> &after, const std::vector<std::size_t> &kept, const char *what) {
    if (variant.bitwise_reproducible) {
        for (std::size_t i : kept) ASSERT_EQ(before[i], after[i]) << "element " << i << ": " << what;
        return;
    }
    const Config c = original.problem.config();
    const auto exact = reference::attention_layer<double>(c, original.weights(), original.inputs()).y;
    const auto plain = reference::attention_layer<float>(c, original.weights(), original.inputs()).y;
    std::vector<float> actual, plain_kept;
    std::vector<double> exact_kept;
    for (std::size_t i : kept)
        actual.push_back(after[i]), exact_kept.push_back(exact[i]), plain_kept.push_back(plain[i]);
    const Accuracy a = check_accuracy(actual.data(), exact_kept, plain_kept);
    EXPECT_TRUE(a.ok) << a.report(what);
}

TEST_P(PropertyTest, SameInputGivesTheSameOutput) {
    ATTN_SKIP_IF_NOT_RUNNABLE(GetParam());
    Problem p;
    p.batch = 2, p.s_q = p.s_k = 97, p.hidden = 80, p.heads = 2, p.causal = true;
    const LayerData data(p);
    const auto first = run_layer(GetParam(), data);
    if (!first) return;
    const auto second = run_layer(GetParam(), data);
    ASSERT_TRUE(second) << "refused a shape it ran before";
    std::vector<std::size_t> all(first->size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
    expect_kept_unchanged(GetParam(), data, *first, *second, all, "a second run on the same input differs");
}

TEST_P(PropertyTest, CausalOutputIgnoresFutureTokens) {
    ATTN_SKIP_IF_NOT_RUNNABLE(GetParam());
    Problem p;
    p.batch = 2, p.s_q = p.s_k = 97, p.hidden = 80, p.heads = 2, p.causal = true;
    const LayerData original(p);
    LayerData data = original;
    const auto before = run_layer(GetParam(), data);
    if (!before) return;
    const int64_t last_kept = 40;
    for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t s = last_kept + 1; s < p.s_q; ++s)
            for (int64_t h = 0; h < p.hidden; ++h) data.x[std::size_t((b * p.s_q + s) * p.hidden + h)] *= -3.0f;
    const auto after = run_layer(GetParam(), data);
    ASSERT_TRUE(after) << "refused a shape it ran before";
    std::vector<std::size_t> kept;
    for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t s = 0; s <= last_kept; ++s)
            for (int64_t h = 0; h < p.hidden; ++h) kept.push_back(std::size_t((b * p.s_q + s) * p.hidden + h));
    expect_kept_unchanged(GetParam(), original, *before, *after, kept, "a token saw a future token");
}

TEST_P(PropertyTest, RealTokensIgnorePaddedContent) {
    ATTN_SKIP_IF_NOT_RUNNABLE(GetParam());
    Problem p;
    p.batch = 3, p.s_q = p.s_k = 97, p.hidden = 80, p.heads = 2, p.mask = Mask::padding;
    const LayerData original(p);
    LayerData data = original;
    const auto before = run_layer(GetParam(), data);
    if (!before) return;
    for (std::size_t t = 0; t < data.mask.size(); ++t)
        if (!data.mask[t])
            for (int64_t h = 0; h < p.hidden; ++h) data.x[t * std::size_t(p.hidden) + std::size_t(h)] = 100.0f;
    const auto after = run_layer(GetParam(), data);
    ASSERT_TRUE(after) << "refused a shape it ran before";
    std::vector<std::size_t> kept;
    for (std::size_t t = 0; t < data.mask.size(); ++t)
        if (data.mask[t])
            for (int64_t h = 0; h < p.hidden; ++h) kept.push_back(t * std::size_t(p.hidden) + std::size_t(h));
    expect_kept_unchanged(GetParam(), original, *before, *after, kept, "a real token saw padded content");
}

// An Attention prepares its weight matrices when it is made (in fp32 in panels on a CPU,
// transposed and uploaded on a GPU): changing the caller's afterwards changes none of its results.
TEST_P(PropertyTest, AnAttentionKeepsTheWeightMatricesItWasMadeWith) {
    ATTN_SKIP_IF_NOT_RUNNABLE(GetParam());
    Problem p;
    p.batch = 2, p.s_q = p.s_k = 33, p.hidden = 64, p.heads = 2;
    LayerData data(p);
    Attention layer(p.config(), data.weights(), GetParam().name);
    std::vector<float> before(std::size_t(p.batch * p.s_q * p.hidden)), after(before.size());
    if (!ran_or_refused(GetParam(), layer_function(false), [&] {
            layer.forward(data.inputs(), view(before, {p.batch, p.s_q, p.hidden}));
        })) {
        return;
    }
    for (std::vector<float> *w : {&data.w_q, &data.w_k, &data.w_v, &data.w_o})
        for (float &value : *w) value = -value;
    layer.forward(data.inputs(), view(after, {p.batch, p.s_q, p.hidden}));
    layer.synchronize();
    std::vector<std::size_t> all(before.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
    expect_kept_unchanged(GetParam(), LayerData(p), before, after, all, "the caller's changed matrices were read");
}

TEST_P(PropertyTest, NaNInInputPropagatesWithoutCrashing) {
    ATTN_SKIP_IF_NOT_RUNNABLE(GetParam());
    Problem p;
    p.batch = 1, p.s_q = p.s_k = 9, p.hidden = 64, p.heads = 2;
    LayerData data(p);
    data.x[3 * 64 + 5] = NAN;  // token 3: its own row and, through K and V, every row
    const auto y = run_layer(GetParam(), data);
    if (!y) return;
    EXPECT_TRUE(std::isnan((*y)[3 * 64])) << "the row holding the NaN must be NaN";
}

// Eight threads share one Attention, each calling forward on its own input a few
// times: every result is bit for bit the single-threaded call's on that input. (The
// CPU variants; the GPU ones are not checked for this.)
TEST_P(PropertyTest, EightThreadsSharingOneAttentionGetTheSingleThreadedResult) {
    ATTN_SKIP_IF_NOT_RUNNABLE(GetParam());
    if (GetParam().device != "cpu") GTEST_SKIP() << "concurrency is checked on the CPU variants only";
    Problem p;  // BERT-base width: a shape every autoscheduled variant runs
    p.batch = 2, p.s_q = p.s_k = 128, p.hidden = 768, p.heads = 12, p.mask = Mask::padding;
    constexpr int kThreads = 8, kCalls = 3;
    std::vector<LayerData> data;
    for (int t = 0; t < kThreads; ++t) data.emplace_back(p, uint32_t(100 + t));
    const Attention layer(p.config(), data[0].weights(), GetParam().name);
    const Shape y_shape{p.batch, p.s_q, p.hidden};
    std::vector<std::vector<float>> expected(kThreads, std::vector<float>(std::size_t(p.batch * p.s_q * p.hidden)));
    for (int t = 0; t < kThreads; ++t) {
        AttentionInputs in = data[std::size_t(t)].inputs();
        if (!ran_or_refused(GetParam(), "attention_layer",
                            [&] { layer.forward(in, view(expected[std::size_t(t)], y_shape)); })) {
            return;
        }
    }
    std::vector<std::string> failures(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            std::vector<float> y(expected[std::size_t(t)].size());
            try {
                for (int call = 0; call < kCalls; ++call) {
                    layer.forward(data[std::size_t(t)].inputs(), view(y, y_shape));
                    if (y != expected[std::size_t(t)])
                        failures[std::size_t(t)] += "call " + std::to_string(call) + " differs; ";
                }
            } catch (const std::exception &e) {
                failures[std::size_t(t)] = e.what();
            }
        });
    }
    for (std::thread &thread : threads) thread.join();
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[std::size_t(t)], "") << "thread " << t;
}

// The do_par_for Halide's loops call now (the library's pool once a call or
// set_num_threads installed it).
halide_do_par_for_t current_do_par_for() {
    const halide_do_par_for_t current = halide_set_custom_do_par_for(halide_default_do_par_for);
    halide_set_custom_do_par_for(current);
    return current;
}

// Restores the kernels' thread count and Halide's task hooks when a test leaves, however
// (it starts at 1 thread, the library's pool and Halide's own task hooks).
struct KernelThreadsRestored {
    int threads = set_num_threads(1);
    halide_do_par_for_t par_for = current_do_par_for();
    halide_do_task_t task = halide_set_custom_do_task(halide_default_do_task);
    halide_do_loop_task_t loop_task = halide_set_custom_do_loop_task(halide_default_do_loop_task);
    ~KernelThreadsRestored() {
        set_num_threads(threads);
        halide_set_custom_do_par_for(par_for);
        halide_set_custom_do_task(task);
        halide_set_custom_do_loop_task(loop_task);
    }
};

// The kernels' threads (attn::set_num_threads): every task of a parallel loop runs on one
// of at most the threads set, and where more than one is allowed, more than one works.
// Halide runs each task through halide_do_task or halide_do_loop_task, which the test
// wraps to note the thread.
std::mutex task_threads_mutex;
std::set<std::thread::id> task_threads;

void note_task_thread() {
    std::lock_guard<std::mutex> lock(task_threads_mutex);
    task_threads.insert(std::this_thread::get_id());
}
int noting_do_task(void *user_context, halide_task_t f, int idx, uint8_t *closure) {
    note_task_thread();
    return halide_default_do_task(user_context, f, idx, closure);
}
int noting_do_loop_task(void *user_context, halide_loop_task_t f, int min, int extent, uint8_t *closure, void *parent) {
    note_task_thread();
    return halide_default_do_loop_task(user_context, f, min, extent, closure, parent);
}

TEST(Threads, KernelsRunOnAtMostTheThreadsSet) {
    const VariantInfo &variant = select_variant();
    Problem p;
    p.batch = 2, p.s_q = p.s_k = 128, p.hidden = 256, p.heads = 4;
    const LayerData data(p);
    const Attention layer(p.config(), data.weights(), variant.name);
    const Shape y_shape{p.batch, p.s_q, p.hidden};
    std::vector<float> y(std::size_t(p.batch * p.s_q * p.hidden));
    const KernelThreadsRestored restored;
    halide_set_custom_do_task(noting_do_task);
    halide_set_custom_do_loop_task(noting_do_loop_task);
    for (const int threads : {1, 2, 3}) {
        set_num_threads(threads);
        EXPECT_EQ(num_threads(), threads);
        // A sleeping worker wakes when work is queued, and the caller may finish a short
        // loop before it does: more calls, until two threads have worked (or 50 calls).
        std::size_t most = 0;
        for (int call = 0; call < 50 && most < std::min<std::size_t>(threads, 2); ++call) {
            {
                std::lock_guard<std::mutex> lock(task_threads_mutex);
                task_threads.clear();
            }
            layer.forward(data.inputs(), view(y, y_shape));
            std::lock_guard<std::mutex> lock(task_threads_mutex);
            most = std::max(most, task_threads.size());
        }
        EXPECT_LE(most, std::size_t(threads)) << variant.name << " ran tasks on more threads than set";
        EXPECT_GE(most, std::min<std::size_t>(threads, 2)) << variant.name << " used fewer threads than allowed";
        std::cout << "[   INFO   ] " << variant.name << ", " << threads << " threads set: tasks ran on " << most
                  << "\n";
    }
    EXPECT_THROW(set_num_threads(-1), Error);
    try {
        set_num_threads(257);
        ADD_FAILURE() << "257 threads accepted";
    } catch (const Error &e) {
        EXPECT_EQ(e.argument(), "threads");
        EXPECT_NE(std::string(e.what()).find("257"), std::string::npos) << e.what();
    }
}

// The library's pool (runtime/src/threads.cpp) through Halide's own entry point, as the
// kernels call it: every task of a loop runs exactly once, from its `min`, at 1 to 8 threads;
// a task's own loop (nested parallelism) too; loops from several application threads at once
// each finish whole; a loop of no task runs none; a failing task's code is the loop's, and no
// task runs twice.
struct TaskCounts {
    std::vector<std::atomic<int>> runs;
    int fail_at = -1;
    explicit TaskCounts(std::size_t n) : runs(n) {}
};
int count_task(void *, int index, uint8_t *closure) {
    TaskCounts &counts = *reinterpret_cast<TaskCounts *>(closure);
    counts.runs[std::size_t(index - 100)].fetch_add(1);
    return index - 100 == counts.fail_at ? -7 : 0;
}
struct NestedLoops {
    TaskCounts inner{8 * 50};
};
int nested_task(void *user_context, int outer, uint8_t *closure) {
    // Inner tasks 100 + outer * 50 ... + 49: each outer task's own loop.
    NestedLoops &loops = *reinterpret_cast<NestedLoops *>(closure);
    return halide_do_par_for(user_context, count_task, 100 + outer * 50, 50, reinterpret_cast<uint8_t *>(&loops.inner));
}
std::string runs_other_than_once(const TaskCounts &counts) {
    std::string wrong;
    for (std::size_t i = 0; i < counts.runs.size(); ++i) {
        if (counts.runs[i].load() != 1) wrong += " task " + std::to_string(i) + " ran " + std::to_string(counts.runs[i].load());
    }
    return wrong;
}

TEST(Threads, PoolRunsEveryTaskOnce) {
    const KernelThreadsRestored restored;
    ASSERT_NE(current_do_par_for(), halide_default_do_par_for) << "the library's pool is not installed";
    for (const int threads : {1, 2, 3, 8}) {
        set_num_threads(threads);
        for (int repeat = 0; repeat < 20; ++repeat) {
            TaskCounts flat(1000);
            ASSERT_EQ(halide_do_par_for(nullptr, count_task, 100, 1000, reinterpret_cast<uint8_t *>(&flat)), 0);
            EXPECT_EQ(runs_other_than_once(flat), "") << threads << " threads";
            NestedLoops nested;
            ASSERT_EQ(halide_do_par_for(nullptr, nested_task, 0, 8, reinterpret_cast<uint8_t *>(&nested)), 0);
            EXPECT_EQ(runs_other_than_once(nested.inner), "") << threads << " threads, nested";
        }
        std::vector<std::thread> callers;
        std::vector<std::string> wrong(4);
        for (int c = 0; c < 4; ++c) {
            callers.emplace_back([&wrong, c] {
                for (int repeat = 0; repeat < 50 && wrong[std::size_t(c)].empty(); ++repeat) {
                    TaskCounts counts(97);
                    const int status = halide_do_par_for(nullptr, count_task, 100, 97, reinterpret_cast<uint8_t *>(&counts));
                    wrong[std::size_t(c)] = (status ? " status " + std::to_string(status) : "") + runs_other_than_once(counts);
                }
            });
        }
        for (std::thread &caller : callers) caller.join();
        for (int c = 0; c < 4; ++c) EXPECT_EQ(wrong[std::size_t(c)], "") << threads << " threads, caller " << c;
        // A loop of no task (or fewer: Halide's own do_par_for runs none) runs none.
        for (const int none : {0, -1, -1000}) {
            TaskCounts counts(1);
            EXPECT_EQ(halide_do_par_for(nullptr, count_task, 100, none, reinterpret_cast<uint8_t *>(&counts)), 0);
            EXPECT_EQ(counts.runs[0].load(), 0) << threads << " threads, a loop of " << none << " tasks";
        }
        TaskCounts failing(200);
        failing.fail_at = 37;
        EXPECT_EQ(halide_do_par_for(nullptr, count_task, 100, 200, reinterpret_cast<uint8_t *>(&failing)), -7)
            << threads << " threads";
        EXPECT_EQ(failing.runs[37].load(), 1);
        for (const std::atomic<int> &runs : failing.runs) EXPECT_LE(runs.load(), 1) << threads << " threads, failing";
    }
}

// The pool deals a loop's tasks in contiguous runs, one a thread (runtime/src/threads.cpp's
// Loop), so that task i of every loop of n tasks runs on the same thread while the threads
// keep pace. Each task here waits until every thread has started one (a barrier of `threads`),
// so none can finish its run early and take another's: in a loop of 2·threads tasks, thread k
// runs tasks 2k and 2k + 1, and in the next loop, of `threads` tasks, task k, on the same thread.
struct TaskThreads {
    std::mutex mutex;
    std::condition_variable all_started;
    int parties = 0, arrived = 0, generation = 0;
    bool timed_out = false;
    std::vector<std::thread::id> thread_of;
    // Waits until `parties` tasks have arrived (at most 10 s: a pool that never brings a
    // thread fails the test instead of hanging it).
    void arrive(int task) {
        std::unique_lock<std::mutex> lock(mutex);
        thread_of[std::size_t(task)] = std::this_thread::get_id();
        const int mine = generation;
        if (++arrived == parties) {
            arrived = 0, ++generation;
            all_started.notify_all();
            return;
        }
        if (!all_started.wait_for(lock, std::chrono::seconds(10), [&] { return generation != mine; })) {
            timed_out = true;
            arrived = 0, ++generation;  // releases the others
            all_started.notify_all();
        }
    }
};
int task_at_barrier(void *, int index, uint8_t *closure) {
    reinterpret_cast<TaskThreads *>(closure)->arrive(index);
    return 0;
}

TEST(Threads, PoolDealsEachThreadTheSameRunOfEveryLoop) {
    const KernelThreadsRestored restored;
    ASSERT_NE(current_do_par_for(), halide_default_do_par_for) << "the library's pool is not installed";
    for (const int threads : {2, 4}) {
        set_num_threads(threads);
        TaskThreads pairs, singles;
        pairs.parties = singles.parties = threads;
        pairs.thread_of.resize(std::size_t(2 * threads));
        singles.thread_of.resize(std::size_t(threads));
        ASSERT_EQ(halide_do_par_for(nullptr, task_at_barrier, 0, 2 * threads, reinterpret_cast<uint8_t *>(&pairs)), 0);
        ASSERT_EQ(halide_do_par_for(nullptr, task_at_barrier, 0, threads, reinterpret_cast<uint8_t *>(&singles)), 0);
        ASSERT_FALSE(pairs.timed_out || singles.timed_out) << threads << " threads: a task waited 10 s for the others";
        const std::set<std::thread::id> distinct(singles.thread_of.begin(), singles.thread_of.end());
        EXPECT_EQ(distinct.size(), std::size_t(threads)) << threads << " threads";
        for (int k = 0; k < threads; ++k) {
            const std::size_t i = std::size_t(k);
            EXPECT_EQ(pairs.thread_of[2 * i], pairs.thread_of[2 * i + 1]) << threads << " threads, run " << k;
            EXPECT_EQ(pairs.thread_of[2 * i], singles.thread_of[i]) << threads << " threads, run " << k;
        }
        EXPECT_EQ(singles.thread_of[0], std::this_thread::get_id()) << "the caller runs the first run";
    }
}

// fork() after the kernels ran on two threads, their worker parked (0.1 ms after the call)
// and then spinning (during one): the child, which has the forking thread alone, runs the
// layer on threads of its own, gets the parent's result bit for bit and exits normally (the
// parent's workers, which do not exist there, were waiters of the pool's condition variable).
TEST(Threads, ChildOfForkRunsTheKernels) {
    const VariantInfo &variant = select_variant();
    Problem p;
    p.batch = 1, p.s_q = p.s_k = 64, p.hidden = 256, p.heads = 4;
    const LayerData data(p);
    const Attention layer(p.config(), data.weights(), variant.name);
    const Shape y_shape{p.batch, p.s_q, p.hidden};
    std::vector<float> y(std::size_t(p.batch * p.s_q * p.hidden));
    const KernelThreadsRestored restored;
    set_num_threads(2);
    layer.forward(data.inputs(), view(y, y_shape));
    for (const bool parked : {true, false}) {
        if (parked) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        } else {
            layer.forward(data.inputs(), view(y, y_shape));  // the worker still spins after it
        }
        std::cout.flush();
        const pid_t child = fork();
        ASSERT_NE(child, -1) << "fork failed";
        if (child == 0) {
            std::vector<float> again(y.size());
            for (int call = 0; call < 3; ++call) {
                layer.forward(data.inputs(), view(again, y_shape));
                if (call == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // its own worker parks
            }
            std::exit(again == y && num_threads() == 2 ? 0 : 3);
        }
        // A child that hangs is killed after a minute (it takes milliseconds).
        int status = 0;
        pid_t waited = 0;
        for (int poll = 0; poll < 6000 && (waited = waitpid(child, &status, WNOHANG)) == 0; ++poll)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (waited == 0) {
            kill(child, SIGKILL);
            waitpid(child, &status, 0);
            FAIL() << "the child of a fork " << (parked ? "with the worker parked" : "with the worker spinning")
                   << " hung";
        }
        ASSERT_EQ(waited, child);
        ASSERT_TRUE(WIFEXITED(status)) << "the child did not exit normally (signal " << WTERMSIG(status) << ")";
        EXPECT_EQ(WEXITSTATUS(status), 0) << "3: the child's result or thread count differs";
    }
}

// On more than 4 kernel threads the hand-written CPU schedules split their work finer (a
// projection's panels by blocks of rows, a head's query blocks: schedules/cpu_manual.cpp,
// chosen when the pipeline runs). Each output is computed the same way either way, so every
// CPU variant, in each precision it has, dense and packed, gives at 16 threads what it gives
// at 1, bit for bit (packed where the variant has the packed layer): on a padded batch, and
// causal at S=97 (partial blocks of rows, queries and keys).
TEST(Threads, SixteenKernelThreadsGiveWhatOneGives) {
    Problem padded, causal;
    padded.batch = 2, padded.s_q = padded.s_k = 128, padded.hidden = 256, padded.heads = 4;
    padded.mask = Mask::padding;
    causal.batch = 1, causal.s_q = causal.s_k = 97, causal.hidden = 256, causal.heads = 4, causal.causal = true;
    const KernelThreadsRestored restored;
    int compared = 0;
    for (const Problem &p : {padded, causal}) {
        const LayerData data(p);
        const PackedBatch packed = data.packed();
        for (const Precision precision : {Precision::fp32, Precision::bf16, Precision::int8}) {
            for (const VariantInfo *v : precision_variants(precision)) {
                if (v->device != "cpu" || !v->runnable) continue;
                Config config = p.config();
                config.precision = precision;
                config.allow_storage_only = true;
                const Attention layer(config, data.weights(), v->name);
                const std::string packed_function =
                    precision == Precision::fp32 ? "attention_layer_packed" : reduced_precision(precision).packed_layer;
                const bool has_packed = v->provides(packed_function);
                std::vector<float> dense[2], tokens[2];
                for (int run = 0; run < 2; ++run) {
                    set_num_threads(run == 0 ? 1 : 16);
                    dense[run].assign(std::size_t(p.batch * p.s_q * p.hidden), 0.0f);
                    tokens[run].assign(packed.x.size(), 0.0f);
                    layer.forward(data.inputs(), view(dense[run], {p.batch, p.s_q, p.hidden}));
                    if (has_packed)
                        layer.forward_packed(packed.inputs(), view(tokens[run], {packed.tokens(), p.hidden}));
                }
                const std::string what = v->name + " in " + precision_name(precision) + " on " + p.name();
                EXPECT_TRUE(dense[0] == dense[1]) << what << ": forward differs at 16 threads";
                EXPECT_TRUE(tokens[0] == tokens[1]) << what << ": forward_packed differs at 16 threads";
                ++compared;
            }
        }
    }
    std::cout << "[   INFO   ] " << compared << " CPU variants and precisions compared\n";
    EXPECT_GT(compared, 0);
}

// What the kernels' parallel loops offer many threads: a BERT-base layer at B=1 S=128 on the
// default variant, its loops noted through Halide's do_par_for and do_task hooks (a loop run
// inside a task is nested in the loop that task belongs to). The same call's loops, in the
// same order, at 2 threads and at 16: at 16, the four projections (a panel by a block of
// rows a task) and the attention core (a head's query block a task) each offer more tasks
// than at 2 (a panel, a head), and at least 24; LayerNorm's rows offer as many either way.
thread_local int task_depth = 0;
std::mutex loops_mutex;
std::vector<std::pair<int, int>> loop_tasks;  // per top-level loop: its iterations, the most of a loop in it
int noting_loop_task(void *user_context, halide_task_t f, int idx, uint8_t *closure) {
    ++task_depth;
    const int status = halide_default_do_task(user_context, f, idx, closure);
    --task_depth;
    return status;
}
halide_do_par_for_t kernels_do_par_for = nullptr;  // the library's pool, which noting_par_for passes loops on to
int noting_par_for(void *user_context, halide_task_t f, int min, int size, uint8_t *closure) {
    {
        std::lock_guard<std::mutex> lock(loops_mutex);
        if (task_depth == 0) {
            loop_tasks.push_back({size, 1});
        } else if (!loop_tasks.empty()) {
            loop_tasks.back().second = std::max(loop_tasks.back().second, size);
        }
    }
    return kernels_do_par_for(user_context, f, min, size, closure);
}
// The loops one call of `run` hands the pool, noted (loop_tasks); `run` is called once
// before, so that the pool and the scratch memory are there.
void note_loops(const std::function<void()> &run) {
    run();
    loop_tasks.clear();
    kernels_do_par_for = halide_set_custom_do_par_for(noting_par_for);
    halide_set_custom_do_task(noting_loop_task);
    run();
    halide_set_custom_do_par_for(kernels_do_par_for);
    halide_set_custom_do_task(halide_default_do_task);
}
// The tasks each top-level loop of one forward call offers at `threads`.
std::vector<int> tasks_per_loop(const Attention &layer, const LayerData &data, int threads) {
    const Problem &p = data.problem;
    std::vector<float> y(std::size_t(p.batch * p.s_q * p.hidden));
    set_num_threads(threads);
    note_loops([&] { layer.forward(data.inputs(), view(y, {p.batch, p.s_q, p.hidden})); });
    std::vector<int> tasks;
    for (const auto &[iterations, nested] : loop_tasks) tasks.push_back(iterations * nested);
    return tasks;
}

TEST(Threads, SixteenThreadsFindTasksInEveryLargeLoop) {
    const VariantInfo &variant = select_variant();
    if (variant.schedule != "manual" && variant.schedule != "autotuned")
        GTEST_SKIP() << variant.name << " is not the hand-written schedule";
    Problem p;  // BERT-base, B=1 S=128
    const LayerData data(p);
    const Attention layer(p.config(), data.weights(), variant.name);
    const KernelThreadsRestored restored;
    const std::vector<int> at_two = tasks_per_loop(layer, data, 2), at_sixteen = tasks_per_loop(layer, data, 16);
    ASSERT_EQ(at_two.size(), at_sixteen.size()) << variant.name << ": the call's parallel loops differ in number";
    int grown = 0;
    std::string loops;
    for (std::size_t l = 0; l < at_two.size(); ++l) {
        if (at_sixteen[l] > at_two[l] && at_sixteen[l] >= 24) ++grown;
        loops += " " + std::to_string(at_two[l]) + "->" + std::to_string(at_sixteen[l]);
    }
    EXPECT_GE(grown, 5) << variant.name << ": the projections and the core should each offer more tasks, and 24 or "
                        << "more, at 16 threads; tasks per loop at 2 -> 16 threads:" << loops;
    std::cout << "[   INFO   ] " << variant.name << ", tasks per parallel loop at 2 -> 16 threads:" << loops << "\n";
}

// How many parallel loops a call runs does not grow with the sequence: a parallel loop
// inside a serial one over rows or keys pays a hand-over to the pool's threads each time
// (attention_core's output copy did, fused over head and batch, which its rows separated:
// 128 loops of 12 tiny tasks a call at S=128, half its time on two threads). Every function
// of every hand-written and tuned CPU variant that runs here, at S=64 and S=256: the same
// count of top-level loops. (The autoschedulers' variants are theirs.)
TEST(Threads, ParallelLoopsPerCallDoNotGrowWithTheSequence) {
    const KernelThreadsRestored restored;
    set_num_threads(2);
    int checked = 0;
    for (const VariantInfo &variant : variants()) {
        if (variant.device != "cpu" || !variant.runnable ||
            (variant.schedule != "manual" && variant.schedule != "autotuned"))
            continue;
        for (const manifest::Function &f : manifest::kFunctions) {
            if (!variant.provides(f.name) || !detail::has_function_call(f.name)) continue;
            const detail::FunctionCall &call = detail::function_call(f.name);
            std::vector<std::size_t> loops;
            for (const int64_t s : {64, 256}) {
                Problem p;
                p.batch = 2, p.s_q = p.s_k = s, p.hidden = 256, p.heads = 4;
                const LayerData data(p);
                const PackedBatch packed = data.packed();
                const AttentionInputs layer = data.inputs();
                // The stages' inputs: any values of the right shapes (only the loops are counted).
                const std::vector<float> rows(std::size_t(p.batch * s * p.hidden), 0.5f),
                    squares(std::size_t(p.batch * p.heads * s * s), 0.25f);
                const Shape row_shape{p.batch, s, p.hidden}, square_shape{p.batch, p.heads, s, s};
                detail::CallInputs in;
                in.x = layer.x, in.key_padding_mask = layer.key_padding_mask, in.bias = layer.bias;
                in.weights = data.weights(), in.packed = packed.inputs();
                in.q = in.k = in.v = in.ctx = ConstTensor{rows.data(), rows.size(), row_shape};
                in.scores = in.probs = ConstTensor{squares.data(), squares.size(), square_shape};
                const detail::CallShape shape{p.config(), p.batch, p.s_q, p.s_k};
                const std::vector<detail::CallOutput> shapes = call.outputs(shape, in);
                std::vector<GuardedOutput> outputs;
                outputs.reserve(shapes.size());
                std::vector<MutableTensor> views;
                for (const detail::CallOutput &o : shapes) outputs.emplace_back(o.shape);
                for (GuardedOutput &o : outputs) views.push_back(o.view());
                note_loops(call.prepare(variant, shape, in, views));
                loops.push_back(loop_tasks.size());
            }
            EXPECT_EQ(loops[0], loops[1])
                << variant.name << " " << f.name << ": " << loops[0] << " parallel loops a call at "
                << "S=64, " << loops[1] << " at S=256";
            ++checked;
        }
    }
    std::cout << "[   INFO   ] " << checked << " functions of hand-written and tuned CPU variants checked\n";
    EXPECT_GT(checked, 0);
}

// The host scratch cache (runtime/src/host_scratch.cpp): a second call of the same shape
// takes no new large block from the system and gives bit for bit the first call's result
// (kept blocks hold the last call's values, which nothing may read); threads calling at
// once each get their own blocks; release_scratch_memory gives back what is kept.
TEST(ScratchCache, LargeIntermediatesAreKeptForTheNextCall) {
    const VariantInfo &variant = select_variant();
    release_scratch_memory();
    Problem p;  // q, k, v, the context and the output's rows: 1.5 MiB each
    p.batch = 4, p.s_q = p.s_k = 128, p.hidden = 768, p.heads = 12, p.mask = Mask::padding;
    const LayerData data(p);
    const Attention layer(p.config(), data.weights(), variant.name);
    const Shape y_shape{p.batch, p.s_q, p.hidden};
    std::vector<float> first(std::size_t(p.batch * p.s_q * p.hidden));
    layer.forward(data.inputs(), view(first, y_shape));
    const detail::ScratchStats after_first = detail::scratch_stats();
    ASSERT_GT(after_first.kept_bytes, 0u) << variant.name << " allocated no intermediate of 1 MiB or more";

    std::vector<float> again(first.size());
    layer.forward(data.inputs(), view(again, y_shape));
    const detail::ScratchStats after_second = detail::scratch_stats();
    EXPECT_EQ(after_second.allocated, after_first.allocated) << "the second call allocated large blocks again";
    EXPECT_GT(after_second.reused, after_first.reused);
    EXPECT_EQ(after_second.kept_bytes, after_first.kept_bytes);
    EXPECT_EQ(again, first);

    std::vector<std::string> failures(4);
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < failures.size(); ++t) {
        threads.emplace_back([&, t] {
            std::vector<float> y(first.size());
            for (int call = 0; call < 3; ++call) {
                layer.forward(data.inputs(), view(y, y_shape));
                if (y != first) failures[t] += "call " + std::to_string(call) + " differs; ";
            }
        });
    }
    for (std::thread &thread : threads) thread.join();
    for (std::size_t t = 0; t < failures.size(); ++t) EXPECT_EQ(failures[t], "") << "thread " << t;

    const std::size_t kept = detail::scratch_stats().kept_bytes;
    EXPECT_EQ(release_scratch_memory(), kept);
    EXPECT_EQ(detail::scratch_stats().kept_bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(AllVariants, PropertyTest, ::testing::ValuesIn(variants()),
                         [](const ::testing::TestParamInfo<VariantInfo> &info) { return info.param.name; });

}  // namespace
}  // namespace attn::testing
