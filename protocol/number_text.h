#pragma once
// How protocol's messages write a number: up to 10 significant digits, no trailing zeros ("0.01",
// "7.5", "100000"). std only.

#include <cstdio>
#include <string>

namespace dp::protocol {

inline std::string number_text(double v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.10g", v);
    return buf;
}

}  // namespace dp::protocol
