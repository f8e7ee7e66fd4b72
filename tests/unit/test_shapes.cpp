// The shapes world and its adherence checker: rendered scenes are judged correct, wrong images
// are judged wrong, and every prompt the grammar writes parses back to its scene.
#include <doctest/doctest.h>

#include <random>
#include <set>

#include "shapes/adherence.h"
#include "shapes/shapes_world.h"

using namespace dp::shapes;

namespace {
int colour(const char* name) {
    for (std::size_t i = 0; i < palette().size(); ++i)
        if (std::string(palette()[i].name) == name) return static_cast<int>(i);
    FAIL("no colour " << name);
    return -1;
}
}  // namespace

TEST_CASE("every prompt the grammar writes parses back to the scene it describes") {
    std::mt19937_64 rng(7);
    std::set<std::string> phrasings;
    int two = 0;
    for (int i = 0; i < 100000; ++i) {
        const Scene scene = random_scene(rng, i % 5 == 0);
        two += scene.shapes.size() == 2;
        const std::string prompt = describe(scene, rng);
        CAPTURE(prompt);
        const auto parsed = parse_prompt(prompt);
        REQUIRE(parsed.has_value());
        CHECK(*parsed == scene);
        phrasings.insert(prompt);
    }
    CHECK(two > 15000);               // both one- and two-shape scenes
    CHECK(phrasings.size() > 50000);  // orders, paraphrases and attributes vary
}

TEST_CASE("prompts outside the grammar are not judged") {
    for (const char* text :
         {"", "a cat", "a red circle", "a red circle on the left, blue background",
          "small red circle on the left", "a small red blue circle on the left, green background",
          "a small red circle on the left on a blue background on a green background"})
        CHECK_FALSE(parse_prompt(text).has_value());
    const auto ok = parse_prompt("A Small RED circle, on the LEFT; blue background!");
    REQUIRE(ok.has_value());
    CHECK(ok->background == colour("blue"));
    CHECK(ok->shapes.size() == 1);
}

TEST_CASE("held-out pairs never appear in training scenes, and only they in held-out ones") {
    std::mt19937_64 rng(1);
    int held = 0;
    for (int i = 0; i < 2000; ++i) {
        const Scene train = random_scene(rng, false);
        for (const Shape& s : train.shapes) CHECK_FALSE(held_out(s));
        const Scene test = random_scene(rng, true);
        REQUIRE(test.shapes.size() == 1);
        held += held_out(test.shapes.front());
        CHECK(test.shapes.front().colour != test.background);
    }
    CHECK(held == 2000);
    Shape red_triangle{colour("red"), Kind::kTriangle, Size::kSmall, Position::kLeft};
    CHECK(held_out(red_triangle));
}

TEST_CASE("the checker judges rendered scenes correct, at every size, kind and position") {
    std::mt19937_64 rng(3);
    AdherenceTotals totals;
    for (int i = 0; i < 600; ++i) {
        const Scene scene = random_scene(rng, false);
        const std::vector<uint8_t> rgb = render(scene, 32, &rng);
        const Verdict v = check_image(rgb.data(), 32, 32, scene);
        totals.add(v);
        CAPTURE(i);
        CHECK(v.background);
        for (const ShapeVerdict& s : v.shapes) {
            CHECK(s.colour);
            CHECK(s.kind);
            CHECK(s.position);
        }
    }
    CHECK(totals.images == 600);
    CHECK(totals.shapes > 600);  // some scenes have two shapes
}

TEST_CASE("the checker sees what is wrong: colour, kind, position, background, or no shape") {
    const Scene asked{colour("blue"), {{colour("red"), Kind::kCircle, Size::kLarge, Position::kLeft}}};
    auto judge = [&](const Scene& drawn) {
        const std::vector<uint8_t> rgb = render(drawn, 32);
        return check_image(rgb.data(), 32, 32, asked);
    };
    Scene other = asked;
    other.shapes[0].colour = colour("green");
    Verdict v = judge(other);
    CHECK(v.background);
    CHECK_FALSE(v.shapes[0].colour);
    CHECK(v.shapes[0].seen_colour == "green");
    CHECK(v.shapes[0].kind);
    for (Kind k : {Kind::kSquare, Kind::kTriangle}) {
        other = asked;
        other.shapes[0].kind = k;
        v = judge(other);
        CHECK_FALSE(v.shapes[0].kind);
        CHECK(v.shapes[0].seen_kind == kind_name(k));
        CHECK(v.shapes[0].colour);
    }
    other = asked;
    other.shapes[0].position = Position::kRight;
    CHECK(judge(other).shapes[0].seen_position == "right");
    other = asked;
    other.background = colour("yellow");
    CHECK_FALSE(judge(other).background);
    other = asked;
    other.shapes.clear();
    v = judge(other);
    CHECK_FALSE(v.shapes[0].found);
    CHECK_FALSE(v.shapes[0].colour);
}

TEST_CASE("the checker takes any image size, and noise does not crash it") {
    const Scene asked{0, {{1, Kind::kSquare, Size::kSmall, Position::kCentre}}};
    std::mt19937_64 rng(5);
    for (int w : {1, 2, 3, 17, 64})
        for (int h : {1, 5, 64}) {
            std::vector<uint8_t> noise(static_cast<std::size_t>(w) * h * 3);
            for (auto& b : noise) b = static_cast<uint8_t>(rng());
            const Verdict v = check_image(noise.data(), w, h, asked);
            CHECK(v.shapes.size() == 1);
        }
    CHECK(check_image(nullptr, 0, 0, asked).shapes.size() == 1);
    // A 64 x 64 render is judged like a 32 x 32 one.
    const Scene scene{colour("white"), {{colour("black"), Kind::kTriangle, Size::kSmall, Position::kBottom}}};
    const std::vector<uint8_t> big = render(scene, 64);
    const Verdict v = check_image(big.data(), 64, 64, scene);
    CHECK((v.background && v.shapes[0].colour && v.shapes[0].kind && v.shapes[0].position));
}
