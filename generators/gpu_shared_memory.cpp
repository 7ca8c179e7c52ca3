#include "gpu_shared_memory.h"

#include "attn/generated/manifest.h"

#include <map>
#include <optional>
#include <vector>

namespace attn_gen {

using namespace Halide;
using namespace Halide::Internal;

namespace {

// Runs last in lowering, before Halide moves the GPU loops into kernels: each outermost
// GPU block loop is then a kernel, and the block's shared allocations sit inside it
// (Halide has hoisted them out of the thread loops). Their sizes are expressions of the
// shapes; the pass bounds each from above, through the enclosing lets and loops, by a
// constant (find_constant_bound), and sums them per kernel. Halide aligns each
// allocation within the block's one dynamic buffer, hence a small allowance.
class SharedMemoryCheck : public IRMutator {
public:
    SharedMemoryCheck(std::string build, int limit_bytes) : build_(std::move(build)), limit_(limit_bytes) {}

private:
    using IRMutator::visit;

    struct Kernel {
        std::string name;
        int64_t bytes = 0;
        bool unbounded = false;  // some allocation has no constant bound
    };

    template <typename LetOrLetStmt>
    auto visit_let(const LetOrLetStmt *op) {
        ScopedBinding<Interval> bind(scope_, op->name, bounds_of_expr_in_scope(op->value, scope_));
        ScopedBinding<Expr> value(lets_, op->name, op->value);
        return IRMutator::visit(op);
    }

    Expr visit(const Let *op) override { return visit_let(op); }

    Stmt visit(const For *op) override {
        Interval loop = bounds_of_expr_in_scope(op->min, scope_);
        loop.max = bounds_of_expr_in_scope(op->min + op->extent - 1, scope_).max;
        ScopedBinding<Interval> bind(scope_, op->name, loop);
        const bool kernel = op->for_type == ForType::GPUBlock && !in_kernel_;
        if (!kernel) return IRMutator::visit(op);
        in_kernel_ = true;
        kernel_ = Kernel{op->name.substr(0, op->name.find(".s")), 0, false};
        Stmt s = IRMutator::visit(op);
        in_kernel_ = false;
        report(kernel_);
        return s;
    }

    // Where an allocation's size varies from block to block, Halide computes the largest on
    // the host before the launch: X.shared_size[0] = max(X.shared_size[0], size), in a loop
    // over the blocks, then read into the let X.shared_size_var. So each such store is
    // bounded (its own load taken as 0, the initial value), and the let by their maximum.
    Stmt visit(const Store *op) override {
        if (ends_with(op->name, ".shared_size")) {
            const std::optional<int64_t> bound = upper_bound(resolved(ZeroLoadsOf(op->name).mutate(op->value)));
            const auto [largest, first] = largest_size_.try_emplace(op->name + "_var", bound);
            if (!first) largest->second = largest->second && bound ? std::max(largest->second, bound) : std::nullopt;
        }
        return IRMutator::visit(op);
    }

    Stmt visit(const LetStmt *op) override {
        const auto largest = largest_size_.find(op->name);
        if (largest == largest_size_.end() || !largest->second) return visit_let(op);
        ScopedBinding<Interval> bind(
            scope_, op->name, Interval(make_zero(op->value.type()), make_const(op->value.type(), *largest->second)));
        return IRMutator::visit(op);
    }

    // `e` with the enclosing lets' values in place of their names, simplified: a size such
    // as min(a, b) - a is bounded only once a is seen on both sides.
    Expr resolved(const Expr &e) const {
        struct Resolve : public IRMutator {
            explicit Resolve(const Scope<Expr> &lets) : lets(lets) {}
            using IRMutator::visit;
            Expr visit(const Variable *v) override {
                if (!lets.contains(v->name) || depth > kMaxDepth) return v;
                ++depth;
                Expr value = mutate(lets.get(v->name));
                --depth;
                return value;
            }
            const Scope<Expr> &lets;
            int depth = 0;
        };
        return simplify(Resolve(lets_).mutate(e));
    }
    static constexpr int kMaxDepth = 32;

    struct ZeroLoadsOf : public IRMutator {
        explicit ZeroLoadsOf(std::string name) : name(std::move(name)) {}
        using IRMutator::visit;
        Expr visit(const Load *op) override { return op->name == name ? make_zero(op->type) : IRMutator::visit(op); }
        std::string name;
    };

    // A constant upper bound of a size `e`, given the enclosing lets and loops, if there is
    // one. Every factor of a size is an extent, never negative at run time (Halide cannot
    // prove it of a tile's remainder, min(extent - 32·block, 32)), so a product is bounded
    // by the product of its factors' bounds and a min by its smallest bounded operand.
    std::optional<int64_t> upper_bound(const Expr &e) const {
        if (const Mul *m = e.as<Mul>()) {
            const std::optional<int64_t> a = upper_bound(m->a), b = upper_bound(m->b);
            return a && b ? std::optional<int64_t>(std::max<int64_t>(*a, 0) * std::max<int64_t>(*b, 0)) : std::nullopt;
        }
        if (const Add *add = e.as<Add>()) {
            const std::optional<int64_t> a = upper_bound(add->a), b = upper_bound(add->b);
            return a && b ? std::optional<int64_t>(*a + *b) : std::nullopt;
        }
        if (const Min *m = e.as<Min>()) {
            const std::optional<int64_t> a = upper_bound(m->a), b = upper_bound(m->b);
            return a && b ? std::min(a, b) : a ? a : b;
        }
        if (const Max *m = e.as<Max>()) {
            const std::optional<int64_t> a = upper_bound(m->a), b = upper_bound(m->b);
            return a && b ? std::max(a, b) : std::nullopt;
        }
        if (const Cast *c = e.as<Cast>()) return upper_bound(c->value);
        if (const Variable *v = e.as<Variable>()) {
            if (scope_.contains(v->name) && scope_.get(v->name).has_upper_bound()) {
                return upper_bound(scope_.get(v->name).max);
            }
        }
        const Expr bound = find_constant_bound(simplify(e), Direction::Upper, scope_);
        return bound.defined() ? as_const_int(simplify(bound)) : std::nullopt;
    }

    Stmt visit(const Allocate *op) override {
        if (in_kernel_ && op->memory_type == MemoryType::GPUShared) {
            Expr bytes = op->type.bytes();
            for (const Expr &extent : op->extents) bytes *= extent;
            const std::optional<int64_t> value = upper_bound(resolved(bytes));
            if (value) {
                kernel_.bytes += *value + kAlignment;
            } else {
                kernel_.unbounded = true;
            }
        }
        return IRMutator::visit(op);
    }

    // A kernel whose bounded allocations alone pass the limit fails the build. One whose
    // size Halide's bounds cannot pin to a constant (the fused layer's, over data-dependent
    // key ranges) is left to the tests, which record every launch's shared memory on PoCL
    // (tests/test_gpu.cpp).
    void report(const Kernel &k) const {
        if (k.bytes <= limit_) return;
        throw CompileError(build_ + ": GPU kernel " + k.name + " needs " + (k.unbounded ? "more than " : "up to ") +
                           std::to_string(k.bytes) + " bytes of shared memory per block, over the " +
                           std::to_string(limit_) +
                           " a block gets (manifest.json: gpu_shared_memory_per_block; Halide 21 never opts in to "
                           "more). It would fail on a GPU, while PoCL in CI allows it. Shrink its tiles.");
    }

    static constexpr int64_t kAlignment = 16;
    std::string build_;
    int64_t limit_;
    Scope<Interval> scope_;  // the enclosing lets' and loops' bounds
    Scope<Expr> lets_;       // the enclosing lets' values
    // The bound of each let X.shared_size_var, from the stores to X.shared_size (none: unbounded).
    std::map<std::string, std::optional<int64_t>> largest_size_;
    bool in_kernel_ = false;
    Kernel kernel_;
};

}  // namespace

void check_gpu_shared_memory(Pipeline pipeline, const Target &target, const std::string &build) {
    if (!target.has_gpu_feature()) return;
    pipeline.add_custom_lowering_pass(new SharedMemoryCheck(build, attn::manifest::kGpuSharedMemoryPerBlock));
}

}  // namespace attn_gen
