#pragma once
// Small helpers the launcher side's unit tests share (no LibTorch).

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace dp::test {

// Whether `text` contains `part`: what a message is checked for.
inline bool has(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

// The reasons of a prompt file's refused lines, in order: as many as `expected`, each containing its
// text (with `at_start`, beginning with it).
template <class Refused>
void check_reasons(const std::vector<Refused>& refused, const std::vector<std::string>& expected,
                   bool at_start = false) {
    REQUIRE(refused.size() == expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
        const std::string& reason = refused[i].reason;
        CHECK_MESSAGE((at_start ? reason.rfind(expected[i], 0) == 0 : has(reason, expected[i])), reason);
    }
}

}  // namespace dp::test
