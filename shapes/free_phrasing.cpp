#include "shapes/free_phrasing.h"

#include <algorithm>

namespace dp::shapes {
namespace {

template <typename T>
const T& pick(const std::vector<T>& options, std::mt19937_64& rng) {
    return options[rng() % options.size()];
}

std::string size_of(Size s, std::mt19937_64& rng) {
    return s == Size::kSmall ? std::string("small") : pick<std::string>({"large", "big"}, rng);
}

// Positions with other prepositions than the trainer's where English has them.
std::string where(Position p, std::mt19937_64& rng) {
    switch (p) {
        case Position::kLeft:
            return pick<std::string>({"on the left", "to the left"}, rng);
        case Position::kRight:
            return pick<std::string>({"on the right", "to the right"}, rng);
        case Position::kTop:
            return pick<std::string>({"at the top", "near the top"}, rng);
        case Position::kBottom:
            return pick<std::string>({"at the bottom", "near the bottom"}, rng);
        case Position::kCentre:
            return pick<std::string>({"in the centre", "in the center", "in the middle"}, rng);
    }
    return "";
}

// The shape with its article: "a small red circle", "a red circle that is small", "a small
// circle of colour red".
std::string shape_of(const Shape& s, std::mt19937_64& rng) {
    const std::string size = size_of(s.size, rng), colour = colour_name(s.colour), kind = kind_name(s.kind);
    std::string noun;
    switch (rng() % 3) {
        case 0:
            noun = size + " " + colour + " " + kind;
            break;
        case 1:
            noun = colour + " " + kind + " that is " + size;
            break;
        default:
            noun = size + " " + kind + " of " + pick<std::string>({"colour", "color"}, rng) + " " + colour;
            break;
    }
    return article(noun) + " " + noun;
}

std::string backdrop(int background, std::mt19937_64& rng) {
    const std::string bg = colour_name(background);
    return pick<std::string>({"against", "over"}, rng) + " " + article(bg) + " " + bg + " background";
}

std::string there_is(const Scene& sc, std::mt19937_64& rng) {
    const Shape& a = sc.shapes[0];
    if (sc.shapes.size() == 1) {
        if (rng() % 2)
            return "there is " + shape_of(a, rng) + " " + where(a.position, rng) + " " +
                   backdrop(sc.background, rng);
        return backdrop(sc.background, rng) + " there is " + shape_of(a, rng) + " " + where(a.position, rng);
    }
    const Shape& b = sc.shapes[1];
    if (rng() % 2)
        return "there is " + shape_of(a, rng) + " " + where(a.position, rng) + " and " + shape_of(b, rng) +
               " " + where(b.position, rng) + " " + backdrop(sc.background, rng);
    return backdrop(sc.background, rng) + ", there is " + shape_of(a, rng) + " " + where(a.position, rng) +
           " and there is " + shape_of(b, rng) + " " + where(b.position, rng);
}

std::string colon(const Scene& sc, std::mt19937_64& rng) {
    const Shape& a = sc.shapes[0];
    const std::string bg = colour_name(sc.background);
    if (sc.shapes.size() == 1) {
        if (rng() % 2)
            return where(a.position, rng) + ", " + backdrop(sc.background, rng) + ": " + shape_of(a, rng);
        return article(bg) + " " + bg + " background: " + shape_of(a, rng) + ", " + where(a.position, rng);
    }
    const Shape& b = sc.shapes[1];
    return backdrop(sc.background, rng) + ": " + shape_of(a, rng) + " " + where(a.position, rng) + " and " +
           shape_of(b, rng) + " " + where(b.position, rng);
}

std::string background_is(const Scene& sc, std::mt19937_64& rng) {
    const std::string bg = "the background is " + colour_name(sc.background);
    std::string shapes;
    for (std::size_t i = 0; i < sc.shapes.size(); ++i) {
        if (i > 0) shapes += " and ";
        const Shape& s = sc.shapes[i];
        shapes += rng() % 2 ? shape_of(s, rng) + " is placed " + where(s.position, rng)
                            : where(s.position, rng) + " is " + shape_of(s, rng);
    }
    return rng() % 2 ? bg + "; " + shapes : shapes + "; " + bg;
}

// Items of a list, in any order, between semicolons.
std::string semicolons(const Scene& sc, std::mt19937_64& rng) {
    auto items = [&](const Shape& s) {
        std::vector<std::string> list = {colour_name(s.colour) + " " + kind_name(s.kind),
                                         size_of(s.size, rng), where(s.position, rng)};
        std::shuffle(list.begin(), list.end(), rng);
        return list;
    };
    auto join = [](const std::vector<std::string>& list) {
        std::string out;
        for (const std::string& item : list) out += (out.empty() ? "" : "; ") + item;
        return out;
    };
    const std::string bg = colour_name(sc.background) + " background";
    if (sc.shapes.size() == 1) {
        std::vector<std::string> list = items(sc.shapes[0]);
        list.insert(list.begin() + static_cast<std::ptrdiff_t>(rng() % (list.size() + 1)), bg);
        return join(list);
    }
    const std::string shapes = join(items(sc.shapes[0])) + "; and " + join(items(sc.shapes[1]));
    return rng() % 2 ? bg + "; " + shapes : shapes + "; " + bg;
}

std::string sits(const Scene& sc, std::mt19937_64& rng) {
    std::string shapes;
    for (std::size_t i = 0; i < sc.shapes.size(); ++i)
        shapes +=
            (i ? " and " : "") + shape_of(sc.shapes[i], rng) + " sits " + where(sc.shapes[i].position, rng);
    return rng() % 2 ? shapes + " " + backdrop(sc.background, rng)
                     : backdrop(sc.background, rng) + ", " + shapes;
}

std::string picture(const Scene& sc, std::mt19937_64& rng) {
    std::string shapes;
    for (std::size_t i = 0; i < sc.shapes.size(); ++i)
        shapes += (i ? " and " : "") + shape_of(sc.shapes[i], rng) + " " + where(sc.shapes[i].position, rng);
    const std::string bg = colour_name(sc.background);
    if (rng() % 2) return "a picture of " + shapes + " " + backdrop(sc.background, rng);
    return "a picture of " + article(bg) + " " + bg + " background with " + shapes;
}

std::string placed(const Scene& sc, std::mt19937_64& rng) {
    const Shape& a = sc.shapes[0];
    if (sc.shapes.size() == 1) {
        if (rng() % 2)
            return shape_of(a, rng) + " placed " + where(a.position, rng) + " " +
                   backdrop(sc.background, rng);
        return "placed " + where(a.position, rng) + ", " + backdrop(sc.background, rng) + ", " +
               shape_of(a, rng);
    }
    const Shape& b = sc.shapes[1];
    return backdrop(sc.background, rng) + ", " + shape_of(a, rng) + " placed " + where(a.position, rng) +
           " and " + shape_of(b, rng) + " placed " + where(b.position, rng);
}

using Writer = std::string (*)(const Scene&, std::mt19937_64&);
// In free_family's order: no family writes the mark of one before it.
const std::vector<std::pair<std::string, Writer>>& writers() {
    static const std::vector<std::pair<std::string, Writer>> all = {{"background_is", background_is},
                                                                    {"there_is", there_is},
                                                                    {"colon", colon},
                                                                    {"semicolons", semicolons},
                                                                    {"sits", sits},
                                                                    {"picture", picture},
                                                                    {"placed", placed}};
    return all;
}

}  // namespace

const std::vector<std::string>& free_families() {
    static const std::vector<std::string> names = [] {
        std::vector<std::string> n;
        for (const auto& [name, writer] : writers()) n.push_back(name);
        return n;
    }();
    return names;
}

Phrasing describe_freely(const Scene& scene, std::mt19937_64& rng) {
    const auto& [name, writer] = writers()[rng() % writers().size()];
    return {writer(scene, rng), name};
}

std::string free_family(const std::string& prompt) {
    const std::vector<std::string> w = prompt_words(prompt, ";:");
    auto has = [&](const char* word) { return std::find(w.begin(), w.end(), word) != w.end(); };
    for (std::size_t i = 0; i + 1 < w.size(); ++i)
        if (w[i] == "background" && w[i + 1] == "is") return "background_is";
    if (has("there")) return "there_is";
    if (has(":")) return "colon";
    if (has(";")) return "semicolons";
    if (has("sits")) return "sits";
    if (has("picture")) return "picture";
    if (has("placed")) return "placed";
    return "";
}

}  // namespace dp::shapes
