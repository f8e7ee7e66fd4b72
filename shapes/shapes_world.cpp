#include "shapes/shapes_world.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

namespace dp::shapes {

const std::vector<Colour>& palette() {
    static const std::vector<Colour> colours = {{"red", 220, 40, 40},     {"green", 40, 170, 60},
                                                {"blue", 40, 80, 220},    {"yellow", 240, 220, 40},
                                                {"purple", 140, 60, 190}, {"orange", 250, 140, 30},
                                                {"white", 245, 245, 245}, {"black", 20, 20, 20}};
    return colours;
}

const char* kind_name(Kind k) {
    switch (k) {
        case Kind::kCircle:
            return "circle";
        case Kind::kSquare:
            return "square";
        case Kind::kTriangle:
            return "triangle";
    }
    return "?";
}
const char* size_name(Size s) { return s == Size::kSmall ? "small" : "large"; }
const char* position_name(Position p) {
    switch (p) {
        case Position::kLeft:
            return "left";
        case Position::kRight:
            return "right";
        case Position::kTop:
            return "top";
        case Position::kBottom:
            return "bottom";
        case Position::kCentre:
            return "centre";
    }
    return "?";
}

namespace {

int colour_index(const std::string& name) {
    for (std::size_t i = 0; i < palette().size(); ++i)
        if (name == palette()[i].name) return static_cast<int>(i);
    return -1;
}

// (colour name, kind) pairs held out of training.
const std::vector<std::pair<std::string, Kind>>& held_out_pairs() {
    static const std::vector<std::pair<std::string, Kind>> pairs = {
        {"red", Kind::kTriangle},    {"blue", Kind::kCircle},   {"yellow", Kind::kSquare},
        {"purple", Kind::kTriangle}, {"orange", Kind::kCircle}, {"white", Kind::kSquare}};
    return pairs;
}

std::string position_phrase(Position p, std::mt19937_64& rng) {
    switch (p) {
        case Position::kLeft:
            return "on the left";
        case Position::kRight:
            return "on the right";
        case Position::kTop:
            return "at the top";
        case Position::kBottom:
            return "at the bottom";
        case Position::kCentre:
            return rng() % 2 ? "in the centre" : "in the middle";
    }
    return "";
}

std::string size_word(Size s, std::mt19937_64& rng) {
    if (s == Size::kSmall) return "small";
    return rng() % 3 == 0 ? "big" : "large";
}

}  // namespace

bool held_out(const Shape& shape) {
    for (const auto& [colour, kind] : held_out_pairs())
        if (palette()[static_cast<std::size_t>(shape.colour)].name == colour && shape.kind == kind)
            return true;
    return false;
}

Scene random_scene(std::mt19937_64& rng, bool held_out_only, bool allow_two_shapes) {
    const int colours = static_cast<int>(palette().size());
    Scene scene;
    scene.background = static_cast<int>(rng() % static_cast<uint64_t>(colours));
    auto random_shape = [&](bool want_held_out) {
        for (;;) {
            Shape s;
            s.colour = static_cast<int>(rng() % static_cast<uint64_t>(colours));
            s.kind = static_cast<Kind>(rng() % kKinds);
            s.size = static_cast<Size>(rng() % kSizes);
            s.position = static_cast<Position>(rng() % kPositions);
            if (s.colour != scene.background && held_out(s) == want_held_out) return s;
        }
    };
    const bool two = allow_two_shapes && !held_out_only && rng() % 4 == 0;
    scene.shapes.push_back(random_shape(held_out_only));
    if (two) {
        // Two small shapes on opposite sides, of different colours.
        Shape& a = scene.shapes.front();
        Shape b = random_shape(false);
        while (b.colour == a.colour) b = random_shape(false);
        const bool horizontal = rng() % 2 == 0;
        a.position = horizontal ? Position::kLeft : Position::kTop;
        b.position = horizontal ? Position::kRight : Position::kBottom;
        if (rng() % 2) std::swap(a.position, b.position);
        a.size = b.size = Size::kSmall;
        scene.shapes.push_back(b);
    }
    return scene;
}

Box shape_box(const Shape& shape, int size) {
    const double n = size;
    double cx = 0.5 * n, cy = 0.5 * n;
    switch (shape.position) {
        case Position::kLeft:
            cx = 0.28 * n;
            break;
        case Position::kRight:
            cx = 0.72 * n;
            break;
        case Position::kTop:
            cy = 0.28 * n;
            break;
        case Position::kBottom:
            cy = 0.72 * n;
            break;
        case Position::kCentre:
            break;
    }
    return {cx, cy, (shape.size == Size::kSmall ? 10.0 : 18.0) / 32.0 * n};
}

std::vector<uint8_t> render(const Scene& scene, int size, std::mt19937_64* jitter) {
    std::vector<uint8_t> rgb(static_cast<std::size_t>(size) * size * 3);
    const Colour& bg = palette()[static_cast<std::size_t>(scene.background)];
    for (std::size_t i = 0; i < rgb.size(); i += 3) {
        rgb[i] = bg.r;
        rgb[i + 1] = bg.g;
        rgb[i + 2] = bg.b;
    }
    for (const Shape& shape : scene.shapes) {
        Box box = shape_box(shape, size);
        if (jitter) {
            box.cx += static_cast<double>(static_cast<int>((*jitter)() % 3) - 1);
            box.cy += static_cast<double>(static_cast<int>((*jitter)() % 3) - 1);
        }
        const double h = box.extent / 2;
        const Colour& c = palette()[static_cast<std::size_t>(shape.colour)];
        for (int y = 0; y < size; ++y)
            for (int x = 0; x < size; ++x) {
                const double dx = x + 0.5 - box.cx, dy = y + 0.5 - box.cy;
                bool inside = false;
                switch (shape.kind) {
                    case Kind::kCircle:
                        inside = dx * dx + dy * dy <= h * h;
                        break;
                    case Kind::kSquare:
                        inside = std::abs(dx) <= h && std::abs(dy) <= h;
                        break;
                    case Kind::kTriangle:  // apex up, base at the bottom
                        inside = dy >= -h && dy <= h && std::abs(dx) <= (dy + h) / 2;
                        break;
                }
                if (!inside) continue;
                uint8_t* p = &rgb[(static_cast<std::size_t>(y) * size + x) * 3];
                p[0] = c.r;
                p[1] = c.g;
                p[2] = c.b;
            }
    }
    return rgb;
}

std::string describe(const Scene& scene, std::mt19937_64& rng) {
    const std::string bg = palette()[static_cast<std::size_t>(scene.background)].name;
    auto colour = [&](const Shape& s) {
        return std::string(palette()[static_cast<std::size_t>(s.colour)].name);
    };
    if (scene.shapes.size() == 2) {
        const Shape &a = scene.shapes[0], &b = scene.shapes[1];
        const std::string first = size_word(a.size, rng) + " " + colour(a) + " " + kind_name(a.kind) + " " +
                                  position_phrase(a.position, rng);
        const std::string second = size_word(b.size, rng) + " " + colour(b) + " " + kind_name(b.kind) + " " +
                                   position_phrase(b.position, rng);
        switch (rng() % 3) {
            case 0:
                return "a " + first + " and a " + second + " on a " + bg + " background";
            case 1:
                return bg + " background, a " + first + " and a " + second;
            default:
                return "a " + first + " and a " + second + ", " + bg + " background";
        }
    }
    const Shape& s = scene.shapes.front();
    const std::string size = size_word(s.size, rng), col = colour(s), kind = kind_name(s.kind),
                      pos = position_phrase(s.position, rng);
    switch (rng() % 6) {
        case 0:
            return "a " + size + " " + col + " " + kind + " " + pos + " on a " + bg + " background";
        case 1:
            return bg + " background, " + col + " " + kind + ", " + size + ", " + pos;
        case 2:
            return "a " + col + " " + kind + " " + pos + ", " + size + ", on a " + bg + " background";
        case 3:
            return size + " " + col + " " + kind + " " + pos + ", " + bg + " background";
        case 4:
            return "a " + bg + " background with a " + size + " " + col + " " + kind + " " + pos;
        default:
            return "a " + size + " " + col + " " + kind + " on a " + bg + " background, " + pos;
    }
}

std::optional<Scene> parse_prompt(const std::string& prompt) {
    std::vector<std::string> words;
    std::string word;
    for (char ch : prompt + " ") {
        const unsigned char u = static_cast<unsigned char>(ch);
        if (std::isalpha(u)) {
            word += static_cast<char>(std::tolower(u));
        } else {
            if (!word.empty()) words.push_back(word);
            word.clear();
            if (ch == ',') words.push_back(",");
        }
    }
    Scene scene;
    scene.background = -1;
    // The background: "<colour> background".
    std::vector<bool> used(words.size(), false);
    for (std::size_t i = 0; i + 1 < words.size(); ++i)
        if (words[i + 1] == "background" && colour_index(words[i]) >= 0) {
            if (scene.background >= 0) return std::nullopt;  // two backgrounds
            scene.background = colour_index(words[i]);
            used[i] = true;
        }
    if (scene.background < 0) return std::nullopt;
    // Shapes: segments separated by "and", each with one colour, kind, size and position.
    std::vector<std::vector<std::size_t>> segments(1);
    for (std::size_t i = 0; i < words.size(); ++i) {
        if (words[i] == "and")
            segments.emplace_back();
        else if (!used[i])
            segments.back().push_back(i);
    }
    for (const auto& segment : segments) {
        int colour = -1, kind = -1, size = -1, position = -1;
        auto set = [](int& slot, int value) {
            if (slot >= 0 && slot != value) return false;
            slot = value;
            return true;
        };
        for (std::size_t i : segment) {
            const std::string& w = words[i];
            bool ok = true;
            if (colour_index(w) >= 0)
                ok = set(colour, colour_index(w));
            else if (w == "circle")
                ok = set(kind, 0);
            else if (w == "square")
                ok = set(kind, 1);
            else if (w == "triangle")
                ok = set(kind, 2);
            else if (w == "small")
                ok = set(size, 0);
            else if (w == "large" || w == "big")
                ok = set(size, 1);
            else if (w == "left")
                ok = set(position, 0);
            else if (w == "right")
                ok = set(position, 1);
            else if (w == "top")
                ok = set(position, 2);
            else if (w == "bottom")
                ok = set(position, 3);
            else if (w == "centre" || w == "center" || w == "middle")
                ok = set(position, 4);
            if (!ok) return std::nullopt;
        }
        if (colour < 0 && kind < 0 && size < 0 && position < 0) continue;
        if (colour < 0 || kind < 0 || size < 0 || position < 0) return std::nullopt;
        scene.shapes.push_back(
            {colour, static_cast<Kind>(kind), static_cast<Size>(size), static_cast<Position>(position)});
    }
    if (scene.shapes.empty() || scene.shapes.size() > 2) return std::nullopt;
    return scene;
}

std::vector<std::string> grammar_words() {
    std::vector<std::string> words = {"a",          "on",     "the",    "at",     "in",     "with",     "and",
                                      "background", "small",  "large",  "big",    "left",   "right",    "top",
                                      "bottom",     "centre", "middle", "circle", "square", "triangle", ","};
    for (const Colour& c : palette()) words.push_back(c.name);
    return words;
}

}  // namespace dp::shapes
