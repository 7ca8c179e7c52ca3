#include "cpu_manual.h"

namespace attn_sched {

using namespace Halide;
using attn_gen::Dims;

namespace {

const Dims dims;
constexpr TailStrategy kGuard = TailStrategy::GuardWithIf;
// Parallel tasks: a projection's are its panels of output features, and the flash core's
// its (head, batch) pairs; at H=768 and B=1, 16 panels and 12 heads feed up to kFewThreads
// threads well. With more threads (the count is read when the pipeline runs, so one
// library serves both), each panel's rows are split in blocks of kRowTilesPerTask register
// tiles, and each head's query blocks are tasks too: at 16 threads and 128 tokens, 16
// panels by 4 blocks of 32 rows, and 12 heads by 2 query blocks.
constexpr int kFewThreads = 4;
constexpr int kRowTilesPerTask = 8;
constexpr int kAmxPanelsPerTask = 4;

// The kernels' thread count when a pipeline runs (the runtime's halide_get_num_threads: the
// count attn::set_num_threads set, or 0 before the thread pool starts, then the default).
Expr kernel_threads() {
    using namespace Halide::Internal;
    return Call::make(Int(32), "halide_get_num_threads", {}, Call::Extern);
}

int vector_width(const Target &target) { return target.natural_vector_size<float>(); }

// A reduction's dimensions, innermost first, as register_tile takes them.
std::vector<RVar> rvars(const RDom &r) {
    std::vector<RVar> out;
    for (int i = 0; i < r.dimensions(); ++i) out.push_back(r[i]);
    return out;
}

}  // namespace

// Whether the target multiplies bf16 pairs natively (AVX512_BF16's vdpbf16ps; Halide's
// avx512_zen4, avx512_zen5 and avx10_1 targets have it: Halide 21's
// has_feature adds no implied feature, so each is named). Elsewhere a bf16 GEMM multiplies
// operands widened to f32 once, before its tiles (attn_gen::Linear::weight_widened,
// input_widened): bf16 storage, f32 arithmetic; the flash core holds its rounded operands as
// f32 values (attn_gen::Bf16Core::widened).
//
// Not on the AMX ISA (avx512_sapphirerapids), whose projections and flash core are AMX tiles
// (attn_gen::Bf16Core::amx_tiles): on an Intel Xeon with AMX, avx512_zen4's vdpbf16ps
// layer took 1.33x the fp32 layer's time at B=1 S=384 (docs/measurements.md, "AMX tiles").
// avx512_zen4 keeps it (measured faster on Zen 4).
bool native_bf16(const Target &target) {
    if (target.has_feature(Target::AVX512_SapphireRapids)) return false;
    return target.has_feature(Target::AVX512_Zen4) || target.has_feature(Target::AVX512_Zen5) ||
           target.has_feature(Target::AVX10_1);
}

// Whether the target sums u8·i8 quads natively (VNNI's vpdpbusd: avxvnni, the targets above,
// and the AMX ISA, whose projections' int8 products are tiles: attn_gen::Linear::amx_tile).
// Elsewhere an int8 GEMM sums each pair of products in i16 first (vpmaddubsw:
// attn_gen::Int8Sum::pairs_in_i16), as exact.
bool native_int8(const Target &target) {
    return target.has_feature(Target::AVXVNNI) || target.has_feature(Target::AVX512_SapphireRapids) ||
           native_bf16(target);
}

// Whether the target has AMX's tile instructions (Halide's avx512_sapphirerapids: tdpbf16ps,
// tdpbusd), which the bf16 and int8 layers' projections then use (attn_gen::Linear::amx_tile),
// and a bf16 flash core's QKᵀ and P·V (attn_gen::FlashAttention::dot_tile, context_tile).
bool amx_tiles(const Target &target) { return target.has_feature(Target::AVX512_SapphireRapids); }

namespace {

// Computes the reduction `tile` (a pure init and one update over `reduction`) as a
// register tile of `columns` × t.tile_rows at `at`: `column` vectorized and unrolled,
// `row` unrolled, the reduction outside both. A bf16 or int8 GEMM's reduction starts with
// its pair or quad of features (attn_gen::Linear::k): the group and the lanes are one
// vector of 2·vw or 4·vw products summed groupwise into vw lanes (vdpbf16ps, vpdpbusd).
// Without vdpbf16ps the operands are widened before the tile (attn_gen::Linear::weight_widened,
// input_widened) and bf16 multiplies them as fp32 does. Without vpdpbusd, int8's `pair_sums`
// (attn_gen::Linear::pair_sums) are computed at each row of the tile, a vector of 2·vw i16
// sums from 4·vw bytes of a quad row of the weight and one quad of the row broadcast
// (vpmaddubsw), and the tile sums each vector's adjacent pairs into vw i32 lanes (vpmaddwd
// by ones).
void register_tile(Func tile, const Var &column, const Var &row, const std::vector<RVar> &reduction, int columns,
                   LoopLevel at, const CpuTiling &t, const Target &target,
                   attn_gen::Precision precision = attn_gen::Precision::fp32, Func pair_sums = Func()) {
    const int vw = vector_width(target);
    Var vec{"vec"}, lane{"lane"};
    tile.compute_at(at)
        .bound_extent(column, columns)
        .bound_extent(row, t.tile_rows)
        .vectorize(column, vw)
        .unroll(column)
        .unroll(row);
    Stage update = tile.update();
    update.split(column, vec, lane, vw);
    const bool bf16 = precision == attn_gen::Precision::bf16, int8 = precision == attn_gen::Precision::int8;
    const bool native = (bf16 && native_bf16(target)) || (int8 && native_int8(target));
    if (int8 && !native && !pair_sums.defined())
        _halide_user_error << tile.name() << ": int8 without vpdpbusd sums its products in pairs "
                           << "(attn_gen::Int8Sum::pairs_in_i16), which the algorithm was not given\n";
    if (native || int8) {
        // The group summed into each lane: the pair or quad of input features, or without VNNI
        // a quad's two pair sums.
        RVar group = reduction[0], group_lane{"group_lane"};
        std::vector<VarOrRVar> order{group, lane, vec, row};
        order.insert(order.end(), reduction.begin() + 1, reduction.end());
        update.reorder(order).fuse(group, lane, group_lane).atomic().vectorize(group_lane).unroll(vec).unroll(row);
        if (native) return;
        // A row's pair sums, one vector of 2·vw per vector of the tile: the pair's two bytes
        // and the lanes one vector of 4·vw products (atomic: Halide cannot prove a saturating
        // add associative, and it never saturates here).
        const Var out_pair = pair_sums.args()[0];
        const RVar pair = pair_sums.rvars(0)[0];
        Var pair_vector{"pair_vector"}, pair_lane{"pair_lane"};
        RVar byte_lane{"byte_lane"};
        pair_sums.compute_at(tile, row)
            .split(out_pair, pair_vector, pair_lane, 2 * vw)
            .vectorize(pair_lane)
            .unroll(pair_vector);
        pair_sums.update()
            .split(out_pair, pair_vector, pair_lane, 2 * vw)
            .reorder(pair, pair_lane, pair_vector)
            .fuse(pair, pair_lane, byte_lane)
            .atomic(true)
            .vectorize(byte_lane)
            .unroll(pair_vector);
        return;
    }
    std::vector<VarOrRVar> order{lane, vec, row};
    order.insert(order.end(), reduction.begin(), reduction.end());
    // (bf16 without native products: the pair a loop of two, not unrolled, so that one
    // feature's vectors are live at a time and the accumulators stay in registers.)
    update.reorder(order).vectorize(lane).unroll(vec).unroll(row);
}

// A reduction over one row (max, sum) computed at `at`, vectorized across the row: a
// vector of partial results (rfactor), combined across its lanes once per row. (A
// vectorized atomic() reduction combines the lanes of every vector, a serial chain.) Returns
// the partial results' Func.
Func vectorized_row_reduction(Func reduction, RVar along, LoopLevel at, const Target &target) {
    const int vw = vector_width(target);
    RVar outer{"outer"}, lane{"lane"};
    Var partial_lane{"partial_lane"};
    reduction.compute_at(at).store_in(MemoryType::Stack);
    Func partial = reduction.update().split(along, outer, lane, vw, kGuard).rfactor(lane, partial_lane);
    // rfactor adds its lane variable as the outermost dimension; store it innermost, so
    // that each vector of partials is one load and one store.
    std::vector<Var> storage{partial_lane};
    for (const Var &v : reduction.args()) storage.push_back(v);
    partial.compute_at(at).store_in(MemoryType::Stack).reorder_storage(storage).vectorize(partial_lane);
    partial.update().vectorize(partial_lane);  // the loops over the row run inside, on whole vectors
    return partial;
}

// Rows (hidden, seq, batch) a GEMM's register tiles read, computed once at root before it:
// bf16 activations (attn_gen::rounded_to_bf16), or a projection's input widened
// (attn_gen::Linear::input_widened).
void schedule_rows(Func rows, const Target &target) {
    Var so{"so"}, si{"si"};
    rows.compute_root()
        .split(dims.seq, so, si, 16, kGuard)
        .parallel(so)
        .parallel(dims.batch)
        .vectorize(dims.hidden, vector_width(target), kGuard);
}

// A projection's output (o, s, b), e.g. product + bias, computed at `at` with the GEMM
// `product` as a register tile per (panel of output features, block of rows). Panels
// run in parallel; each transposes its slice of the weight once (a packed panel: the
// tile's loads are contiguous) and reuses it for every row block of every batch.
// `rows` is the loop over rows: the pure seq, or the update's RVar when only some rows
// are computed (attn_gen::Linear::row).
// A reduced-precision panel is stored as the tile reads it. With the native instructions it
// is attn_gen::Linear::weight_transposed, its group innermost: bf16 (pair, out, in_pair),
// one load vw outputs' pairs; int8 (quad, out, in_quad), one load vw outputs' quads. Without
// them bf16's is Linear::weight_widened, in f32, outputs innermost, one vector per feature;
// int8 reads its quads in place, summing them in pairs (Linear::pair_sums, register_tile).
// A weight prepared in its groups (attn_gen::WeightLayout::grouped) is already stored as a
// native panel is, and an fp32 one prepared in panels (WeightLayout::panels) has a vector of
// outputs contiguous for each input feature, a panel's one after another (the groups are in
// the same panels): the tiles read either in place, with no packing per call.
// Given `reads` (a condition uniform over the call), each branch is compiled apart, so that a
// product reading select(reads, ...) reads one operand (attn_gen::LayerInputs::kv_is_x).
void schedule_panel_gemm(Func out, Func weight_transposed, Func product, const std::vector<RVar> &reduction,
                         VarOrRVar rows, LoopLevel at, CpuTiling t, const Target &target,
                         attn_gen::Precision precision = attn_gen::Precision::fp32,
                         attn_gen::WeightLayout layout = attn_gen::WeightLayout::linear, Expr reads = Expr(),
                         Func weight_widened = Func(), Func input_widened = Func(), Func pair_sums = Func()) {
    const int vw = vector_width(target), panel = vw * t.tile_vectors;
    if (pair_sums.defined()) {
        // int8 in pairs holds, beside the accumulators, the tile's weight vectors, the broadcast
        // quad, a pair sum and the ones vpmaddwd multiplies by: at 4 × 3 on AVX2's 16 registers
        // two accumulators lived on the stack, and the loop waited on their stores (1.34x the
        // time of 3 × 3 at B=1 S=128). So its rows are at most what the registers hold.
        const int registers = target.has_feature(Target::AVX512) ? 32 : 16;
        t.tile_rows = std::max(1, std::min(t.tile_rows, (registers - 3 - t.tile_vectors) / t.tile_vectors));
    }
    const Var &o = dims.hidden, &s = dims.seq, &b = dims.batch;
    Var oo{"oo"}, oi{"oi"}, in_feature{"in_feature"}, ko{"ko"}, ki{"ki"};
    VarOrRVar so("so", rows.is_rvar), si("si", rows.is_rvar), sb("sb", rows.is_rvar), s_in("s_in", rows.is_rvar);
    out.compute_at(at);
    Stage stage = out.has_update_definition() ? Stage(out.update()) : Stage(out);
    // A task is a panel of output features, which serves every row; on more than
    // kFewThreads threads, a panel by a block of rows (of every batch). Two parallel loops
    // there, the blocks of rows inside the panels' (so that a panel packed per call is packed
    // once, and shared by its blocks; fused into one loop, the projections took 3-5 times as
    // long: Halide then bounds a tile's rows less tightly).
    auto tasks = [&](Stage branch) {
        branch.specialize(kernel_threads() > kFewThreads)
            .split(o, oo, oi, panel, kGuard)
            .split(rows, sb, s_in, t.tile_rows * kRowTilesPerTask, kGuard)
            .split(s_in, so, si, t.tile_rows, kGuard)
            .reorder(oi, si, so, b, sb, oo)
            .vectorize(oi, vw, kGuard)
            .parallel(oo)
            .parallel(sb);
        branch.split(o, oo, oi, panel, kGuard)
            .split(rows, so, si, t.tile_rows, kGuard)
            .reorder(oi, si, so, b, oo)
            .vectorize(oi, vw, kGuard)
            .parallel(oo);
    };
    if (reads.defined()) tasks(stage.specialize(reads));
    tasks(stage);
    const bool widened = precision == attn_gen::Precision::bf16 && !native_bf16(target);
    const bool panel_layout = precision != attn_gen::Precision::fp32 && !widened;
    // Prepared panels of vw outputs: a tile (or bf16's widening) starting at a multiple of vw
    // reads each panel's vector as one load (unaligned, Halide computes each lane's panel).
    if (layout == attn_gen::WeightLayout::grouped || layout == attn_gen::WeightLayout::panels)
        out.align_bounds(o, vw);
    if ((layout == attn_gen::WeightLayout::grouped && panel_layout) ||
        (layout == attn_gen::WeightLayout::panels && precision == attn_gen::Precision::fp32)) {
        register_tile(product, o, s, reduction, panel, LoopLevel(out, so), t, target, precision, pair_sums);
        return;
    }
    if (widened) {
        // The panel widened once per call (from the bf16 weight, half fp32's bytes) and the
        // rows once, so that the register tiles load ready operands: one load or broadcast per
        // vector of products (widened in the tile, the widening took as many vector operations
        // as the multiply-adds), outputs innermost, one vector per feature, fp32's loop.
        std::vector<Var> w = weight_widened.args();
        weight_widened.compute_at(out, oo).bound_extent(o, panel).bound_extent(w[0], 2);
        weight_widened.reorder(w[0], o, w[2]).vectorize(o, vw).unroll(w[0]).reorder_storage(o, w[0], w[2]);
        schedule_rows(input_widened, target);
        register_tile(product, o, s, reduction, panel, LoopLevel(out, so), t, target, precision);
        return;
    }
    weight_transposed.compute_at(out, oo).bound_extent(o, panel);
    if (precision == attn_gen::Precision::fp32) {
        weight_transposed.split(in_feature, ko, ki, vw, kGuard).reorder(o, ki, ko).vectorize(o, vw).unroll(ki);
    } else {
        // The group's variable is the pair or quad (attn_gen::Linear::weight_transposed).
        const int group = precision == attn_gen::Precision::bf16 ? 2 : 4;
        Var g = weight_transposed.args()[0], in_group = weight_transposed.args()[2];
        weight_transposed.bound_extent(g, group).reorder(g, o, in_group).vectorize(o, vw).unroll(g);
    }
    register_tile(product, o, s, reduction, panel, LoopLevel(out, so), t, target, precision);
}

// An AMX tile Func ((lane, tile, row, ...): attn_gen::Linear::amx_tile, FlashAttention::dot_tile,
// context_tile) stored in MemoryType::AMXTile and computed at `stored`'s loop over its tiles:
// `stored`, its wrapper (`.in()`), copies each tile to memory. One tile product a step of
// `step_inner` (its reduction's inner lanes: 32 features or keys), the steps outside, as
// Halide's AMX lowering (ExtractTileOperations) matches them.
void amx_tile_products(Func tile, Func stored, RVar step_inner, RVar steps) {
    const std::vector<Var> t = tile.args();
    tile.compute_at(stored, t[1]).store_in(MemoryType::AMXTile).vectorize(t[0]).vectorize(t[2]);
    tile.update()
        .reorder(step_inner, t[0], t[2], steps, t[1])
        .atomic()
        .vectorize(step_inner)
        .vectorize(t[0])
        .vectorize(t[2]);
}

// A projection in AMX tiles (attn_gen::Linear::amx_tile), a 16 × 16 tile of outputs at a time
// (16 rows: the most a tile holds), each stored (amx_tile.in(), rows 32 floats apart: a
// whole-tile store, which Halide's AMX lowering matches as a 2-D one) and read by the epilogue.
// `out` is what is computed: the projection's out, or a Func it is inlined into (the dense
// output projection's, with its residual). Its tasks:
//   - AmxTasks::panels: a panel of 16 outputs, which serves every row, or 4 panels on at most
//     kFewThreads threads;
//   - AmxTasks::row_blocks: `at` is its consumer's loop over blocks of 16 rows, which are the
//     tasks (schedule_output); the block's panels run inside, on more than kFewThreads threads
//     4 a task of a nested parallel loop. (Nested on 2 threads too, so that a call of 16 tokens
//     would not run them on one, they ran at 0.97-0.99 of the speed before at 128-384 tokens.)
// `rows_too`: schedule l.amx_rows (its rows copied once, a task per 16 of them, vectorized
// across the row); false for a projection sharing another's (attn_gen::rows_for_amx_tiles).
enum class AmxTasks { panels, row_blocks };
void schedule_amx_projection(Func out, attn_gen::Linear l, LoopLevel at, const Target &target, AmxTasks tasks,
                             bool rows_too) {
    const int columns = attn_gen::kAmxTileColumns, rows_a_tile = attn_gen::kAmxTileRows;
    const Var &o = dims.hidden, &s = dims.seq, &b = dims.batch;
    const VarOrRVar rows = l.row.defined() ? VarOrRVar(l.row.x) : VarOrRVar(dims.seq);
    Var oo{"oo"}, oi{"oi"};
    VarOrRVar so("so", rows.is_rvar), si("si", rows.is_rvar);
    out.compute_at(at).align_bounds(o, columns);
    Stage stage = out.has_update_definition() ? Stage(out.update()) : Stage(out);
    stage.split(o, oo, oi, columns, kGuard)
        .split(rows, so, si, rows_a_tile, kGuard)
        .reorder(oi, si, so, b, oo)
        .vectorize(oi);
    Var ooo{"ooo"}, ooi{"ooi"};
    if (tasks == AmxTasks::panels) {
        // 4 panels a task on few threads: longer tasks that each read the rows once more from
        // their own L2 (1.02-1.06x at two threads on an Intel Xeon VM; at 2 threads BERT-base's
        // 48 panels still make 12 tasks).
        stage.specialize(kernel_threads() > kFewThreads).parallel(oo);
        stage.split(oo, ooo, ooi, kAmxPanelsPerTask, kGuard).parallel(ooo);
    } else {
        stage.specialize(kernel_threads() > kFewThreads).split(oo, ooo, ooi, kAmxPanelsPerTask, kGuard).parallel(ooo);
    }
    std::vector<Var> t = l.amx_tile.args();  // (lane, in_panel, seq, batch)
    Func stored = l.amx_tile.in();
    stored.compute_at(LoopLevel(out, so))
        .bound_extent(t[0], columns)
        .bound_extent(t[2], rows_a_tile)  // whole tiles at the last rows too (amx_rows clamps them)
        .align_storage(t[0], 2 * columns)
        .reorder(t[0], t[2], t[1], t[3])
        .vectorize(t[0])
        .vectorize(t[2]);
    RVar ko{"ko"}, ki{"ki"};
    l.amx_tile.update().split(l.k.x, ko, ki, attn_gen::kAmxTileStep);
    amx_tile_products(l.amx_tile, stored, ki, ko);
    if (!rows_too) return;
    const int vw = vector_width(target);
    Var ko_rows{"ko_rows"}, ki_rows{"ki_rows"};
    l.amx_rows.compute_root()
        .split(s, ko_rows, ki_rows, rows_a_tile, kGuard)
        .reorder(dims.hidden, ki_rows, ko_rows, b)
        .parallel(ko_rows)
        .vectorize(dims.hidden, vw, kGuard);
}

// `amx_rows_too`: as schedule_amx_projection's rows_too.
void schedule_projection(attn_gen::Linear l, LoopLevel at, const CpuTiling &t, const Target &target,
                         Expr reads = Expr(), bool amx_rows_too = true) {
    if (l.amx_tile.defined()) return schedule_amx_projection(l.out, l, at, target, AmxTasks::panels, amx_rows_too);
    const VarOrRVar rows = l.row.defined() ? VarOrRVar(l.row.x) : VarOrRVar(dims.seq);
    schedule_panel_gemm(l.out, l.weight_transposed, l.product, rvars(l.k), rows, at, t, target, l.precision,
                        l.weight_layout, reads, l.weight_widened, l.input_widened, l.pair_sums);
}

// The bf16 activations Q and then K and V read, each rounded once (one Func for both in
// self-attention's stage; the fused layer's kv_rounded is computed only when kv is not x).
// Not for AMX tiles, whose rows round as they are copied (attn_gen::Linear::amx_rows).
void schedule_rounded_inputs(Func x, Func kv, const Target &target) {
    schedule_rows(x, target);
    if (kv.name() != x.name()) schedule_rows(kv, target);
}

// int8 activations (attn_gen::QuantizedRows), quantized once before the GEMMs that read
// them: the rows' ranges and sums (one Tuple reduction, blocks of rows in parallel, each
// vectorized across its row, as vectorized_row_reduction), their steps and zero points
// (which the GEMMs' epilogues read too), then the values.
void schedule_quantized(attn_gen::QuantizedRows q, const Target &target) {
    const int vw = vector_width(target);
    const Var &s = dims.seq, &b = dims.batch;
    Var so{"so"}, si{"si"};
    {
        RVar outer{"outer"}, lane{"lane"};
        Var partial_lane{"partial_lane"};
        Func range = q.stats;
        range.compute_root();
        Stage update = range.update();
        Func partial = update.split(q.feature.x, outer, lane, vw, kGuard).rfactor(lane, partial_lane);
        update.split(s, so, si, 16, kGuard).parallel(so);
        std::vector<Var> storage{partial_lane};
        for (const Var &v : range.args()) storage.push_back(v);
        partial.compute_at(range, si).reorder_storage(storage).vectorize(partial_lane);
        partial.update().vectorize(partial_lane);
    }
    for (Func f : {q.inverse_step, q.step, q.zero}) f.compute_root();
    q.values.compute_root()
        .split(s, so, si, 16, kGuard)
        .reorder(dims.hidden, si, so, b)
        .parallel(so)
        .parallel(b)
        .vectorize(dims.hidden, vw, kGuard);
}

// The reduction `product` (col, row, ...) over the columns and rows needed at `at`,
// stored there: register tiles of `column_vectors` vectors of `col` by t.tile_rows rows,
// each reducing over `reduction`; each tile of the column operand is reused by every
// row tile while it is in L1.
void tiled_rows(Func product, const Var &col, const Var &row, const std::vector<RVar> &reduction, int column_vectors,
                LoopLevel at, const CpuTiling &t, const Target &target,
                attn_gen::Precision precision = attn_gen::Precision::fp32) {
    const int vw = vector_width(target), columns = vw * column_vectors;
    Var co{"co"}, ci{"ci"}, ro{"ro"}, ri{"ri"};
    Func rows = product.in();
    rows.compute_at(at)
        .store_in(MemoryType::Stack)
        .split(col, co, ci, columns, kGuard)
        .split(row, ro, ri, t.tile_rows, kGuard)
        .reorder(ci, ri, ro, co)
        .vectorize(ci, vw, kGuard);
    register_tile(product, col, row, reduction, columns, LoopLevel(rows, ro), t, target, precision);
}

// bf16 K or V in pairs (attn_gen::keys_in_pairs, values_in_pairs: (pair, along, outer, ...); the
// flash core's f32 where the target lacks bf16 products)
// computed at `at`, stored as the register tiles read them: with native bf16 a pair
// innermost, so that one load is vw keys' (or head features') pairs; otherwise `along`
// innermost, one vector per element of the pair.
void schedule_pairs(Func pairs, LoopLevel at, const Target &target) {
    const Var p = pairs.args()[0], along = pairs.args()[1], outer = pairs.args()[2];
    pairs.compute_at(at)
        .bound_extent(p, 2)
        .reorder(p, along, outer)
        .vectorize(along, vector_width(target), kGuard)
        .unroll(p);
    if (!native_bf16(target)) pairs.reorder_storage(along, p, outer);
}

// A flash core's products in AMX tiles (attn_gen::FlashAttention::dot_tile, context_tile),
// as the projections' (amx_tile_products), their wrapper computed at `at`: the scores of a chunk
// of keys for the block's queries, 2 × Q/16 tiles at each chunk, and a key block's context,
// d/16 × Q/16 tiles at each block.
void schedule_amx_tiles(Func tile, RVar step_inner, RVar steps, LoopLevel at, int query_block, int tiles) {
    const int side = attn_gen::kAmxTileColumns;
    const std::vector<Var> t = tile.args();  // (lane, tile, query_in_block, ...)
    Var rows{"rows"}, row{"row"};
    Func stored = tile.in();
    // On the stack: the context's tiles have a runtime size (d/16 of them), which Halide
    // would otherwise allocate from the heap for each block (2.5% of the core alone at S=384).
    stored.compute_at(at).store_in(MemoryType::Stack).bound(t[0], 0, side).bound(t[2], 0, query_block);
    if (tiles > 0) stored.bound(t[1], 0, tiles);
    stored.split(t[2], rows, row, side).reorder(t[0], row, t[1], rows).vectorize(t[0]).vectorize(row);
    amx_tile_products(tile, stored, step_inner, steps);
}

// K packed per head, keys innermost (attn_gen::keys_transposed), in vw × vw tiles: K's vw
// rows read as dense vectors of head features, interleaved in registers (Halide's interleave
// of the tile's stores) into a small buffer, copied out as vectors of keys. A vector of keys
// read from K directly is a gather, element by element: 12% of the flash core's time at
// B=1 S=128 on AVX2, 2.5% this way.
void schedule_keys_transposed(Func keys, LoopLevel at, const Target &target) {
    const int vw = vector_width(target);
    const Var &j = dims.key, &e = dims.head_dim;
    Func packed = keys.in();
    Var jt{"jt"}, et{"et"};
    packed.compute_at(at).tile(j, e, jt, et, vw, vw, TailStrategy::RoundUp).vectorize(jt).unroll(et);
    keys.compute_at(packed, j).vectorize(e).unroll(j);
}

// Q·Kᵀ for the rows of `block` (a block of queries, all keys). K is transposed per head
// (`head`) so keys are contiguous; bf16: in pairs of head features, and the block's queries rounded.
void schedule_dot_rows(attn_gen::Scores sc, LoopLevel head, LoopLevel block, const CpuTiling &t, const Target &target) {
    const int vw = vector_width(target);
    if (sc.precision == attn_gen::Precision::bf16) {
        schedule_pairs(sc.key_transposed, head, target);
        sc.query_heads.compute_at(block).vectorize(dims.head_dim, vw, kGuard);
    } else {
        schedule_keys_transposed(sc.key_transposed, head, target);
    }
    tiled_rows(sc.dot, dims.key, dims.query, rvars(sc.e), t.tile_vectors, block, t, target, sc.precision);
}

// Row max, exponentials, row sum and probabilities for the rows computed at `at`;
// the two row reductions are vectorized across keys.
void schedule_softmax_rows(attn_gen::MaskedSoftmax m, LoopLevel at, bool probs_too, const Target &target) {
    const int vw = vector_width(target);
    const Var &j = dims.key;
    for (Func row : {m.row_max, m.row_sum}) vectorized_row_reduction(row, m.j.x, at, target);
    m.exp_scores.compute_at(at).vectorize(j, vw, kGuard);
    if (probs_too) m.probs.compute_at(at).vectorize(j, vw, kGuard);
}

// ctx(e, h, i, b) = Σ_j p · V per block of t.query_block queries: tiles of
// t.context_vectors vectors by t.tile_rows rows, each a register tile reducing over keys;
// a column slice of V is reused by every row tile of the block. Leaves the loops
// (ei, ii, ir, eo, io, h, b) for the caller, io being the block.
void schedule_context(attn_gen::WeightedSum w, const CpuTiling &t, const Target &target) {
    const int vw = vector_width(target), columns = vw * t.context_vectors;
    const Var &e = dims.head_dim, &i = dims.query, &h = dims.head, &b = dims.batch;
    Var eo{"eo"}, ei{"ei"}, io{"io"}, i_block{"i_block"}, ir{"ir"}, ii{"ii"};
    w.ctx.compute_root()
        .split(i, io, i_block, t.query_block, kGuard)
        .split(i_block, ir, ii, t.tile_rows, kGuard)
        .split(e, eo, ei, columns, kGuard)
        .reorder(ei, ii, ir, eo, io, h, b)
        .vectorize(ei, vw, kGuard);
    register_tile(w.ctx_sum, e, i, rvars(w.j), columns, LoopLevel(w.ctx, ir), t, target, w.precision);
    if (w.precision == attn_gen::Precision::bf16) {
        // V in pairs of keys per head, and the block's probabilities rounded.
        schedule_pairs(w.values, LoopLevel(w.ctx, h), target);
        w.probs.compute_at(w.ctx, io).vectorize(dims.key, vw, kGuard);
    }
}

// dense = residual + bias + ctx·W_oᵀ as a projection (packed panels, register tiles),
// then LayerNorm per block of rows, reading dense back from cache: the statistics
// need whole rows, which a panel does not have. With AMX tiles, dense is computed inside
// LayerNorm's blocks of 16 rows (a tile's), each panel's tile and epilogue in turn (W_o's
// panels from L2, the block's rows in L1): the residual's rows are read, and dense's written
// and read back, 16 whole rows at a time, not a panel's 64 bytes of every row of the batch
// (strided, from memory at B=8: 7.9% of the bf16 layer's time there, 1.3% so).
void schedule_output(attn_gen::OutputLayerNorm n, const CpuTiling &t, const Target &target) {
    const int vw = vector_width(target);
    const Var &o = dims.hidden, &s = dims.seq, &b = dims.batch;
    Var so{"so"}, si{"si"};
    if (n.context_rounded.defined()) {
        // Its zeros and then each row's heads, a task a block of rows. (Halide cannot prove the
        // update's stores h·d + e distinct, as they are for e < d: hence allow_race_conditions.)
        schedule_rows(n.context_rounded, target);
        n.context_rounded.update()
            .allow_race_conditions()
            .split(s, so, si, 16, kGuard)
            .reorder(n.context_features.x, n.context_features.y, si, so, b)
            .parallel(so)
            .parallel(b)
            .vectorize(n.context_features.x, vw, kGuard);
        if (n.context_quantized.values.defined()) schedule_quantized(n.context_quantized, target);
        if (n.rounded.amx_tile.defined()) {
            schedule_amx_projection(n.dense, n.rounded, LoopLevel(n.y, so), target, AmxTasks::row_blocks, true);
        } else {
            schedule_panel_gemm(n.dense, n.weight_transposed, n.rounded.product, rvars(n.rounded.k), s,
                                LoopLevel::root(), t, target, n.rounded.precision, n.weight_layout, Expr(),
                                n.rounded.weight_widened, n.rounded.input_widened, n.rounded.pair_sums);
        }
    } else {
        schedule_panel_gemm(n.dense, n.weight_transposed, n.projection, rvars(n.in_feature), s, LoopLevel::root(), t,
                            target, attn_gen::Precision::fp32, n.weight_layout);
    }
    const bool amx = n.rounded.amx_tile.defined();
    n.y.compute_root()
        .split(s, so, si, amx ? attn_gen::kAmxTileRows : t.tile_rows, kGuard)
        .reorder(o, si, so, b)
        .vectorize(o, vw, kGuard)
        .parallel(so)
        .parallel(b);
    for (Func stat : {n.sum, n.sum_sq_dev}) vectorized_row_reduction(stat, n.row.x, LoopLevel(n.y, so), target);
}

}  // namespace

void schedule_qkv_projection_cpu(attn_gen::Linear q, attn_gen::Linear k, attn_gen::Linear v, const CpuTiling &t,
                                 const Target &target) {
    // bf16: what the projections read, rounded once (k and v read the same; self-attention's
    // fused layer rounds x once for all three).
    if (q.precision == attn_gen::Precision::bf16) schedule_rounded_inputs(q.input, k.input, target);
    for (attn_gen::Linear l : {q, k, v}) schedule_projection(l, LoopLevel::root(), t, target);
}

void schedule_attention_scores_cpu(attn_gen::Scores sc, const CpuTiling &t, const Target &target) {
    const int vw = vector_width(target);
    const Var &j = dims.key, &i = dims.query, &h = dims.head, &b = dims.batch;
    Var io{"io"}, ii{"ii"};
    sc.scores.compute_root()
        .split(i, io, ii, t.query_block, kGuard)
        .reorder(j, ii, io, h, b)
        .vectorize(j, vw, kGuard)
        .parallel(h)
        .parallel(b);
    schedule_dot_rows(sc, LoopLevel(sc.scores, h), LoopLevel(sc.scores, io), t, target);
}

void schedule_masked_softmax_cpu(attn_gen::MaskedSoftmax m, const CpuTiling &, const Target &target) {
    const int vw = vector_width(target);
    const Var &j = dims.key, &i = dims.query, &h = dims.head, &b = dims.batch;
    // Rows are too short to be tasks of their own: parallel over heads and batches.
    m.probs.compute_root().vectorize(j, vw, kGuard).parallel(h).parallel(b);
    schedule_softmax_rows(m, LoopLevel(m.probs, i), false, target);
}

void schedule_weighted_sum_cpu(attn_gen::WeightedSum w, const CpuTiling &t, const Target &target) {
    schedule_context(w, t, target);
    w.ctx.parallel(dims.head).parallel(dims.batch);
}

void schedule_output_layernorm_cpu(attn_gen::OutputLayerNorm n, const CpuTiling &t, const Target &target) {
    schedule_output(n, t, target);
}

namespace {

// The flash core (attn_gen::FlashAttention): the (head, batch) pairs run in parallel
// (and their query blocks too on many threads); each packs its head's K once, then for
// each block of query rows visits the key blocks one after another, each computing its
// scores (register tiles of one chunk of keys by tile_rows queries, or with AMX 16 × 16 tiles:
// schedule_amx_tiles), their row max, exponentials and row sum (vectorized across keys), its
// share of the weighted sum (register tiles over V, or AMX tiles), then folding them into the
// running context. A block's scores
// and exponentials are query_block × key_block floats (on the stack), in L2 whatever S is.
// The projections of K and V compute each batch's rows only up to the last key some query
// may see (attn_gen::Linear::row).
void schedule_flash_core(attn_gen::FlashAttention f, Func key_end, const CpuTiling &t, const Target &target) {
    const int vw = vector_width(target);
    const Var &e = dims.head_dim, &h = dims.head, &i = dims.query, &b = dims.batch, &j = dims.key;
    const Var &qi = dims.query_in_block, &kl = dims.key_in_chunk;
    const RVar &lane = f.key_in_block.x, &key_block = f.key_blocks.x;
    Var io{"io"}, ii{"ii"}, head_batch{"head_batch"}, qo{"qo"}, qii{"qii"};
    // RoundUp: a block of rows is exactly one query block of the algorithm (ctx is
    // internal, so the rows past S_q are only computed, never stored to an output).
    f.ctx.compute_root()
        .split(i, io, ii, f.blocking.query_block, TailStrategy::RoundUp)
        .reorder(e, ii, io, h, b)
        .fuse(h, b, head_batch)
        .parallel(head_batch)
        .vectorize(e, vw, kGuard);
    // On more than kFewThreads threads a head's query blocks are tasks too (a parallel loop
    // inside the head's, which packs its K and V first): at B=1 S=128, 12 heads by 2 blocks,
    // and the causal mask's longer blocks spread over more threads.
    f.ctx.specialize(kernel_threads() > kFewThreads).parallel(io);
    LoopLevel pair(f.ctx, head_batch), rows(f.ctx, io);
    key_end.compute_root();
    const bool bf16 = f.precision == attn_gen::Precision::bf16, amx = f.dot_tile.defined();
    if (amx) {
        // K and V as rows of pairs (attn_gen::pair_rows), per head, as the AMX tiles read them:
        // each pair's two vectors of keys (or features) read, and stored interleaved (read as
        // 2·vw lanes of a row, each lane's index halved, they were gathers), vw of them at a
        // time for every row: a vector of keys reads a head feature of vw keys' rows of K,
        // which stay in L1 while all their features are read (a row at a time for all keys,
        // K passed through L2 d/2 times: 13% of the core's time at S=2048).
        for (Func pair_rows : {f.keys, f.values}) {
            const Var pair_along = pair_rows.args()[0], row = pair_rows.args()[1];
            Var along{"along"}, in_pair{"in_pair"}, vectors{"vectors"}, lanes{"lanes"};
            pair_rows.compute_at(pair)
                .split(pair_along, along, in_pair, 2, TailStrategy::RoundUp)
                .split(along, vectors, lanes, vw, TailStrategy::RoundUp)
                .reorder(in_pair, lanes, row, vectors)
                .unroll(in_pair)
                .vectorize(lanes);
        }
        // The context from the first head feature, whatever its consumer's first, so that V's
        // rows are too: the tiles' loads then index them without an offset, as Halide's AMX
        // lowering matches them.
        f.ctx.bound(e, 0, f.head_dim);
        f.queries.compute_at(rows).store_in(MemoryType::Stack).vectorize(e, vw, kGuard);
    } else if (bf16) {
        // K and V rounded in pairs (attn_gen::FlashAttention::keys, values), per head.
        schedule_pairs(f.keys, pair, target);
        schedule_pairs(f.values, pair, target);
        f.queries.compute_at(rows).vectorize(e, vw, kGuard);
    } else {
        schedule_keys_transposed(f.keys, pair, target);
        f.values.compute_at(pair).vectorize(e, vw, kGuard);
    }
    f.key_is_real.compute_at(pair).vectorize(j, vw, kGuard);

    // Not GuardWithIf: its tail test inside the loop over key blocks keeps Halide from
    // turning the key-block predicate into that loop's bound (the running state is
    // internal, so rounding e up only computes a few lanes more).
    f.running.compute_at(rows).store_in(MemoryType::Stack).vectorize(e, vw);
    // The clamped read of the bias (attn_gen::FlashAttention::scores) is split off per chunk,
    // not per key block: at S <= key_block the one block is the last, and all of it would clamp.
    f.running.update().reorder(e, qi, key_block).vectorize(e, vw).partition(key_block, Partition::Never);
    // Up to key_block keys (BERT's 128-512) the one block's merge is a copy: no exponential.
    f.running.update().specialize(f.one_key_block);
    // The division after the last block (attn_gen::Blocking::state_from_first_block), which the
    // one block's merge does itself.
    f.running.update(1).vectorize(e, vw).specialize(f.one_key_block);
    LoopLevel step(f.running, key_block);
    f.scores.compute_at(step).store_in(MemoryType::Stack);
    f.scores.update()
        .split(qi, qo, qii, t.tile_rows, kGuard)
        .reorder(lane, qii, qo, f.key_in_block.y)
        .vectorize(lane, vw)
        // (A block of one chunk has nothing to split off.)
        .partition(f.key_in_block.y, f.blocking.chunks() > 1 ? Partition::Always : Partition::Auto);
    if (amx) {
        // A chunk's scores, its tiles copied to memory before the loop over its rows reads them.
        RVar eo{"eo"}, ei{"ei"};
        f.dot_tile.update().split(f.e.x, eo, ei, attn_gen::kAmxTileStep);
        schedule_amx_tiles(f.dot_tile, ei, eo, LoopLevel(f.scores, f.key_in_block.y), f.blocking.query_block,
                           f.blocking.key_chunk / attn_gen::kAmxTileColumns);
    } else {
        register_tile(f.dot, kl, qi, rvars(f.e), f.blocking.key_chunk, LoopLevel(f.scores, qo), t, target,
                      f.precision);
    }
    Func max_partials = vectorized_row_reduction(f.block_max, lane, step, target);
    if (bf16) f.block_offset.compute_at(step).store_in(MemoryType::Stack);
    f.block_exp.compute_at(step).store_in(MemoryType::Stack);
    // (In vw f32 lanes, 16 on AVX-512, whose rounding to bf16 Bf16Core::rounding_instruction needs.)
    f.block_exp.update().vectorize(lane, vw);
    // Without the causal mask, the max and the exponentials test each key's mask alone: a
    // version of their loops for it (the causal test is a vector of the flag, comparisons
    // and a pack to 16 bits, about a sixth of the exponentials' loop).
    for (Stage masked : {max_partials.update(), f.block_exp.update()}) masked.specialize(!f.causal);
    vectorized_row_reduction(f.block_sum, lane, step, target);
    if (amx) return schedule_amx_tiles(f.context_tile, f.chunk_keys.x, f.chunk_keys.y, step, f.blocking.query_block, 0);
    // P·V's keys (or pairs of keys) in one loop over the block, not a loop per chunk inside a
    // loop over chunks: the loop over chunks bounds the visited ones all the same, and its
    // overhead (spills and reloads of the tile's pointers every 24 keys) goes.
    std::vector<RVar> keys = rvars(bf16 ? f.key_pairs : f.key_in_block);
    RVar in_chunk = keys[keys.size() - 2], chunk = keys.back(), key{"key"};
    f.block_context.update().fuse(in_chunk, chunk, key);
    keys.resize(keys.size() - 2);
    keys.push_back(key);
    tiled_rows(f.block_context, e, qi, keys, t.context_vectors, step, t, target, f.precision);
}

// Packed sequences: each token row's sequence (a vectorized count over the sequence
// starts), and the core's context gathered back to token rows, once, before the output
// projection reads it in its register tiles.
void schedule_packed_sequences(attn_gen::PackedSequences p, const Target &target) {
    const int vw = vector_width(target);
    const Var &s = dims.seq, &e = dims.head_dim;
    Var so{"so"}, si{"si"};
    p.length.compute_root();
    p.sequence.compute_root().vectorize(s, vw, kGuard);
    p.sequence.update().vectorize(s, vw, kGuard);
    p.ctx.compute_root().split(s, so, si, 16, kGuard).parallel(so).vectorize(e, vw, kGuard);
}

}  // namespace

void schedule_attention_layer_cpu(attn_gen::AttentionLayer l, bool probs_are_output, const CpuTiling &t,
                                  const Target &target) {
    const int vw = vector_width(target);
    const Var &j = dims.key, &i = dims.query, &h = dims.head, &b = dims.batch;
    // What the projections read, rounded or quantized (kv's is skipped when kv is x: l.kv_is_x).
    if (l.x_quantized.values.defined()) {
        schedule_quantized(l.x_quantized, target);
        if (l.kv_quantized.values.name() != l.x_quantized.values.name()) schedule_quantized(l.kv_quantized, target);
    } else if (l.x_rounded.defined() && !l.q.amx_tile.defined()) {
        schedule_rounded_inputs(l.x_rounded, l.kv_rounded, target);
    }
    // AMX tiles' rows, each copy scheduled once by the first projection that reads it: K and V
    // share one, which is Q's where kv is x's Func with x's rows (attn_gen::attention_layer).
    auto owns_amx_rows = [](attn_gen::Linear l, std::vector<attn_gen::Linear> earlier) {
        for (const attn_gen::Linear &e : earlier)
            if (l.amx_rows.defined() && l.amx_rows.name() == e.amx_rows.name()) return false;
        return true;
    };
    schedule_projection(l.q, LoopLevel::root(), t, target);
    const bool k_owns_amx_rows = owns_amx_rows(l.k, {l.q});
    schedule_projection(l.k, LoopLevel::root(), t, target, l.kv_is_x, k_owns_amx_rows);
    schedule_projection(l.v, LoopLevel::root(), t, target, l.kv_is_x, owns_amx_rows(l.v, {l.q, l.k}));
    // Where kv is x only at run time, K's and V's rows are copied from x's or kv's, whichever
    // kv_is_x names: a version of the copy for each, so that only one is read.
    if (l.k.amx_rows.defined() && k_owns_amx_rows && l.kv_is_x.defined()) l.k.amx_rows.specialize(l.kv_is_x);
    if (l.k.pair_sums.defined() && l.kv_is_x.defined() && l.k.input.name() != l.x_quantized.values.name()) {
        // K's and V's u8 rows copied once from x's or kv's quantization (kv_or_x): read in place,
        // the select's two loads share one index, which then hides each quad's broadcast load
        // from the instruction selection (a gather of 4·vw bytes instead). A pass over B·S·H bytes.
        Var so{"so"}, si{"si"};
        l.k.input.compute_root()
            .split(dims.seq, so, si, 16, kGuard)
            .parallel(so)
            .vectorize(dims.hidden, 4 * vw, kGuard);
        l.k.input.specialize(l.kv_is_x);
    }
    if (probs_are_output) {
        // The caller asked for the probabilities: they are an S×S output anyway.
        Var head_batch{"head_batch"}, pio{"pio"}, pii{"pii"};
        schedule_context(l.context, t, target);
        l.context.ctx.fuse(h, b, head_batch).parallel(head_batch);
        l.softmax.probs.compute_root()
            .split(i, pio, pii, t.query_block, kGuard)
            .reorder(j, pii, pio, h, b)
            .vectorize(j, vw, kGuard)
            .parallel(h)
            .parallel(b);
        LoopLevel rows(l.softmax.probs, pio);
        schedule_dot_rows(l.scores, LoopLevel(l.softmax.probs, h), rows, t, target);
        schedule_softmax_rows(l.softmax, rows, false, target);
    } else {
        schedule_flash_core(l.flash, l.key_end, t, target);
    }
    if (l.packed.defined()) schedule_packed_sequences(l.packed, target);
    schedule_output(l.output, t, target);
}

void schedule_attention_core_cpu(attn_gen::FlashAttention flash, Func key_end, Func out, const CpuTiling &t,
                                 const Target &target) {
    schedule_flash_core(flash, key_end, t, target);
    // The context is the core's internal Func (its blocks round the rows up); the output
    // copies it, a pass over B·S_q·H floats against the core's O(S_q·S_k·H): a task a block of
    // 16 rows, each row's heads in storage order. (Fused over head and batch, which the rows
    // separate, the parallel loop ran once per row: 128 loops of 12 tasks a call at S=128.)
    Var rows{"rows"}, row{"row"}, row_blocks{"row_blocks"};
    out.compute_root()
        .split(dims.query, rows, row, 16, kGuard)
        .reorder(dims.head_dim, dims.head, row, rows, dims.batch)
        .fuse(rows, dims.batch, row_blocks)
        .parallel(row_blocks)
        .vectorize(dims.head_dim, vector_width(target), kGuard);
}

}  // namespace attn_sched
