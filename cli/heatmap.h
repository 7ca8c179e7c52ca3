// Attention heatmaps as PNG (cairo draws the cells, the token labels and the colour bar).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attn::cli {

struct HeatmapPanel {
    const float *probs = nullptr;  // [s_q, s_k], row-major: row = query, column = key
    int64_t s_q = 0, s_k = 0;
    std::string title;
};

struct HeatmapStyle {
    std::vector<std::string> tokens;  // labels for queries and keys; empty: none
    int64_t highlight_query = -1;     // outline this query's row; -1: none
    std::string title;                // above everything
};

// One PNG with the panels in a grid (one panel: a single heatmap). Colours run from
// 0 to the largest probability in each panel, shown on its colour bar.
void write_heatmap_png(const std::string &path, const std::vector<HeatmapPanel> &panels, const HeatmapStyle &style);

// Frees cairo's and fontconfig's process-wide caches, so leak checkers see none; call
// once no more heatmaps will be drawn.
void release_heatmap_caches();

}  // namespace attn::cli
