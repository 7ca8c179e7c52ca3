// Where an AMX tile product's time goes on this CPU, outside Halide: the floor of the AMX
// projections (schedules/cpu_manual.cpp: schedule_amx_projection), which Halide 21 gives one
// accumulator tile each. Time stamp counter ticks (rdtsc: the nominal clock, not the core's) per
// 16 x 16 x 32 bf16 tile product (tdpbf16ps), the second of two passes (the first faults pages in):
//   - one accumulator against four, operands in tile registers: the product's own rate;
//   - operands loaded from L1 each product;
//   - a GEMM's shape, M = 384 rows by N = 768 outputs by K = 768 features, one accumulator:
//     the rows (row-major, 1536 bytes apart) from L2 under the panels of 16 outputs (the
//     projections' order), and the same blocked by K with the accumulator stored and loaded
//     back, and 2 x 2 tiles with four accumulators (oneDNN's kernels' blocking).
// Not part of the build (it needs a CPU with AMX, and Linux's permission for the tile state):
//   cc -O2 -mamx-tile -mamx-bf16 bench/amx_tile_floor.c -o /tmp/amx_tile_floor && /tmp/amx_tile_floor
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>

enum { M = 384, N = 768, K = 768, STEPS = K / 32, ROW_TILES = M / 16, PANELS = N / 16 };

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_a_row[16];
    uint8_t rows[16];
} TileConfig;

static uint16_t rows_bf16[M * K] __attribute__((aligned(64)));    // the activations, row-major
static uint16_t panels_bf16[N * K] __attribute__((aligned(64)));  // the weight, 16 outputs' pairs a row
static float out[M * N] __attribute__((aligned(64)));

#define ROWS(tile, step) (rows_bf16 + (size_t)(tile)*16 * K + (step)*32)
#define PANEL(panel, step) (panels_bf16 + (size_t)(panel)*16 * K + (step)*512)
#define OUT(tile, panel) (out + ((size_t)(panel)*ROW_TILES + (tile)) * 256)

static void report(const char *what, uint64_t start, long products) {
    printf("%-70s %5.1f TSC ticks a product\n", what, (double)(__rdtsc() - start) / products);
}

// The GEMM with one accumulator tile, panel_block panels by row_block tiles of rows at a time,
// k_block steps a visit of each tile (the accumulator stored and loaded back between visits):
// with 1, ROW_TILES and STEPS, the projections' order. Returns the tile products done.
static long gemm_one_accumulator(int panel_block, int row_block, int k_block) {
    long products = 0;
    for (int pb = 0; pb < PANELS; pb += panel_block)
        for (int rb = 0; rb < ROW_TILES; rb += row_block)
            for (int k0 = 0; k0 < STEPS; k0 += k_block)
                for (int p = pb; p < pb + panel_block; ++p)
                    for (int r = rb; r < rb + row_block; ++r) {
                        if (k0 == 0)
                            _tile_zero(0);
                        else
                            _tile_loadd(0, OUT(r, p), 64);
                        for (int k = k0; k < k0 + k_block; ++k) {
                            _tile_loadd(4, ROWS(r, k), 2 * K);
                            _tile_loadd(5, PANEL(p, k), 64);
                            _tile_dpbf16ps(0, 4, 5);
                        }
                        _tile_stored(0, OUT(r, p), 64);
                        products += k_block;
                    }
    return products;
}

int main(void) {
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) {
        fprintf(stderr, "amx_tile_floor: Linux refused the AMX tile state (no AMX here?)\n");
        return 1;
    }
    TileConfig config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; ++t) config.bytes_a_row[t] = 64, config.rows[t] = 16;
    _tile_loadconfig(&config);
    for (size_t i = 0; i < sizeof rows_bf16 / 2; ++i) rows_bf16[i] = 0x3f80;  // 1.0
    for (size_t i = 0; i < sizeof panels_bf16 / 2; ++i) panels_bf16[i] = 0x3f80;
    const long n = 1 << 16;
    for (int pass = 0; pass < 2; ++pass) {
        uint64_t t = __rdtsc();
        _tile_zero(0);
        _tile_loadd(4, rows_bf16, 64);
        _tile_loadd(5, panels_bf16, 64);
        for (long i = 0; i < n; ++i) _tile_dpbf16ps(0, 4, 5);
        _tile_stored(0, out, 64);
        report("one accumulator, operands in tiles", t, n);
        t = __rdtsc();
        for (long i = 0; i < n; i += 4) {
            _tile_dpbf16ps(0, 4, 5);
            _tile_dpbf16ps(1, 4, 5);
            _tile_dpbf16ps(2, 4, 5);
            _tile_dpbf16ps(3, 4, 5);
        }
        _tile_stored(0, out, 64);
        report("four accumulators, operands in tiles", t, n);
        t = __rdtsc();
        for (long i = 0; i < n; ++i) {
            _tile_loadd(4, ROWS(0, 0), 2 * K);
            _tile_loadd(5, PANEL(0, 0), 64);
            _tile_dpbf16ps(0, 4, 5);
        }
        _tile_stored(0, out, 64);
        report("one accumulator, both operands loaded from L1", t, n);

        t = __rdtsc();
        long products = gemm_one_accumulator(1, ROW_TILES, STEPS);
        report("GEMM, one accumulator, a panel's rows in turn (rows from L2)", t, products);
        t = __rdtsc();
        products = gemm_one_accumulator(4, 4, 4);
        report("GEMM, one accumulator, 4 x 4 tiles by 4 steps (stored, loaded back)", t, products);

        products = 0;
        t = __rdtsc();
        for (int p = 0; p < PANELS; p += 2)
            for (int r = 0; r < ROW_TILES; r += 2) {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                for (int k = 0; k < STEPS; ++k) {
                    _tile_loadd(4, ROWS(r, k), 2 * K);
                    _tile_loadd(5, ROWS(r + 1, k), 2 * K);
                    _tile_loadd(6, PANEL(p, k), 64);
                    _tile_loadd(7, PANEL(p + 1, k), 64);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
                _tile_stored(0, OUT(r, p), 64);
                _tile_stored(1, OUT(r, p + 1), 64);
                _tile_stored(2, OUT(r + 1, p), 64);
                _tile_stored(3, OUT(r + 1, p + 1), 64);
                products += 4 * STEPS;
            }
        report("GEMM, four accumulators, 2 x 2 tiles", t, products);
        if (pass == 0) printf("(again, pages faulted in)\n");
    }
    _tile_release();
    return 0;
}
