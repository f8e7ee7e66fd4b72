#pragma once
// Small string tests the strategies' readers share (tensor names, file names). std only.

#include <string_view>

namespace dp::strategies {

inline bool starts_with(std::string_view s, std::string_view head) {
    return s.substr(0, head.size()) == head;
}
inline bool ends_with(std::string_view s, std::string_view tail) {
    return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

}  // namespace dp::strategies
