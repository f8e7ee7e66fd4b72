// The trainer's grammar in any order and the separate free phrasings: every prompt parses back to
// its scene, uses only the tokenizer's words, and the two generators never write the same prompt.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>

#include "shapes/adherence.h"
#include "shapes/free_phrasing.h"
#include "shapes/shapes_world.h"
#include "support/test_paths.h"

using namespace dp::shapes;

namespace {

// The words and marks of a prompt; "?" for any other character.
std::vector<std::string> words_of(const std::string& prompt) {
    std::vector<std::string> words;
    std::string word;
    for (char ch : prompt + " ") {
        if (std::islower(static_cast<unsigned char>(ch))) {
            word += ch;
            continue;
        }
        if (!word.empty()) words.push_back(word);
        word.clear();
        if (ch == ',' || ch == ';' || ch == ':')
            words.emplace_back(1, ch);
        else if (ch != ' ')
            words.emplace_back("?");
    }
    return words;
}

bool in(const std::vector<std::string>& list, const std::string& w) {
    return std::find(list.begin(), list.end(), w) != list.end();
}

// Grammar words only, "an" before a vowel and "a" before anything else, at most 30 tokens, and
// no doubled spaces or stray commas.
void check_english(const std::string& prompt) {
    CAPTURE(prompt);
    const std::vector<std::string> w = words_of(prompt);
    const std::vector<std::string> vocab = grammar_words();
    for (std::size_t i = 0; i < w.size(); ++i) {
        CHECK(in(vocab, w[i]));
        if (w[i] == "a" || w[i] == "an") {
            REQUIRE(i + 1 < w.size());
            const bool vowel = std::string("aeiou").find(w[i + 1].front()) != std::string::npos;
            CHECK((w[i] == "an") == vowel);
        }
    }
    // A tokenizer with one token per grammar word fits it in CLIP's 32 (with its two specials).
    CHECK(w.size() <= 30);
    CHECK(prompt.find("  ") == std::string::npos);
    CHECK(prompt.find(",,") == std::string::npos);
    CHECK(prompt.front() != ' ');
    CHECK(prompt.back() != ' ');
    CHECK(prompt.back() != ',');
}

}  // namespace

TEST_CASE("the trainer's grammar writes its phrases in any order, with the tokenizer's words only") {
    std::mt19937_64 rng(11);
    int background_first = 0, background_middle = 0, background_last = 0, an_orange = 0, center = 0,
        position_first = 0, colour_after_background = 0, colour_after_kind = 0;
    for (int i = 0; i < 100000; ++i) {
        const Scene scene = random_scene(rng, i % 5 == 0);
        const std::string prompt = describe(scene, rng);
        check_english(prompt);
        for (const std::string& w : words_of(prompt)) CHECK_FALSE(in(free_connective_words(), w));
        CHECK(std::count(prompt.begin(), prompt.end(), ' ') > 0);
        const std::vector<std::string> w = words_of(prompt);
        const auto bg = std::find(w.begin(), w.end(), "background");
        REQUIRE(bg != w.end());
        if (bg - w.begin() <= 3)
            ++background_first;
        else if (w.end() - bg == 1)
            ++background_last;
        else
            ++background_middle;
        an_orange += prompt.find("an orange") != std::string::npos;
        colour_after_background += prompt.find("background in ") != std::string::npos;
        for (const char* kind : {"circle in ", "square in ", "triangle in "})
            colour_after_kind += prompt.find(kind) != std::string::npos;
        center += prompt.find("center") != std::string::npos;
        for (const char* start : {"on the left", "on the right", "at the", "in the"})
            position_first += prompt.rfind(start, 0) == 0;
        // "and" only between the two shapes.
        CHECK(std::count(w.begin(), w.end(), "and") == static_cast<long>(scene.shapes.size()) - 1);
    }
    CHECK(background_first > 10000);
    CHECK(background_middle > 10000);
    CHECK(background_last > 10000);
    CHECK(an_orange > 1000);
    CHECK(center > 1000);
    CHECK(position_first > 1000);
    // The colour after its noun as well as before it, for the background and for a shape.
    CHECK(colour_after_background > 20000);
    CHECK(colour_after_background < 50000);
    CHECK(colour_after_kind > 15000);
    CHECK(colour_after_kind < 50000);
}

TEST_CASE("every free phrasing parses back to its scene, in every family, with the tokenizer's words") {
    std::mt19937_64 rng(23);
    std::map<std::string, int> one, two;
    std::set<std::string> prompts;
    for (int i = 0; i < 100000; ++i) {
        const Scene scene = random_scene(rng, i % 5 == 0);
        const Phrasing p = describe_freely(scene, rng);
        CAPTURE(p.prompt);
        check_english(p.prompt);
        const auto parsed = parse_prompt(p.prompt);
        REQUIRE(parsed.has_value());
        CHECK(*parsed == scene);
        CHECK(free_family(p.prompt) == p.family);
        ++(scene.shapes.size() == 1 ? one : two)[p.family];
        prompts.insert(p.prompt);
    }
    for (const std::string& family : free_families()) {
        CAPTURE(family);
        CHECK(one[family] > 1000);
        CHECK(two[family] > 300);
    }
    CHECK(one.size() == free_families().size());
    CHECK(prompts.size() > 50000);
}

TEST_CASE("the free phrasings and the trainer's grammar never write the same prompt") {
    std::set<std::string> trainer, free;
    for (uint64_t seed : {1, 2, 3, 4, 5}) {
        std::mt19937_64 rng(seed);
        for (int i = 0; i < 20000; ++i) {
            const Scene scene = random_scene(rng, i % 3 == 0);
            const std::string prompt = describe(scene, rng);
            CHECK(free_family(prompt).empty());
            trainer.insert(prompt);
            free.insert(describe_freely(scene, rng).prompt);
        }
    }
    // The held-out sampler's scenes, as dp-adherence --print-held-out and --print-free draw them.
    for (uint64_t seed : {5, 11}) {
        std::mt19937_64 rng(seed);
        for (int i = 0; i < 20000; ++i) {
            const Scene scene = random_scene(rng, true);
            trainer.insert(describe(scene, rng));
            free.insert(describe_freely(scene, rng).prompt);
        }
    }
    std::vector<std::string> both;
    std::set_intersection(trainer.begin(), trainer.end(), free.begin(), free.end(), std::back_inserter(both));
    CHECK(both.empty());
    CHECK(trainer.size() > 50000);
    CHECK(free.size() > 50000);
}

TEST_CASE("parse_prompt reads \"background in <colour>\" and \"<kind> in <colour>\"") {
    const auto p = parse_prompt("on the left, a small circle in red, with the background in green");
    REQUIRE(p.has_value());
    CHECK(std::string(palette()[static_cast<std::size_t>(p->background)].name) == "green");
    REQUIRE(p->shapes.size() == 1);
    CHECK(std::string(palette()[static_cast<std::size_t>(p->shapes[0].colour)].name) == "red");
    CHECK(p->shapes[0].kind == Kind::kCircle);
    CHECK(p->shapes[0].position == Position::kLeft);
    // "in the centre" is a position, not a background colour.
    CHECK_FALSE(parse_prompt("a small red circle, a background in the centre"));
    CHECK_FALSE(parse_prompt("a background in green, a small red circle on the left, a background in blue"));
}

TEST_CASE("parse_prompt reads \"background is <colour>\", and still refuses two backgrounds") {
    const auto p = parse_prompt("the background is blue; a small red circle is placed on the left");
    REQUIRE(p.has_value());
    CHECK(std::string(palette()[static_cast<std::size_t>(p->background)].name) == "blue");
    REQUIRE(p->shapes.size() == 1);
    CHECK(p->shapes[0].position == Position::kLeft);
    CHECK_FALSE(parse_prompt("the background is blue, a small red circle on the left, green background"));
    CHECK_FALSE(parse_prompt("the background is a small red circle on the left"));
    CHECK(free_family("a small red circle on the left on a blue background").empty());
    CHECK(free_family("there is a small red circle on the left against a blue background") == "there_is");
}

TEST_CASE("the committed free evaluation set is what the fixed generator writes, all of it judged") {
    // tests/data/held_out_free_prompts.txt = dp-adherence --print-free 200 --seed 11: a change to
    // describe_freely would silently change the evaluation set.
    const std::string file =
        std::string(dp::test::paths::kSourceDir) + "/tests/data/held_out_free_prompts.txt";
    std::ifstream in(file);
    REQUIRE_MESSAGE(in.good(), file);
    std::mt19937_64 rng(11);
    int lines = 0;
    for (std::string line; std::getline(in, line); ++lines) {
        const Scene scene = random_scene(rng, true);
        CHECK(line == describe_freely(scene, rng).prompt);
        const auto parsed = parse_prompt(line);
        REQUIRE(parsed.has_value());
        CHECK(held_out(parsed->shapes.front()));
        CHECK_FALSE(free_family(line).empty());
    }
    CHECK(lines == 200);
}

TEST_CASE("the totals count images whose every shape is right, and those right in everything") {
    const Scene scene{0,
                      {{1, Kind::kCircle, Size::kSmall, Position::kLeft},
                       {2, Kind::kSquare, Size::kSmall, Position::kRight}}};
    AdherenceTotals t;
    std::vector<uint8_t> rgb = render(scene, 32);
    t.add(check_image(rgb.data(), 32, 32, scene));
    Scene wrong = scene;
    wrong.shapes[1].kind = Kind::kTriangle;
    rgb = render(wrong, 32);
    t.add(check_image(rgb.data(), 32, 32, scene));
    wrong = scene;
    wrong.background = 3;
    rgb = render(wrong, 32);
    t.add(check_image(rgb.data(), 32, 32, scene));
    CHECK(t.images == 3);
    CHECK(t.shapes == 6);
    CHECK(t.shapes_right == 2);
    CHECK(t.all_right == 1);
    CHECK(t.kind == 5);
}
