#include <doctest/doctest.h>

#include <set>

#include "launcher/prompt_file.h"

using namespace dp::launcher;

namespace {
std::vector<std::string> prompts_of(const PromptFile& f) {
    std::vector<std::string> out;
    for (const auto& p : f.prompts) out.push_back(p.prompt);
    return out;
}
}  // namespace

TEST_CASE("plain text: BOM, CRLF, trailing white space, blank lines, no final newline") {
    const PromptFile f = parse_prompt_file(
        "\xEF\xBB\xBF"
        "first  \r\n\r\n   \n\tsecond\t\r\nthird",
        "p.txt", false);
    CHECK(prompts_of(f) == std::vector<std::string>{"first", "\tsecond", "third"});
    CHECK(f.total == 3);
    CHECK(f.prompts[1].index == 1);
    CHECK(f.prompts[1].line == 4);
    CHECK(f.prompts[2].line == 5);
    CHECK(f.invalid.empty());
}

TEST_CASE("empty input and only blank lines give nothing to do") {
    CHECK(parse_prompt_file("", "p.txt", false).total == 0);
    CHECK(parse_prompt_file("\n \n\t\r\n", "p.txt", false).total == 0);
    CHECK(parse_prompt_file("\xEF\xBB\xBF", "p.txt", false).total == 0);
}

TEST_CASE("every invalid line is listed with file:line, and keeps its index") {
    std::string text = "good one\n";
    text += std::string("bad\0nul\n", 8);
    text += "bad \xC3\x28 utf8\n";
    text += std::string(1 << 20, 'x') + "\n";  // a 1 MB line
    text += "overlong \xC0\xAF\n";
    text += "surrogate \xED\xA0\x80\n";
    text += "good two \xE2\x9C\x93\n";
    const PromptFile f = parse_prompt_file(text, "p.txt", false);
    REQUIRE(f.invalid.size() == 5);
    CHECK(f.invalid[0].reason == "p.txt:2: contains a NUL byte");
    CHECK(f.invalid[1].reason == "p.txt:3: not valid UTF-8");
    CHECK(f.invalid[2].reason.find("p.txt:4: line is 1048576 bytes; the limit is 16384") == 0);
    CHECK(f.invalid[3].reason == "p.txt:5: not valid UTF-8");
    CHECK(f.invalid[4].reason == "p.txt:6: not valid UTF-8");
    REQUIRE(f.prompts.size() == 2);
    CHECK(f.prompts[1].index == 6);  // indices do not shift past invalid lines
}

TEST_CASE("JSONL: overrides, and each wrong key named with file:line") {
    const std::string text =
        R"({"prompt": "a red circle", "seed": 7, "steps": 3, "guidance_scale": 4.5, "width": 64, "height": 32, "name": "Red/../x", "negative_prompt": "blur"})"
        "\n"
        R"({"prompt": "plain"})"
        "\n"
        R"({"prompt": ""})"
        "\n"
        R"({"prompt": "x", "colour": "red"})"
        "\n"
        R"({"prompt": "x", "steps": 0})"
        "\n"
        R"({"prompt": "x", "seed": -1})"
        "\n"
        R"({"prompt": 5})"
        "\n"
        R"({"negative_prompt": "x"})"
        "\n"
        R"(["prompt"])"
        "\n"
        R"({"prompt": "x", "guidance_scale": "high"})"
        "\n"
        "{not json\n";
    const PromptFile f = parse_prompt_file(text, "p.jsonl", true);
    REQUIRE(f.prompts.size() == 2);
    const PromptRecord& r = f.prompts[0];
    CHECK(r.prompt == "a red circle");
    CHECK(*r.seed == 7);
    CHECK(*r.steps == 3);
    CHECK(*r.guidance_scale == doctest::Approx(4.5));
    CHECK(*r.width == 64);
    CHECK(*r.height == 32);
    CHECK(*r.name == "Red/../x");
    CHECK(*r.negative_prompt == "blur");
    CHECK_FALSE(f.prompts[1].seed.has_value());
    REQUIRE(f.invalid.size() == 9);
    const std::vector<std::string> expected = {
        "p.jsonl:3: key 'prompt': empty",
        "p.jsonl:4: unknown key 'colour'",
        "p.jsonl:5: key 'steps': expected a whole number from 1 to 1000",
        "p.jsonl:6: key 'seed': expected a whole number",
        "p.jsonl:7: key 'prompt': expected a string",
        "p.jsonl:8: missing key 'prompt'",
        "p.jsonl:9: expected a JSON object",
        "p.jsonl:10: key 'guidance_scale': expected a number",
        "p.jsonl:11: not valid JSON",
    };
    for (std::size_t i = 0; i < expected.size(); ++i)
        CHECK_MESSAGE(f.invalid[i].reason.find(expected[i]) == 0, f.invalid[i].reason);
    CHECK(is_jsonl_name("x.JSONL"));
    CHECK_FALSE(is_jsonl_name("x.txt"));
    CHECK_FALSE(is_jsonl_name("-"));
}

TEST_CASE("slugs are path-safe and bounded, whatever the name") {
    CHECK(slugify("A Red Circle, on blue!") == "a-red-circle-on-blue");
    for (const std::string& hostile : std::vector<std::string>{"../../etc/passwd", "/abs/path", "..", ".",
                                                               "a\x01\x02"
                                                               "b",
                                                               "con\\nul", "x/../../y", std::string(500, '/'),
                                                               "\xE2\x9C\x93\xE2\x9C\x93", ""}) {
        CAPTURE(hostile);
        const std::string s = slugify(hostile);
        CHECK(!s.empty());
        CHECK(s.size() <= 48);
        CHECK(s.find('/') == std::string::npos);
        CHECK(s.find("..") == std::string::npos);
        CHECK(s.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") == std::string::npos);
    }
    CHECK(slugify(std::string(300, 'a')).size() == 48);
    CHECK(image_file_name(3, "A cat") == "00003-a-cat.png");
    CHECK(image_file_name(123456, "") == "123456-image.png");
}

TEST_CASE("seeds: --seed plus the index, distinct per prompt") {
    std::set<uint64_t> seeds;
    for (int64_t i = 0; i < 100; ++i) seeds.insert(prompt_seed(42, i));
    CHECK(seeds.size() == 100);
    CHECK(prompt_seed(42, 5) == 47);
    CHECK(prompt_seed(~0ULL, 1) == 0);  // wraps
}
