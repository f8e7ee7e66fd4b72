#pragma once
// Small helpers the launcher side's unit tests share (no LibTorch).

#include <string>

namespace dp::test {

// Whether `text` contains `part`: what a message is checked for.
inline bool has(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

}  // namespace dp::test
