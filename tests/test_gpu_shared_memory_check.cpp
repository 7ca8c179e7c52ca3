// The build-time check of GPU kernels' shared memory (generators/gpu_shared_memory.cpp):
// a kernel proven to need more than a block gets fails compilation, naming it; one within
// the limit, or bounded only through min(extent, tile), compiles.
#include "../generators/gpu_shared_memory.h"
#include "attn/generated/manifest.h"

#include <gtest/gtest.h>

namespace {

using namespace Halide;

const Target kCuda("x86-64-linux-sse41-cuda-cuda_capability_80");

// A kernel of 32 × rows threads per block, each block staging `staged` (a tile of
// 33 × rows floats of the input) in shared memory. With `tail`, the tile is clamped at
// the input's edge, so its size depends on the shape (min(extent - block·rows, rows)).
std::string compile_error(int rows, bool tail) {
    ImageParam in(Float(32), 2, "in");
    Func staged("staged"), out("out");
    Var x("x"), y("y"), xo("xo"), yo("yo"), xi("xi"), yi("yi");
    staged(x, y) = in(x, y) * 2.0f;
    out(x, y) = staged(x, y) + staged(x + 1, y);
    out.gpu_tile(x, y, xo, yo, xi, yi, 32, rows, tail ? TailStrategy::GuardWithIf : TailStrategy::Auto);
    staged.compute_at(out, xo).store_in(MemoryType::GPUShared).gpu_threads(x, y);
    Pipeline pipeline(out);
    attn_gen::check_gpu_shared_memory(pipeline, kCuda, "the test kernel");
    try {
        pipeline.compile_to_module({in}, "shared_memory_check", kCuda);
    } catch (const CompileError &e) {
        return e.what();
    }
    return "";
}

TEST(GpuSharedMemoryCheck, AKernelOverTheLimitFailsTheBuildNamingIt) {
    // 33 × 512 floats = 67,584 bytes.
    const std::string error = compile_error(512, false);
    EXPECT_EQ(error.rfind("the test kernel: GPU kernel out", 0), 0u) << error;
    EXPECT_NE(error.find("needs up to 67600 bytes of shared memory per block, over the 49152"), std::string::npos)
        << error;
}

TEST(GpuSharedMemoryCheck, AKernelWithinTheLimitBuilds) {
    EXPECT_EQ(compile_error(256, false), "");  // 33,792 bytes
    EXPECT_EQ(compile_error(256, true), "");   // at most 33,792 bytes, less in the edge blocks
}

TEST(GpuSharedMemoryCheck, AnEdgeClampedTileOverTheLimitFailsToo) {
    const std::string error = compile_error(512, true);
    EXPECT_NE(error.find("needs up to 67600 bytes"), std::string::npos) << error;
}

TEST(GpuSharedMemoryCheck, TheLimitIsTheManifests) { EXPECT_EQ(attn::manifest::kGpuSharedMemoryPerBlock, 48 * 1024); }

}  // namespace
