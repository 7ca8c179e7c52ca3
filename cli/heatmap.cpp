#include "heatmap.h"

#include "attn/attention.h"

#include <cairo.h>
#include <fontconfig/fontconfig.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

namespace attn::cli {
namespace {

// matplotlib's viridis at nine evenly spaced points: perceptually uniform, colour-blind safe.
constexpr unsigned char kViridis[9][3] = {{68, 1, 84},    {71, 44, 122}, {59, 81, 139},  {44, 113, 142}, {33, 144, 141},
                                          {39, 173, 129}, {92, 200, 99}, {170, 220, 50}, {253, 231, 37}};

void set_viridis(cairo_t *cr, double t) {
    t = std::clamp(std::isfinite(t) ? t : 0.0, 0.0, 1.0) * 8.0;
    const int i = std::min(int(t), 7);
    const double f = t - i;
    auto channel = [&](int c) { return ((1 - f) * kViridis[i][c] + f * kViridis[i + 1][c]) / 255.0; };
    cairo_set_source_rgb(cr, channel(0), channel(1), channel(2));
}

constexpr double kFontSize = 11, kGap = 6, kBarWidth = 12;

struct Layout {
    double cell, label, width, height;  // label: room for the token labels on the left and on top
};

Layout layout_of(cairo_t *cr, const HeatmapPanel &p, const HeatmapStyle &style) {
    Layout l;
    l.cell = std::clamp(std::floor(420.0 / double(std::max(p.s_q, p.s_k))), 1.0, 28.0);
    l.label = 0;
    for (const std::string &token : style.tokens) {
        cairo_text_extents_t e;
        cairo_text_extents(cr, token.c_str(), &e);
        l.label = std::max(l.label, e.x_advance + kGap);
    }
    l.width = l.label + l.cell * double(p.s_k) + kGap + kBarWidth + 48;
    l.height = kFontSize + kGap + l.label + l.cell * double(p.s_q) + kGap;
    return l;
}

void draw_panel(cairo_t *cr, const HeatmapPanel &p, const HeatmapStyle &style, const Layout &l, double x0, double y0) {
    float top = 0;
    for (int64_t i = 0; i < p.s_q * p.s_k; ++i) top = std::max(top, std::isfinite(p.probs[i]) ? p.probs[i] : 0.0f);
    const double scale = top > 0 ? 1.0 / top : 1.0;

    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_move_to(cr, x0, y0 + kFontSize);
    cairo_show_text(cr, p.title.c_str());

    const double gx = x0 + l.label, gy = y0 + kFontSize + kGap + l.label;
    for (int64_t q = 0; q < p.s_q; ++q) {
        for (int64_t k = 0; k < p.s_k; ++k) {
            set_viridis(cr, p.probs[q * p.s_k + k] * scale);
            cairo_rectangle(cr, gx + double(k) * l.cell, gy + double(q) * l.cell, l.cell, l.cell);
            cairo_fill(cr);
        }
    }
    if (style.highlight_query >= 0 && style.highlight_query < p.s_q) {
        cairo_set_source_rgb(cr, 1, 0.2, 0.2);
        cairo_set_line_width(cr, 2);
        cairo_rectangle(cr, gx - 1, gy + double(style.highlight_query) * l.cell - 1, l.cell * double(p.s_k) + 2,
                        l.cell + 2);
        cairo_stroke(cr);
    }

    // Token labels: queries down the left, keys along the top (rotated).
    cairo_set_source_rgb(cr, 0, 0, 0);
    const int64_t labelled = std::min<int64_t>(int64_t(style.tokens.size()), std::max(p.s_q, p.s_k));
    for (int64_t i = 0; i < labelled; ++i) {
        cairo_text_extents_t e;
        cairo_text_extents(cr, style.tokens[i].c_str(), &e);
        const double centre = double(i) * l.cell + l.cell / 2 + kFontSize / 3;
        if (i < p.s_q) {
            cairo_move_to(cr, gx - kGap / 2 - e.x_advance, gy + centre);
            cairo_show_text(cr, style.tokens[i].c_str());
        }
        if (i < p.s_k) {
            cairo_save(cr);
            cairo_move_to(cr, gx + centre, gy - kGap / 2);
            cairo_rotate(cr, -M_PI / 2);
            cairo_show_text(cr, style.tokens[i].c_str());
            cairo_restore(cr);
        }
    }

    // Colour bar from 0 to the panel's largest probability.
    const double bx = gx + l.cell * double(p.s_k) + kGap, bh = l.cell * double(p.s_q);
    for (int i = 0; i < 64; ++i) {
        set_viridis(cr, 1.0 - i / 63.0);
        cairo_rectangle(cr, bx, gy + bh * i / 64.0, kBarWidth, bh / 64.0 + 0.5);
        cairo_fill(cr);
    }
    char text[32];
    cairo_set_source_rgb(cr, 0, 0, 0);
    std::snprintf(text, sizeof text, "%.2g", double(top));
    cairo_move_to(cr, bx + kBarWidth + 3, gy + kFontSize);
    cairo_show_text(cr, text);
    cairo_move_to(cr, bx + kBarWidth + 3, gy + bh);
    cairo_show_text(cr, "0");
}

}  // namespace

void write_heatmap_png(const std::string &path, const std::vector<HeatmapPanel> &panels, const HeatmapStyle &style) {
    if (panels.empty()) throw Error("--head", "no heads to draw");
    // Measure text on a scratch surface first, to size the image.
    std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)> scratch(
        cairo_image_surface_create(CAIRO_FORMAT_RGB24, 1, 1), cairo_surface_destroy);
    std::unique_ptr<cairo_t, decltype(&cairo_destroy)> measure(cairo_create(scratch.get()), cairo_destroy);
    cairo_select_font_face(measure.get(), "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(measure.get(), kFontSize);
    const Layout l = layout_of(measure.get(), panels.front(), style);

    const int columns = int(std::ceil(std::sqrt(double(panels.size()))));
    const int rows = int((panels.size() + columns - 1) / columns);
    const double title_height = style.title.empty() ? 0 : kFontSize + 2 * kGap;
    const int width = int(std::ceil(columns * (l.width + kGap) + kGap));
    const int height = int(std::ceil(title_height + rows * (l.height + kGap) + kGap));
    if (double(width) * height > 2.5e8) {
        throw Error("--probs", "the image would be " + std::to_string(width) + "x" + std::to_string(height) +
                                   " pixels; draw fewer heads (--head) or a shorter sequence");
    }

    std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)> surface(
        cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height), cairo_surface_destroy);
    std::unique_ptr<cairo_t, decltype(&cairo_destroy)> cr(cairo_create(surface.get()), cairo_destroy);
    cairo_set_source_rgb(cr.get(), 1, 1, 1);
    cairo_paint(cr.get());
    cairo_select_font_face(cr.get(), "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr.get(), kFontSize);
    if (!style.title.empty()) {
        cairo_set_source_rgb(cr.get(), 0, 0, 0);
        cairo_move_to(cr.get(), kGap, kGap + kFontSize);
        cairo_show_text(cr.get(), style.title.c_str());
    }
    for (std::size_t i = 0; i < panels.size(); ++i) {
        const double x0 = kGap + double(i % columns) * (l.width + kGap);
        const double y0 = title_height + kGap + double(i / columns) * (l.height + kGap);
        draw_panel(cr.get(), panels[i], style, l, x0, y0);
    }
    const cairo_status_t status = cairo_surface_write_to_png(surface.get(), path.c_str());
    if (status != CAIRO_STATUS_SUCCESS) {
        throw Error("--out", "cannot write " + path + ": " + cairo_status_to_string(status));
    }
}

void release_heatmap_caches() {
    cairo_debug_reset_static_data();
    FcFini();
}

}  // namespace attn::cli
