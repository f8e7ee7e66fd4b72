#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "launcher/line_splitter.h"

using dp::launcher::LineSplitter;

namespace {
std::vector<std::string> split_all(LineSplitter& s, const std::vector<std::string>& chunks,
                                   bool finish = true) {
    std::vector<std::string> lines;
    auto sink = [&](std::string_view line) { lines.emplace_back(line); };
    for (const auto& c : chunks) s.feed(c, sink);
    if (finish) s.finish(sink);
    return lines;
}
}  // namespace

TEST_CASE("whole lines come out whole, however the bytes arrive") {
    LineSplitter s;
    auto lines = split_all(s, {"hel", "lo\nwor", "ld\n", "\n", "last"});
    CHECK(lines == std::vector<std::string>{"hello", "world", "", "last"});
}

TEST_CASE("byte-at-a-time feeding gives the same lines") {
    const std::string text = "alpha\nbeta gamma\n\ndelta";
    LineSplitter s;
    std::vector<std::string> chunks;
    for (char c : text) chunks.emplace_back(1, c);
    CHECK(split_all(s, chunks) == std::vector<std::string>{"alpha", "beta gamma", "", "delta"});
}

TEST_CASE("finish on a stream ending in a newline adds nothing") {
    LineSplitter s;
    CHECK(split_all(s, {"a\nb\n"}) == std::vector<std::string>{"a", "b"});
    CHECK(s.pending_bytes() == 0);
}

TEST_CASE("an over-long line is cut into bounded pieces and memory stays bounded") {
    LineSplitter s(8);
    std::vector<std::string> lines;
    auto sink = [&](std::string_view line) { lines.emplace_back(line); };
    for (int i = 0; i < 1000; ++i) {
        s.feed("xyz", sink);
        CHECK(s.pending_bytes() <= 8);
    }
    s.finish(sink);
    std::string joined;
    for (const auto& l : lines) {
        CHECK(l.size() <= 8);
        joined += l;
    }
    CHECK(joined.size() == 3000);
    CHECK(lines.size() == 375);
}

TEST_CASE("a line of exactly the limit followed by a newline is one line") {
    LineSplitter s(4);
    CHECK(split_all(s, {"abcd\nef\n"}) == std::vector<std::string>{"abcd", "ef"});
    LineSplitter t(4);
    CHECK(split_all(t, {"ab", "cd", "\n"}) == std::vector<std::string>{"abcd"});
}

TEST_CASE("bytes are passed through untouched, NULs and carriage returns included") {
    LineSplitter s;
    std::string with_nul("a\0b\r", 4);
    auto lines = split_all(s, {with_nul + "\n"});
    REQUIRE(lines.size() == 1);
    CHECK(lines[0] == with_nul);
}
