#pragma once
// The table-driven tests' loop (tests/unit/test_family_*.cpp, tests/integration/test_family_strategies.cpp):
// `check` on each row of a table that `has` holds for (a predicate, or a field that is set: a list
// or text not empty, JSON not null, a number not 0, a pointer not null), with the row's name
// captured for every assertion it makes. DP_TEST_ROWS=TEXT keeps the rows whose name holds TEXT
// (to run one family's rows while working on it; several: A,B), DP_TEST_ROWS=!TEXT the others
// (ctest runs a long table in parts so). Include it after doctest (doctest_torch.h in the LibTorch tests).

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace dp::test {

template <class T>
bool is_set(const std::vector<T>& v) {
    return !v.empty();
}
inline bool is_set(const std::string& s) { return !s.empty(); }
inline bool is_set(const nlohmann::json& j) { return !j.is_null(); }
template <class T>
bool is_set(const std::optional<T>& v) {
    return v.has_value();
}
template <class T>
bool is_set(T* p) {
    return p != nullptr;
}
template <class T, class = std::enable_if_t<std::is_arithmetic_v<T>>>
bool is_set(T v) {
    return v != 0;
}

// Whether DP_TEST_ROWS keeps a row named `name`: TEXT[,TEXT...] the rows whose name holds one of
// them, !TEXT[,TEXT...] the rows whose name holds none; unset or empty, every row.
inline bool row_selected(const std::string& name) {
    const char* env = std::getenv("DP_TEST_ROWS");
    const std::string only = env ? env : "";
    if (only.empty()) return true;
    const bool except = only[0] == '!';
    const std::string list = except ? only.substr(1) : only;
    bool named = false;
    for (std::size_t start = 0; start <= list.size();) {
        const std::size_t comma = std::min(list.find(',', start), list.size());
        const std::string text = list.substr(start, comma - start);
        named = named || (!text.empty() && name.find(text) != std::string::npos);
        start = comma + 1;
    }
    return named != except;
}

template <class Row, class Has, class Check>
void for_rows(const std::vector<Row>& rows, Has has, Check check) {
    for (const Row& row : rows) {
        if (!row_selected(std::string(row.name))) continue;
        if constexpr (std::is_member_object_pointer_v<Has>) {
            if (!is_set(row.*has)) continue;
        } else if (!has(row)) {
            continue;
        }
        CAPTURE(row.name);
        check(row);
    }
}

// Every row.
template <class Row>
bool every(const Row&) {
    return true;
}

}  // namespace dp::test
