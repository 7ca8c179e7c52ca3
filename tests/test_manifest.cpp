// What this build compiled against manifest.json: every variant of every ISA, each with
// the functions its schedule source provides, each function taking the manifest's
// arguments in the manifest's order (so a generator that declares, swaps or renames an
// argument fails here, by name), and dispatch following the declared ranks and priorities.
#include "attn/generated/dispatch.h"
#include "attn/generated/manifest.h"
#include "attn/internal.h"
#include "../runtime/src/pipeline_call.h"
#include "support/function_check.h"

#include <algorithm>
#include <iostream>
#include <map>
#include <set>

namespace attn::testing {
namespace {

bool not_provided(const std::string &source, const std::string &isa, const std::string &function) {
    for (const manifest::NotProvided &n : manifest::kNotProvided) {
        if (source == n.source && function == n.function && (isa == n.isa || std::string(n.isa) == "all")) {
            return true;
        }
    }
    return false;
}

TEST(Manifest, EveryVariantOfEveryIsaIsCompiled) {
#ifdef ATTN_VARIANT_SUBSET
    GTEST_SKIP() << "built with ATTN_ONLY_VARIANTS: a subset of the manifest's variants";
#endif
    std::vector<std::string> expected, compiled;
    for (const manifest::Isa &isa : manifest::kIsas) {
        if (isa.cross_compiled) continue;  // for another architecture: built by its own build
        for (const std::string source : isa.variants) expected.push_back(source + "_" + isa.name);
    }
    for (const VariantInfo &v : variants()) compiled.push_back(v.name);
    EXPECT_EQ(compiled, expected);
}

TEST(Manifest, EachVariantHasTheFunctionsItsSourceProvides) {
    for (const VariantInfo &v : variants()) {
        std::vector<std::string> expected;
        for (const manifest::Function &f : manifest::kFunctions) {
            if (!not_provided(v.schedule, v.isa, f.name)) expected.push_back(f.name);
        }
        EXPECT_EQ(v.functions, expected) << v.name;
        std::vector<std::string> in_table;
        for (const auto &[function, classes] : detail::compiled_functions(v)) {
            in_table.push_back(function);
            EXPECT_FALSE(classes.empty()) << v.name << " " << function;
            for (std::size_t i = 0; i + 1 < classes.size(); ++i) {
                EXPECT_GT(classes[i].max_seq, 0) << v.name << " " << function << ": only the last class is unbounded";
                EXPECT_TRUE(classes[i + 1].max_seq == 0 || classes[i + 1].max_seq > classes[i].max_seq)
                    << v.name << " " << function << ": classes by increasing max_seq";
            }
            EXPECT_EQ(classes.back().max_seq, 0) << v.name << " " << function << ": every length is served";
        }
        EXPECT_EQ(std::set<std::string>(in_table.begin(), in_table.end()),
                  std::set<std::string>(expected.begin(), expected.end()))
            << v.name;
    }
}

// The tests and the benchmarks call a function by its name (attn/function_calls.h); a
// function added to the manifest fails here until it has its entry beside its public
// function, and then the edge shapes, the stage and layer matrices and the benchmarks
// cover it.
TEST(Manifest, EveryFunctionHasACall) {
    for (const manifest::Function &f : manifest::kFunctions) {
        ASSERT_TRUE(detail::has_function_call(f.name)) << f.name;
        const detail::FunctionCall &call = detail::function_call(f.name);
        EXPECT_TRUE(call.outputs && call.prepare && call.reference && call.work) << f.name;
    }
}

// min_shapes: the fallback is the same device's hand-written variant, providing every
// function the variant provides; a call takes the variant's own kernels exactly when no
// extent is below the minimum.
// The min_shapes rows CMake writes are read into ProblemExtents by position.
TEST(Manifest, MinShapeDimensionsAreTheRuntimes) {
    ASSERT_EQ(std::size(manifest::kMinShapeDimensions), std::size(kProblemDimensions));
    for (std::size_t d = 0; d < std::size(kProblemDimensions); ++d) {
        EXPECT_STREQ(manifest::kMinShapeDimensions[d], kProblemDimensions[d].name);
    }
}

TEST(Manifest, AVariantWithMinShapesFallsBackToTheHandWrittenVariantBelowThem) {
    int bounded = 0;
    for (const VariantInfo &v : variants()) {
        if (v.min_shapes.empty()) {
            EXPECT_TRUE(v.fallback.empty()) << v.name;
            continue;
        }
        EXPECT_FALSE(v.min_shapes_because.empty()) << v.name;
        ASSERT_EQ(v.fallback, "manual_" + v.isa) << v.name;
        const auto fallback = std::find_if(variants().begin(), variants().end(),
                                           [&](const VariantInfo &f) { return f.name == v.fallback; });
        ASSERT_NE(fallback, variants().end()) << v.name << ": its fallback is not compiled";
        EXPECT_EQ(fallback->device, v.device);
        for (const auto &[function, m] : v.min_shapes) {
            ++bounded;
            EXPECT_TRUE(fallback->provides(function)) << v.fallback << " " << function;
            EXPECT_TRUE(v.runs_own_kernels(function, m)) << v.name << " " << function;
            for (const ProblemDimension &dimension : kProblemDimensions) {
                int64_t ProblemExtents::*d = dimension.extent;
                ProblemExtents above = m, below = m;
                above.*d += 1000;
                EXPECT_TRUE(v.runs_own_kernels(function, above)) << v.name << " " << function;
                if (m.*d == 1) continue;
                below.*d -= 1;
                EXPECT_FALSE(v.runs_own_kernels(function, below)) << v.name << " " << function;
            }
        }
        EXPECT_TRUE(v.runs_own_kernels("no_such_function", {})) << "an unbounded function runs every shape";
    }
    std::cout << bounded << " (variant, function) pairs have min_shapes\n";
}

TEST(Manifest, EveryCompiledFunctionTakesTheManifestsArgumentsByName) {
    std::map<std::string, std::vector<std::string>> arguments;
    for (const manifest::Function &f : manifest::kFunctions)
        arguments[f.name] = {f.arguments.begin(), f.arguments.end()};
    for (const VariantInfo &v : variants()) {
        for (const auto &[function, classes] : detail::compiled_functions(v)) {
            for (const detail::CompiledFunction &compiled : classes) {
                const halide_filter_metadata_t *metadata = compiled.metadata();
                std::vector<std::string> names;
                for (int i = 0; i < metadata->num_arguments; ++i) names.push_back(metadata->arguments[i].name);
                EXPECT_EQ(names, arguments[function]) << v.name << " " << function << " (" << metadata->name << ")";
                // Outputs come last: every argument before the first output is an input.
                bool output_seen = false;
                for (int i = 0; i < metadata->num_arguments; ++i) {
                    const bool output = metadata->arguments[i].kind == halide_argument_kind_output_buffer;
                    EXPECT_FALSE(output_seen && !output) << metadata->name << ": input after an output";
                    output_seen = output_seen || output;
                }
            }
        }
    }
}

// The default pick: the first runnable variant of a measured order for this CPU model and
// its widest runnable ISA (generated/dispatch.json), else the rule of the manifest.
TEST(Manifest, DispatchPicksTheMeasuredOrderElseTheWidestIsaThenThePreferredSource) {
    const manifest::Isa *best_isa = nullptr;
    const manifest::ScheduleSource *best_source = nullptr;
    const std::vector<VariantInfo> all = variants();
    for (const VariantInfo &v : all) {
        if (!v.runnable || v.device != "cpu") continue;
        for (const manifest::Isa &isa : manifest::kIsas) {
            for (const manifest::ScheduleSource &source : manifest::kScheduleSources) {
                if (v.isa != isa.name || v.schedule != source.name || !isa.dispatch_rank || !source.dispatch_priority) {
                    continue;
                }
                if (!best_isa || std::pair(isa.dispatch_rank, source.dispatch_priority) >
                                     std::pair(best_isa->dispatch_rank, best_source->dispatch_priority)) {
                    best_isa = &isa, best_source = &source;
                }
            }
        }
    }
    ASSERT_NE(best_isa, nullptr) << "no runnable CPU variant with a dispatch rank and priority";
    // A measurement of this CPU that covered that ISA (generated/dispatch.json) comes
    // first: its order's first runnable variant.
    std::string expected = std::string(best_source->name) + "_" + best_isa->name, why = "by rule";
    for (const manifest::MeasuredOrder *measured : detail::measurements_of_this_cpu(best_isa->name)) {
        const manifest::MeasuredOrder &m = *measured;
        const auto first = std::find_if(m.order.begin(), m.order.end(), [&](const char *name) {
            return std::any_of(all.begin(), all.end(),
                               [&](const VariantInfo &v) { return v.name == name && v.runnable; });
        });
        if (first == m.order.end()) continue;
        expected = *first, why = "measured";
        break;
    }
    EXPECT_EQ(select_variant().name, expected);
    EXPECT_EQ(default_variant_reason().rfind(expected + ": " + why, 0), 0u) << default_variant_reason();
}

// An fp32 Attention made without naming a variant runs each call with the measured pick of
// its shape class (generated/dispatch.json, the entry the default came from), or the default
// where that class was not ranked; one made with a variant named always runs that one.
TEST(Manifest, AnAttentionWithoutAVariantRunsEachShapeClassWithItsMeasuredPick) {
    const std::string reason = default_variant_reason();
    // The measurement the default came from: of this CPU, covering its widest ISA.
    std::string widest;
    int rank = 0;
    for (const VariantInfo &v : variants()) {
        for (const manifest::Isa &isa : manifest::kIsas) {
            if (v.runnable && isa.name == v.isa && isa.dispatch_rank > rank) widest = v.isa, rank = isa.dispatch_rank;
        }
    }
    const manifest::MeasuredOrder *measured = nullptr;
    if (reason.find(": measured") != std::string::npos) {
        const auto here = detail::measurements_of_this_cpu(widest);
        const auto first = std::find_if(here.begin(), here.end(), [&](const manifest::MeasuredOrder *m) {
            return reason.find(m->source) != std::string::npos;
        });
        ASSERT_NE(first, here.end()) << reason;
        measured = *first;
    }
    // A pick is a hand-written or tuned CPU variant (a dispatch rank and priority).
    auto dispatched = [](const VariantInfo &v) {
        for (const manifest::Isa &isa : manifest::kIsas)
            for (const manifest::ScheduleSource &source : manifest::kScheduleSources)
                if (v.isa == isa.name && v.schedule == source.name)
                    return isa.dispatch_rank && source.dispatch_priority;
        return false;
    };
    Config config;
    config.hidden_size = 8, config.num_heads = 2;
    std::vector<float> w(64, 0.01f), zeros(8, 0.0f), ones(8, 1.0f);
    const ConstTensor matrix = view(std::as_const(w), {8, 8}), vector = view(std::as_const(zeros), {8});
    const LayerWeights weights{
        matrix, vector, matrix, vector, matrix, vector, matrix, vector, view(std::as_const(ones), {8}), vector};
    const Attention by_class(config, weights), named(config, weights, select_variant().name);
    int64_t longest_bounded = 0;
    for (const manifest::ShapeClass &c : manifest::kShapeClasses) {
        const int64_t seq = c.max_seq ? c.max_seq : longest_bounded + 1;
        longest_bounded = std::max<int64_t>(longest_bounded, c.max_seq);
        std::string expected = select_variant().name;
        if (measured) {
            for (const manifest::ClassOrder &o : measured->classes) {
                if (std::string(o.shape_class) != c.name) continue;
                const auto first = std::find_if(o.order.begin(), o.order.end(), [&](const char *name) {
                    return std::any_of(variants().begin(), variants().end(), [&](const VariantInfo &v) {
                        return v.name == name && v.runnable && dispatched(v);
                    });
                });
                if (first != o.order.end()) expected = *first;
            }
            EXPECT_NE(reason.find(std::string(c.name) + (c.max_seq ? " (" : " ")), std::string::npos) << reason;
        }
        EXPECT_EQ(default_variant_for(seq).name, expected) << c.name;
        EXPECT_EQ(by_class.variant_for(seq, 1).name, expected) << c.name;
        EXPECT_EQ(by_class.variant_for(1, seq).name, expected) << c.name;
        EXPECT_EQ(named.variant_for(seq, seq).name, select_variant().name) << c.name;
    }
    EXPECT_EQ(by_class.variant().name, select_variant().name);
}

// An fp32 CPU layer reads its weights in panels of its ISA's vector of floats
// (attn_gen::WeightLayout::panels), which the Attention prepares once for its variant and for
// each shape class's pick of another width (PreparedWeights::weights_for).
TEST(Manifest, PreparedWeightsAreThePanelsOfEachVariantsWidth) {
    std::map<int, const VariantInfo *> by_width;  // a runnable hand-written CPU variant of each width
    for (const VariantInfo &v : variants()) {
        for (const manifest::Isa &isa : manifest::kIsas)
            if (v.runnable && v.schedule == "manual" && isa.name == v.isa && isa.f32_lanes && v.provides("attention_layer"))
                by_width[isa.f32_lanes] = &v;
    }
    if (by_width.size() < 2) GTEST_SKIP() << "fewer than two CPU vector widths run here";
    const VariantInfo &narrow = *by_width.begin()->second, &wide = *by_width.rbegin()->second;
    const int64_t h = 20;  // a multiple of neither width: the last panel ends in zeros
    std::vector<float> w(h * h), zeros(h, 0.0f), ones(h, 1.0f);
    for (int64_t o = 0; o < h; ++o)
        for (int64_t i = 0; i < h; ++i) w[std::size_t(o * h + i)] = float(100 * o + i + 1);
    const ConstTensor matrix = view(std::as_const(w), {h, h}), vector = view(std::as_const(zeros), {h});
    const LayerWeights weights{
        matrix, vector, matrix, vector, matrix, vector, matrix, vector, view(std::as_const(ones), {h}), vector};
    detail::PreparedWeights prepared(weights, wide, {&narrow, &wide, &narrow});
    EXPECT_EQ(prepared.other_widths.size(), 1u);
    for (const VariantInfo *v : {&wide, &narrow}) {
        const int lanes = v == &wide ? by_width.rbegin()->first : by_width.begin()->first;
        int matrices = 0;
        for (const pipeline::WeightBuffers::Weight &weight : prepared.weights_for(*v).weights) {
            if (weight.buffer.dimensions() != 2) continue;
            ++matrices;
            const Halide::Runtime::Buffer<const float> &b = weight.buffer;
            ASSERT_EQ(b.dim(0).extent(), lanes * h) << v->name << " " << weight.name;
            ASSERT_EQ(b.dim(1).extent(), (h + lanes - 1) / lanes) << v->name << " " << weight.name;
            for (int64_t o = 0; o < b.dim(1).extent() * lanes; ++o)
                for (int64_t i = 0; i < h; ++i)
                    ASSERT_EQ(b(int(o % lanes + lanes * i), int(o / lanes)), o < h ? w[std::size_t(o * h + i)] : 0.0f)
                        << v->name << " " << weight.name << " W[" << o << ", " << i << "]";
        }
        EXPECT_EQ(matrices, 4) << v->name;
    }
    // The narrow variant's layer run on its panels from beside the wide variant's (as an
    // Attention without a variant does for a class pick): the bits of an Attention of its own.
    Config config;
    config.hidden_size = h, config.num_heads = 2;
    const int64_t seq = 5;
    std::vector<float> x(std::size_t(seq * h)), expected(x.size()), got(x.size(), -1.0f);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i % 7) * 0.1f - 0.3f;
    const ConstTensor x_view = view(std::as_const(x), {1, seq, h});
    Attention(config, weights, narrow.name).forward({x_view}, view(expected, {1, seq, h}));
    pipeline::prepare_halide(narrow);
    pipeline::MaskInput mask = pipeline::mask_input(MaskTensor(), 1, seq, nullptr);
    pipeline::BiasInput bias = pipeline::bias_input(ConstTensor(), 1, 2, seq, seq, nullptr);
    auto x_buffer = pipeline::halide_view(x_view);
    auto y_buffer = pipeline::halide_view(view(got, {1, seq, h}));
    pipeline::Call call("attention_layer", narrow, pipeline::extents(1, seq, seq, 2, h));
    call.weights(prepared.weights_for(narrow), false);
    call.input("key_padding_mask", mask).input("bias", bias).input("x", x_buffer, Memory::host);
    call.placed("kv", x_buffer.raw_buffer());
    call.scalar("causal", false).scalar("heads", int32_t(2)).scalar("eps", config.layer_norm_eps);
    call.output("y", y_buffer, Memory::host);
    call.run();
    EXPECT_EQ(got, expected);
    // A width it was not asked for is refused, naming the variant, not read wrongly.
    for (const VariantInfo &v : variants()) {
        if (v.device != "cpu" || v.isa == wide.isa || v.isa == narrow.isa) continue;
        bool other = true;
        for (const manifest::Isa &isa : manifest::kIsas)
            if (isa.name == v.isa)
                other = isa.f32_lanes != by_width.begin()->first && isa.f32_lanes != by_width.rbegin()->first;
        if (!other) continue;
        try {
            prepared.weights_for(v);
            ADD_FAILURE() << v.name << ": expected an error";
        } catch (const Error &e) {
            EXPECT_EQ(e.argument(), "variant") << e.what();
            EXPECT_NE(std::string(e.what()).find(v.name), std::string::npos) << e.what();
        }
        break;
    }
}

TEST(Manifest, AnArgumentTheRuntimeDoesNotPassIsRefusedByName) {
    const VariantInfo &v = select_variant();
    const detail::CompiledFunction &scores = detail::function_for(v, "attention_scores", {});
    detail::Arguments partial;  // no q, k, bias, heads or scores
    try {
        detail::call(scores, partial, "attention_scores");
        FAIL() << "a call missing its arguments was made";
    } catch (const Error &e) {
        EXPECT_EQ(e.argument(), "variant");
        EXPECT_NE(std::string(e.what()).find("takes the buffer argument 'q', which the runtime does not pass"),
                  std::string::npos)
            << e.what();
    }
}

// Every argument the runtime binds must be one the function takes: a name the function
// lacks (a typo, a renamed argument) is refused before the call, never ignored.
TEST(Manifest, AnArgumentTheFunctionDoesNotTakeIsRefusedByName) {
    const VariantInfo &v = select_variant();
    const detail::CompiledFunction &scores = detail::function_for(v, "attention_scores", {});
    const halide_filter_metadata_t *metadata = scores.metadata();
    halide_buffer_t unused{};  // never read: the call is refused before it is made
    detail::Arguments all;
    for (int i = 0; i < metadata->num_arguments; ++i) {
        const halide_filter_argument_t &a = metadata->arguments[i];
        if (a.kind != halide_argument_kind_input_scalar) {
            all.buffer(a.name, &unused);
        } else {
            all.scalar(a.name, int32_t(1));  // attention_scores' one scalar is heads
        }
    }
    all.scalar("causal", true);
    try {
        detail::call(scores, all, "attention_scores");
        FAIL() << "a call with an argument the function does not take was made";
    } catch (const Error &e) {
        EXPECT_EQ(e.argument(), "variant");
        EXPECT_NE(std::string(e.what()).find("takes no argument 'causal'"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace attn::testing
