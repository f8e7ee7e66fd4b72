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
            switch (rng() % 3) {
                case 0:
                    return "in the centre";
                case 1:
                    return "in the center";
                default:
                    return "in the middle";
            }
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

std::string colour_name(int index) { return palette()[static_cast<std::size_t>(index)].name; }

std::string article(const std::string& next) {
    return std::string("aeiou").find(next.front()) != std::string::npos ? "an" : "a";
}

namespace {

// One phrase of a description and how it may be joined to its neighbours: a bare phrase (a
// detached size, a background without a preposition) takes commas on both sides.
struct Phrase {
    std::string text;
    bool bare = false;
};

// The background's colour before it ("a green background") or after it ("a background in
// green"): with only the first, a model learns that a colour names the noun after it, and reads
// "the background, then green" as a green shape.
std::string background_phrase(int background, std::mt19937_64& rng, bool& bare) {
    const std::string bg = colour_name(background);
    const bool colour_first = rng() % 3 != 0;
    const std::string bare_noun = colour_first ? bg + " background" : "background in " + bg;
    const std::string noun =
        colour_first ? article(bg) + " " + bare_noun : std::string(rng() % 2 ? "a " : "the ") + bare_noun;
    bare = false;
    switch (rng() % 4) {
        case 0:
            bare = true;
            return noun;
        case 1:
            bare = true;
            return bare_noun;
        case 2:
            return "on " + noun;
        default:
            return "with " + noun;
    }
}

// The phrases of one shape in a random order: its colour and kind (with or without an article,
// the size before them or as a phrase of its own, the colour before the kind or after it, "a
// circle in red") and its position, before or after.
std::vector<Phrase> shape_phrases(const Shape& s, std::mt19937_64& rng) {
    const std::string size = size_word(s.size, rng);
    const bool detached = rng() % 3 == 0;
    std::string noun = rng() % 4 == 0 ? std::string(kind_name(s.kind)) + " in " + colour_name(s.colour)
                                      : colour_name(s.colour) + " " + kind_name(s.kind);
    if (!detached) noun = size + " " + noun;
    if (rng() % 4 != 0) noun = article(noun) + " " + noun;
    std::vector<Phrase> phrases = {{noun, false}, {position_phrase(s.position, rng), false}};
    if (rng() % 3 == 0) std::swap(phrases[0], phrases[1]);
    if (detached) {
        // "a red circle, small, on the left", "small, a red circle ...", "... on the left, small".
        const std::size_t at = rng() % 3;
        phrases.insert(phrases.begin() + static_cast<std::ptrdiff_t>(at), Phrase{size, true});
    }
    return phrases;
}

std::string join(const std::vector<Phrase>& phrases, std::mt19937_64& rng) {
    std::string out;
    for (std::size_t i = 0; i < phrases.size(); ++i) {
        if (i > 0) out += phrases[i].bare || phrases[i - 1].bare || rng() % 2 ? ", " : " ";
        out += phrases[i].text;
    }
    return out;
}

}  // namespace

std::string describe(const Scene& scene, std::mt19937_64& rng) {
    bool bare = false;
    const Phrase background{background_phrase(scene.background, rng, bare), bare};
    if (scene.shapes.size() == 2) {
        // Each shape in its own "and"-separated segment; the background first, last, or closing
        // the first segment.
        std::vector<Phrase> first = shape_phrases(scene.shapes[0], rng),
                            second = shape_phrases(scene.shapes[1], rng);
        const int where = static_cast<int>(rng() % 3);
        if (where == 0) first.insert(first.begin(), background);
        if (where == 1) first.push_back(background);
        if (where == 2) second.push_back(background);
        return join(first, rng) + (rng() % 2 ? ", and " : " and ") + join(second, rng);
    }
    std::vector<Phrase> phrases = shape_phrases(scene.shapes.front(), rng);
    const std::size_t at = rng() % (phrases.size() + 1);
    phrases.insert(phrases.begin() + static_cast<std::ptrdiff_t>(at), background);
    return join(phrases, rng);
}

std::vector<std::string> prompt_words(const std::string& prompt, const std::string& punctuation) {
    std::vector<std::string> words;
    std::string word;
    for (char ch : prompt + " ") {
        const unsigned char u = static_cast<unsigned char>(ch);
        if (std::isalpha(u)) {
            word += static_cast<char>(std::tolower(u));
            continue;
        }
        if (!word.empty()) words.push_back(word);
        word.clear();
        if (punctuation.find(ch) != std::string::npos) words.emplace_back(1, ch);
    }
    return words;
}

std::optional<Scene> parse_prompt(const std::string& prompt) {
    const std::vector<std::string> words = prompt_words(prompt, ",");
    Scene scene;
    scene.background = -1;
    // The background: "<colour> background", or "background is <colour>" / "background in <colour>".
    std::vector<bool> used(words.size(), false);
    for (std::size_t i = 0; i + 1 < words.size(); ++i) {
        std::size_t at = words.size();
        if (words[i + 1] == "background" && colour_index(words[i]) >= 0) at = i;
        if (words[i] == "background" && (words[i + 1] == "is" || words[i + 1] == "in") &&
            i + 2 < words.size() && colour_index(words[i + 2]) >= 0)
            at = i + 2;
        if (at == words.size()) continue;
        if (scene.background >= 0) return std::nullopt;  // two backgrounds
        scene.background = colour_index(words[at]);
        used[at] = true;
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
    std::vector<std::string> words = {"a",     "on",         "the",    "at",       "in",     "with",
                                      "and",   "background", "small",  "large",    "big",    "left",
                                      "right", "top",        "bottom", "centre",   "middle", "center",
                                      "an",    "circle",     "square", "triangle", ","};
    for (const Colour& c : palette()) words.push_back(c.name);
    for (const std::string& w : free_connective_words()) words.push_back(w);
    return words;
}

const std::vector<std::string>& free_connective_words() {
    static const std::vector<std::string> words = {"there", "is",     "that",    "placed", "against", "over",
                                                   "of",    "colour", "color",   "sits",   "shape",   "to",
                                                   "near",  "size",   "picture", ";",      ":"};
    return words;
}

}  // namespace dp::shapes
