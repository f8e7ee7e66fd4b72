#include "shapes/adherence.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dp::shapes {
namespace {

int nearest_colour(const uint8_t* p, int* distance2 = nullptr) {
    int best = 0, best_d = std::numeric_limits<int>::max();
    for (std::size_t i = 0; i < palette().size(); ++i) {
        const Colour& c = palette()[i];
        const int dr = p[0] - c.r, dg = p[1] - c.g, db = p[2] - c.b;
        const int d = dr * dr + dg * dg + db * db;
        if (d < best_d) {
            best_d = d;
            best = static_cast<int>(i);
        }
    }
    if (distance2) *distance2 = best_d;
    return best;
}

struct Component {
    int colour = 0;  // majority palette class
    int pixels = 0;
    int x0 = 0, y0 = 0, x1 = 0, y1 = 0;  // inclusive bounds
    std::vector<int> row_width;          // pixels per row, from y0
};

}  // namespace

Verdict check_image(const uint8_t* rgb, int width, int height, const Scene& expected) {
    Verdict v;
    if (!rgb || width < 1 || height < 1) {
        v.shapes.resize(expected.shapes.size());
        return v;
    }
    const std::size_t n = static_cast<std::size_t>(width) * static_cast<std::size_t>(height);
    std::vector<int> cls(n);
    for (std::size_t i = 0; i < n; ++i) cls[i] = nearest_colour(rgb + 3 * i);
    // A 3 x 3 majority filter on the classes: isolated pixels of sampling noise take their
    // neighbours' class, edges and corners of shapes stay (a pixel changes only when more than
    // half of its window agrees on another class).
    {
        std::vector<int> filtered = cls;
        std::vector<int> count(palette().size());
        for (int y = 0; y < height; ++y)
            for (int x = 0; x < width; ++x) {
                std::fill(count.begin(), count.end(), 0);
                int window = 0;
                for (int dy = -1; dy <= 1; ++dy)
                    for (int dx = -1; dx <= 1; ++dx) {
                        const int yy = y + dy, xx = x + dx;
                        if (yy < 0 || xx < 0 || yy >= height || xx >= width) continue;
                        ++count[static_cast<std::size_t>(cls[static_cast<std::size_t>(yy) * width + xx])];
                        ++window;
                    }
                const auto best = std::max_element(count.begin(), count.end());
                if (*best * 2 > window)
                    filtered[static_cast<std::size_t>(y) * width + x] =
                        static_cast<int>(best - count.begin());
            }
        cls.swap(filtered);
    }

    // Background: the majority class of the border.
    std::vector<int> votes(palette().size(), 0);
    for (int x = 0; x < width; ++x) {
        ++votes[static_cast<std::size_t>(cls[static_cast<std::size_t>(x)])];
        ++votes[static_cast<std::size_t>(cls[static_cast<std::size_t>(height - 1) * width + x])];
    }
    for (int y = 0; y < height; ++y) {
        ++votes[static_cast<std::size_t>(cls[static_cast<std::size_t>(y) * width])];
        ++votes[static_cast<std::size_t>(cls[static_cast<std::size_t>(y) * width + width - 1])];
    }
    const int bg = static_cast<int>(std::max_element(votes.begin(), votes.end()) - votes.begin());
    v.seen_background = palette()[static_cast<std::size_t>(bg)].name;
    v.background = bg == expected.background;

    // Shape pixels: another class than the background's.
    std::vector<char> fg(n, 0);
    for (std::size_t i = 0; i < n; ++i) fg[i] = cls[i] != bg;
    // 4-connected components.
    std::vector<int> label(n, -1);
    std::vector<Component> comps;
    std::vector<std::size_t> stack;
    for (std::size_t start = 0; start < n; ++start) {
        if (!fg[start] || label[start] >= 0) continue;
        const int id = static_cast<int>(comps.size());
        Component c;
        c.x0 = c.x1 = static_cast<int>(start % static_cast<std::size_t>(width));
        c.y0 = c.y1 = static_cast<int>(start / static_cast<std::size_t>(width));
        std::vector<int> class_votes(palette().size(), 0);
        std::vector<std::size_t> members;
        stack.assign(1, start);
        label[start] = id;
        while (!stack.empty()) {
            const std::size_t i = stack.back();
            stack.pop_back();
            members.push_back(i);
            const int x = static_cast<int>(i % static_cast<std::size_t>(width)),
                      y = static_cast<int>(i / static_cast<std::size_t>(width));
            ++class_votes[static_cast<std::size_t>(cls[i])];
            c.x0 = std::min(c.x0, x);
            c.x1 = std::max(c.x1, x);
            c.y0 = std::min(c.y0, y);
            c.y1 = std::max(c.y1, y);
            const int nx[4] = {x - 1, x + 1, x, x}, ny[4] = {y, y, y - 1, y + 1};
            for (int k = 0; k < 4; ++k) {
                if (nx[k] < 0 || ny[k] < 0 || nx[k] >= width || ny[k] >= height) continue;
                const std::size_t j = static_cast<std::size_t>(ny[k]) * width + nx[k];
                if (fg[j] && label[j] < 0) {
                    label[j] = id;
                    stack.push_back(j);
                }
            }
        }
        c.pixels = static_cast<int>(members.size());
        c.colour =
            static_cast<int>(std::max_element(class_votes.begin(), class_votes.end()) - class_votes.begin());
        c.row_width.assign(static_cast<std::size_t>(c.y1 - c.y0 + 1), 0);
        for (std::size_t i : members)
            ++c.row_width[static_cast<std::size_t>(static_cast<int>(i / static_cast<std::size_t>(width)) -
                                                   c.y0)];
        comps.push_back(std::move(c));
    }
    // Specks are noise, not shapes.
    const int min_pixels = std::max(4, static_cast<int>(n / 200));
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < comps.size(); ++i)
        if (comps[i].pixels >= min_pixels) order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t c) { return comps[a].pixels > comps[c].pixels; });

    std::vector<bool> taken(comps.size(), false);
    for (const Shape& want : expected.shapes) {
        ShapeVerdict sv;
        std::size_t pick = comps.size();
        for (std::size_t i : order)
            if (!taken[i] && comps[i].colour == want.colour) {
                pick = i;
                break;
            }
        if (pick == comps.size())
            for (std::size_t i : order)
                if (!taken[i]) {
                    pick = i;
                    break;
                }
        if (pick < comps.size()) {
            taken[pick] = true;
            const Component& c = comps[pick];
            sv.found = true;
            sv.seen_colour = palette()[static_cast<std::size_t>(c.colour)].name;
            sv.colour = c.colour == want.colour;
            // Kind: top-quarter vs bottom-quarter widths, then how much of its box it fills.
            const int h = c.y1 - c.y0 + 1, w = c.x1 - c.x0 + 1;
            const int quarter = std::max(1, h / 4);
            double top = 0, bottom = 0;
            for (int r = 0; r < quarter; ++r) {
                top += c.row_width[static_cast<std::size_t>(r)];
                bottom += c.row_width[static_cast<std::size_t>(h - 1 - r)];
            }
            const double fill = static_cast<double>(c.pixels) / (static_cast<double>(w) * h);
            Kind kind = Kind::kCircle;
            if (top < 0.6 * bottom)
                kind = Kind::kTriangle;
            else if (fill >= 0.86)
                kind = Kind::kSquare;
            sv.seen_kind = kind_name(kind);
            sv.kind = kind == want.kind;
            // Position: the anchor nearest the box's centre.
            const double cx = (c.x0 + c.x1 + 1) / 2.0, cy = (c.y0 + c.y1 + 1) / 2.0;
            Position best = Position::kCentre;
            double best_d = std::numeric_limits<double>::max();
            for (int p = 0; p < kPositions; ++p) {
                Shape probe = want;
                probe.position = static_cast<Position>(p);
                const Box box = shape_box(probe, 1);
                const double dx = cx / width - box.cx, dy = cy / height - box.cy;
                if (dx * dx + dy * dy < best_d) {
                    best_d = dx * dx + dy * dy;
                    best = probe.position;
                }
            }
            sv.seen_position = position_name(best);
            sv.position = best == want.position;
        }
        v.shapes.push_back(sv);
    }
    return v;
}

void AdherenceTotals::add(const Verdict& v) {
    ++images;
    background += v.background;
    bool every = true;
    for (const ShapeVerdict& s : v.shapes) {
        ++shapes;
        colour += s.colour;
        kind += s.kind;
        position += s.position;
        every = every && s.colour && s.kind && s.position;
    }
    shapes_right += every;
    all_right += every && v.background;
}

}  // namespace dp::shapes
