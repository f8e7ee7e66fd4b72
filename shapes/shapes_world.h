#pragma once
// The "shapes" world the built-in model learns: one or two flat shapes (circle, square,
// triangle) of a named colour, small or large, at the left, right, top, bottom or centre of a
// plain background. Scenes are drawn at random from a seeded generator, rendered to RGB and
// described by a small grammar with paraphrases; parse_prompt reads a description back, so that
// the adherence checker knows what a prompt asked for. No LibTorch.

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace dp::shapes {

struct Colour {
    const char* name;
    uint8_t r, g, b;
};
// The named colours, well apart in RGB.
const std::vector<Colour>& palette();
// The name of palette colour `index` ("red"), and "a" or "an" before the word `next`.
std::string colour_name(int index);
std::string article(const std::string& next);

enum class Kind { kCircle, kSquare, kTriangle };
enum class Size { kSmall, kLarge };
enum class Position { kLeft, kRight, kTop, kBottom, kCentre };
inline constexpr int kKinds = 3, kSizes = 2, kPositions = 5;

const char* kind_name(Kind k);
const char* size_name(Size s);
const char* position_name(Position p);

struct Shape {
    int colour = 0;  // index into palette()
    Kind kind = Kind::kCircle;
    Size size = Size::kSmall;
    Position position = Position::kCentre;
    bool operator==(const Shape& o) const {
        return colour == o.colour && kind == o.kind && size == o.size && position == o.position;
    }
};

struct Scene {
    int background = 0;         // index into palette()
    std::vector<Shape> shapes;  // one or two; two are small and on opposite sides
    bool operator==(const Scene& o) const { return background == o.background && shapes == o.shapes; }
};

// The (colour, kind) pairs never shown in training, to measure generalisation to combinations
// the model has not seen: each colour and each kind still appears in training with others.
bool held_out(const Shape& shape);

// A random scene; `held_out_only` false: no shape uses a held-out pair; true: its first (or
// only) shape does, and it has one shape.
Scene random_scene(std::mt19937_64& rng, bool held_out_only, bool allow_two_shapes = true);

// The shape's centre and extent on a `size` x `size` canvas (the anchors the checker judges by).
struct Box {
    double cx, cy, extent;
};
Box shape_box(const Shape& shape, int size);

// RGB, row-major, `size` x `size` x 3. `jitter` (may be null) moves each shape up to a pixel.
std::vector<uint8_t> render(const Scene& scene, int size, std::mt19937_64* jitter = nullptr);

// A prompt for the scene (the trainer's grammar): its phrases (background, each shape's colour
// and kind, size, position) in an order and with joints chosen by `rng`; "and" only between
// two shapes. Never writes a word of free_connective_words().
std::string describe(const Scene& scene, std::mt19937_64& rng);

// What a prompt asks for: the background and each shape. The prompt must name a background
// colour ("<colour> background", "background is <colour>" or "background in <colour>") and, for
// each shape, a colour, a kind, a size and a position; two shapes are joined by "and". nullopt for anything
// else (the checker cannot judge it).
std::optional<Scene> parse_prompt(const std::string& prompt);

// The words of a prompt, lower-cased: runs of letters, and each character of `punctuation` as a
// word of its own; everything else separates.
std::vector<std::string> prompt_words(const std::string& prompt, const std::string& punctuation);

// Every word the grammar writes, for the tokenizer's vocabulary: describe's words, then
// free_connective_words().
std::vector<std::string> grammar_words();

// The connectives only the free phrasings (shapes/free_phrasing.h) write, never describe.
const std::vector<std::string>& free_connective_words();

}  // namespace dp::shapes
