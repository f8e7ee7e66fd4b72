#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <tuple>

#include "launcher/errors.h"
#include "launcher/prompt_file.h"
#include "unit/test_support.h"

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
    CHECK(r.arguments.number("guidance_scale") == doctest::Approx(4.5));
    CHECK(*r.width == 64);
    CHECK(*r.height == 32);
    CHECK(*r.name == "Red/../x");
    CHECK(*r.negative_prompt == "blur");
    CHECK_FALSE(f.prompts[1].seed.has_value());
    dp::test::check_reasons(
        f.invalid,
        {"p.jsonl:3: key 'prompt': empty", "p.jsonl:4: unknown key 'colour'",
         "p.jsonl:5: key 'steps': expected a whole number from 1 to 1000",
         "p.jsonl:6: key 'seed': expected a whole number", "p.jsonl:7: key 'prompt': expected a string",
         "p.jsonl:8: missing key 'prompt'", "p.jsonl:9: expected a JSON object",
         "p.jsonl:10: key 'guidance_scale': expected a number", "p.jsonl:11: not valid JSON"},
        /*at_start=*/true);
    CHECK(is_jsonl_name("x.JSONL"));
    CHECK_FALSE(is_jsonl_name("x.txt"));
    CHECK_FALSE(is_jsonl_name("-"));
}

TEST_CASE("a mistyped JSONL key is answered with the closest key a line may hold") {
    const std::string text =
        "{\"prompt\": \"x\", \"num_inference_step\": 3}\n"
        "{\"prompt\": \"x\", \"guidance\": 2}\n"
        "{\"prompt\": \"x\", \"negative_promt\": \"y\"}\n"
        "{\"prompt\": \"x\", \"colour\": \"red\"}\n";
    const PromptFile f = parse_prompt_file(text, "p.jsonl", true);
    dp::test::check_reasons(
        f.invalid,
        {"p.jsonl:1: unknown key 'num_inference_step' (did you mean 'num_inference_steps'?) (accepted: ",
         "p.jsonl:2: unknown key 'guidance' (did you mean 'guidance_scale'?) (accepted: ",
         "p.jsonl:3: unknown key 'negative_promt' (did you mean 'negative_prompt'?) (accepted: ",
         "p.jsonl:4: unknown key 'colour' (accepted: "},
        /*at_start=*/true);
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

TEST_CASE("images per prompt: consecutive indexes and seeds per line, the line's own count over the job's") {
    PromptFileReader reader("p.jsonl", PromptFormat::kJsonl, {}, {}, /*images_per_prompt=*/2);
    reader.feed(R"({"prompt": "a", "seed": 40, "num_images_per_prompt": 3})"
                "\n"
                R"({"prompt": "b", "num_images_per_prompt": "two"})"
                "\n"
                R"({"prompt": "c", "num_images_per_prompt": null})"
                "\n"
                R"({"prompt": "d", "num_images_per_prompt": 1})"
                "\n");
    const PromptFile f = reader.finish();
    CHECK(f.total == 4);  // lines
    CHECK(f.valid == 6);  // images: 3 + 2 + 1
    REQUIRE(f.prompts.size() == 6);
    REQUIRE(f.invalid.size() == 1);
    // The invalid line keeps the job's count of indexes (3, 4), so the lines after it do not move.
    CHECK(f.invalid[0].index == 3);
    CHECK(f.invalid[0].reason.find("key 'num_images_per_prompt': expected a whole number from 1 to 1000") !=
          std::string::npos);
    using Image = std::tuple<std::string, int64_t, int, int, std::optional<uint64_t>, int64_t>;
    std::vector<Image> got;
    for (const PromptRecord& p : f.prompts)
        got.emplace_back(p.prompt, p.index, p.image, p.images, p.seed, p.line);
    CHECK(got == std::vector<Image>{{"a", 0, 0, 3, 40, 1},
                                    {"a", 1, 1, 3, 41, 1},
                                    {"a", 2, 2, 3, 42, 1},
                                    {"c", 5, 0, 2, std::nullopt, 3},
                                    {"c", 6, 1, 2, std::nullopt, 3},
                                    {"d", 7, 0, 1, std::nullopt, 4}});
    // Without a seed of its own an image gets the job's seed + its index: consecutive within a line.
    CHECK(prompt_seed(100, 5) + 1 == prompt_seed(100, 6));
    for (const char* bad : {"0", "1001", "-1", "1.5"}) {
        const PromptFile g = parse_prompt_file(
            std::string(R"({"prompt": "a", "num_images_per_prompt": )") + bad + "}", "p.jsonl", true);
        CHECK_MESSAGE(g.invalid.size() == 1, bad);
    }
}

TEST_CASE("--prompt texts are a prompt file of their own, and a text that is not one line is refused") {
    PromptSource source;
    source.texts = {"a red circle", "a blue square"};
    source.images_per_prompt = 2;
    const PromptFile f = read_prompts(source);
    CHECK(prompts_of(f) ==
          std::vector<std::string>{"a red circle", "a red circle", "a blue square", "a blue square"});
    CHECK(f.prompts[3].index == 3);
    CHECK(f.prompts[3].line == 2);
    // A text that looks like JSON is a prompt, not a JSONL record.
    source.texts = {R"({"prompt": "x"})"};
    CHECK(prompts_of(read_prompts(source)).front() == R"({"prompt": "x"})");
    for (const std::string bad : {std::string(""), std::string("  "), std::string("two\nlines"),
                                  std::string("nul\0x", 5), std::string("\xff\xfe")}) {
        source.texts = {"fine", bad};
        CHECK_THROWS_WITH_AS(read_prompts(source), doctest::Contains("--prompt"), UsageError);
    }
}

TEST_CASE("JSONL: a key given twice is an invalid line, not the last one winning") {
    const PromptFile f = parse_prompt_file(R"({"prompt": "a", "seed": 1, "seed": 2})"
                                           "\n"
                                           R"({"prompt": "a", "name": "x", "prompt": "b"})"
                                           "\n"
                                           R"({"prompt": "fine", "nested": {"k": 1, "k": 2}})"
                                           "\n",
                                           "p.jsonl", true);
    CHECK(f.prompts.empty());
    REQUIRE(f.invalid.size() == 3);
    CHECK(f.invalid[0].reason == "p.jsonl:1: key 'seed' is given twice");
    CHECK(f.invalid[1].reason == "p.jsonl:2: key 'prompt' is given twice");
    CHECK(f.invalid[2].reason == "p.jsonl:3: key 'k' is given twice");
}

namespace {
std::string describe(const PromptFile& f) {
    std::string out = std::to_string(f.total) + "\n";
    for (const auto& p : f.prompts)
        out += std::to_string(p.index) + " " + std::to_string(p.line) + " " + p.prompt + "\n";
    for (const auto& bad : f.invalid) out += bad.reason + "\n";
    return out;
}
}  // namespace

TEST_CASE("read as a stream: any split of the input gives the same prompts and invalid lines") {
    std::string text =
        "\xEF\xBB\xBF"
        "first\r\n\n";
    text += std::string(kMaxPromptLineBytes, 'a') + std::string(100000, ' ') + "\n";  // fits once trimmed
    text += std::string(kMaxPromptLineBytes + 1, 'b') + "\t\n";                       // one byte too long
    text += std::string(kMaxPromptLineBytes - 1, 'c') + "\xC3\xA9\n";  // 2 bytes past the limit
    text += std::string(300000, 'd') + " x\n";
    text += std::string("nul\0\n", 5) + "bad \xFF\n   \t\nlast";
    const std::string whole = describe(parse_prompt_file(text, "p.txt", false));
    CHECK(whole.find("p.txt:4: line is 16385 bytes; the limit is 16384") != std::string::npos);
    CHECK(whole.find("p.txt:5: line is 16385 bytes") != std::string::npos);
    CHECK(whole.find("p.txt:6: line is 300002 bytes") != std::string::npos);
    CHECK(whole.find("1 2 first") == std::string::npos);  // the BOM is dropped, the line is 1
    CHECK(whole.find("0 1 first\n1 3 " + std::string(kMaxPromptLineBytes, 'a') + "\n") != std::string::npos);
    std::mt19937 rng(7);
    for (int trial = 0; trial < 20; ++trial) {
        PromptFileReader reader("p.txt", PromptFormat::kText);
        for (std::size_t at = 0; at < text.size();) {
            const std::size_t n = trial == 0 ? 1 : 1 + rng() % 70000;
            reader.feed(std::string_view(text).substr(at, n));
            at += n;
        }
        CHECK(describe(reader.finish()) == whole);
    }
}

TEST_CASE("standard input is JSON Lines when its first non-blank line starts with '{'") {
    for (const auto& [text, jsonl] :
         std::vector<std::pair<std::string, bool>>{{"\n  \r\n  {\"prompt\": \"x\"}\n", true},
                                                   {"\xEF\xBB\xBF{\"prompt\": \"x\"}", true},
                                                   {"a {\"prompt\": \"x\"}\n", false},
                                                   {"\n\nplain\n{\"prompt\": \"x\"}\n", false}}) {
        CAPTURE(text);
        PromptFileReader reader("<stdin>", PromptFormat::kDetect);
        reader.feed(text);
        const PromptFile f = reader.finish();
        REQUIRE(!f.prompts.empty());
        CHECK((f.prompts.front().prompt == "x") == jsonl);
    }
}

TEST_CASE("a file is JSON Lines by its content whatever its name, and .jsonl is always JSON Lines") {
    const std::string jsonl = "\n{\"prompt\": \"x\", \"seed\": 3}\n{\"prompt\": \"y\"}\n";
    // name, content, read as JSON Lines
    const std::vector<std::tuple<std::string, std::string, bool>> rows = {
        {"p.json", jsonl, true},      {"p.ndjson", jsonl, true}, {"p.txt", jsonl, true},
        {"prompts", jsonl, true},     {"P.JSONL", jsonl, true},  {"p.json", "x\ny\n", false},
        {"p.ndjson", "x\ny\n", false}};
    for (const auto& [name, content, is_jsonl] : rows) {
        CAPTURE(name);
        CAPTURE(content);
        const std::string path = "/tmp/dp_format_" + std::to_string(getpid()) + "_" + name;
        { std::ofstream(path, std::ios::binary) << content; }
        const PromptFile f = read_prompt_file(path);
        std::filesystem::remove(path);
        REQUIRE(f.prompts.size() == 2);
        CHECK(f.invalid.empty());
        CHECK(f.prompts[0].prompt == "x");
        CHECK(f.prompts[1].prompt == "y");
        CHECK(f.prompts[0].seed.has_value() == is_jsonl);
    }
    // A .jsonl file holds JSON Lines even when a line is plain text: that line is invalid.
    const std::string path = "/tmp/dp_format_" + std::to_string(getpid()) + ".jsonl";
    { std::ofstream(path, std::ios::binary) << "plain\n"; }
    const PromptFile f = read_prompt_file(path);
    std::filesystem::remove(path);
    CHECK(f.prompts.empty());
    CHECK(f.invalid.size() == 1);
}

TEST_CASE("an endless or huge input stops at the job's limit, holding one line's limit at most") {
    PromptFileReader reader("/dev/zero", PromptFormat::kText);
    const std::string zeros(1 << 20, '\0');
    std::size_t fed = 0;
    try {
        while (fed < (std::size_t{1} << 30)) {
            reader.feed(zeros);
            fed += zeros.size();
        }
        FAIL("no limit");
    } catch (const dp::launcher::InputDataError& e) {
        CHECK(std::string(e.what()).find(
                  "/dev/zero: more than 64 MiB (stopped reading there); one job takes at "
                  "most 64 MiB and 100000 prompt lines") == 0);
    }
    CHECK(fed == kMaxJobPromptBytes);

    // The same from the file itself, and from a FIFO's endless writer.
    CHECK_THROWS_WITH_AS(read_prompt_file("/dev/zero"), doctest::Contains("more than 64 MiB"),
                         dp::launcher::InputDataError);
}

TEST_CASE("one job takes at most kMaxJobPrompts prompt lines, and blank lines do not count") {
    std::string text;
    for (int64_t i = 0; i < kMaxJobPrompts; ++i) text += "a\n\n";
    const PromptFile f = parse_prompt_file(text, "p.txt", false);
    CHECK(f.total == kMaxJobPrompts);
    CHECK_THROWS_WITH_AS(
        parse_prompt_file(text + "one more\n", "p.txt", false),
        "p.txt: more than 100000 prompt lines (stopped reading at line 200001); one job takes at "
        "most 64 MiB and 100000 prompt lines (split the file into several jobs)",
        dp::launcher::InputDataError);
}

TEST_CASE("a prompt file that is a directory or missing cannot be read (66)") {
    const std::string dir = "/tmp/dp_prompt_dir_" + std::to_string(getpid());
    std::filesystem::create_directories(dir);
    for (const std::string& path : {dir, dir + "/missing.txt"}) {
        CAPTURE(path);
        try {
            read_prompt_file(path);
            FAIL("read");
        } catch (const dp::launcher::Error& e) {
            CHECK(e.exit_code() == 66);
            CHECK(std::string(e.what()).find("PROMPTS " + path + ": ") == 0);
        }
    }
    CHECK_THROWS_WITH(read_prompt_file(dir), doctest::Contains(": is a directory, not a prompt file"));
    std::filesystem::remove_all(dir);
}

TEST_CASE("a file name that is not UTF-8 is shown with U+FFFD in messages, and the file is read") {
    CHECK(utf8_for_display("ok \xC3\xA9") == "ok \xC3\xA9");
    CHECK(utf8_for_display("a\xFF\xC0\xAF"
                           "b") ==
          "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
          "b");
    const std::string path = "/tmp/dp_prompt_\xFF_" + std::to_string(getpid()) + ".txt";
    { std::ofstream(path) << "one\n\xFF\n"; }
    const PromptFile f = read_prompt_file(path);
    std::filesystem::remove(path);
    REQUIRE(f.prompts.size() == 1);
    REQUIRE(f.invalid.size() == 1);
    CHECK(is_valid_utf8(f.invalid[0].reason));
    CHECK(f.invalid[0].reason.find(utf8_for_display(path) + ":2: not valid UTF-8") == 0);
}

TEST_CASE(
    "fuzz: 3000 random prompt files, fed in random pieces, parse into valid and invalid lines, or a clean "
    "error") {
    std::mt19937_64 rng(11);
    const std::string pieces[] = {"{",
                                  "}",
                                  "\"prompt\"",
                                  ":",
                                  "\"",
                                  ",",
                                  "\"seed\": ",
                                  "1e309",
                                  "-1",
                                  "\n",
                                  "\r\n",
                                  "\"steps\": 4",
                                  "\"width\": 33",
                                  "[",
                                  "]",
                                  "null",
                                  "true",
                                  "\xef\xbb\xbf",
                                  "\xff",
                                  "\"name\": \"../../x\"",
                                  "  ",
                                  "a red circle",
                                  "\\u0000",
                                  "\"prompt\": \"p\""};
    for (int i = 0; i < 3000; ++i) {
        std::string text;
        for (int n = static_cast<int>(rng() % 60); n > 0; --n)
            text += rng() % 4 == 0 ? std::string(1, static_cast<char>(rng() % 256))
                                   : pieces[rng() % std::size(pieces)];
        const PromptFormat format = rng() % 2 ? PromptFormat::kJsonl : PromptFormat::kText;
        try {
            PromptFileReader reader("fuzz.jsonl", format);
            for (std::size_t at = 0; at < text.size();) {
                const std::size_t n = 1 + rng() % 17;
                reader.feed(std::string_view(text).substr(at, n));
                at += n;
            }
            const PromptFile f = reader.finish();
            REQUIRE(static_cast<int64_t>(f.prompts.size() + f.invalid.size()) == f.total);
            for (const PromptRecord& p : f.prompts) {
                REQUIRE((p.index >= 0 && p.index < f.total));
                REQUIRE(is_valid_utf8(p.prompt));
            }
            for (const InvalidPrompt& bad : f.invalid) REQUIRE(is_valid_utf8(bad.reason));
        } catch (const dp::protocol::Error&) {
            // ours, with a message (a limit passed): never a crash or a foreign exception
        } catch (const std::exception& e) {
            FAIL_CHECK("case " << i << " escaped as " << e.what());
        }
    }
}

TEST_CASE("with a sink, each valid record goes there as it is read and none is held") {
    const std::string text = "first\n\n{bad\nsecond\n\xFF\nthird";
    std::vector<std::pair<int64_t, std::string>> seen;
    PromptFileReader reader("p.txt", PromptFormat::kText, {},
                            [&](PromptRecord&& p) { seen.emplace_back(p.index, std::move(p.prompt)); });
    reader.feed(text);
    const PromptFile f = reader.finish();
    CHECK(f.prompts.empty());
    CHECK(f.valid == 4);
    CHECK(f.total == 5);
    REQUIRE(f.invalid.size() == 1);
    CHECK(f.invalid[0].index == 3);
    CHECK(seen == std::vector<std::pair<int64_t, std::string>>{
                      {0, "first"}, {1, "{bad"}, {2, "second"}, {4, "third"}});
    // Without one, the same records are in `prompts`.
    const PromptFile held = parse_prompt_file(text, "p.txt", false);
    CHECK(held.valid == 4);
    CHECK(held.prompts.size() == 4);
}

TEST_CASE(
    "what dp-launch prints of a file's text cannot drive the terminal: control characters are escaped") {
    using dp::launcher::terminal_safe;
    CHECK(terminal_safe("key '\x1b]0;title\x07'") == "key '\\x1b]0;title\\x07'");
    CHECK(terminal_safe("\x1b[2Jclear") == "\\x1b[2Jclear");
    CHECK(terminal_safe("a\x7f"
                        "b") == "a\\x7fb");
    CHECK(terminal_safe("c1 \xc2\x9b"
                        "31m") == "c1 \\u009b31m");  // the 8-bit CSI
    CHECK(terminal_safe("two\nlines\tand a tab, caf\xc3\xa9") == "two\nlines\tand a tab, caf\xc3\xa9");
    CHECK(terminal_safe("bad \xff byte") == "bad \xEF\xBF\xBD byte");
    CHECK(terminal_safe(std::string("nul\0here", 8)) == "nul\\x00here");
}
