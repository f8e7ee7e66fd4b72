#include "protocol/strict_json.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

namespace dp::protocol {
namespace {

// Thrown by parse_strict_json's callback to stop the parser at the first problem.
struct StrictJsonStop {
    std::string why;
};

// Printable in one line: control characters and bytes that are not ASCII shown as '?'.
std::string printable(std::string_view text, std::size_t limit = 60) {
    std::string out;
    for (char c : text.substr(0, limit)) {
        const auto u = static_cast<unsigned char>(c);
        out += (u < 0x20 || u >= 0x7F) ? '?' : c;
    }
    return text.size() > limit ? out + "..." : out;
}

}  // namespace

std::string parse_strict_json(std::string_view text, nlohmann::json& out) {
    using Event = nlohmann::json::parse_event_t;
    std::vector<std::set<std::string>> keys;  // the keys seen so far in each open object
    try {
        out = nlohmann::json::parse(
            text.begin(), text.end(), [&](int depth, Event event, nlohmann::json& parsed) {
                if ((event == Event::object_start || event == Event::array_start) && depth >= kMaxJsonDepth)
                    throw StrictJsonStop{"nested deeper than " + std::to_string(kMaxJsonDepth) + " levels"};
                if (event == Event::object_start) keys.emplace_back();
                if (event == Event::object_end && !keys.empty()) keys.pop_back();
                if (event == Event::key && !keys.empty() &&
                    !keys.back().insert(parsed.get<std::string>()).second)
                    throw StrictJsonStop{"key '" + printable(parsed.get<std::string>()) + "' is given twice"};
                return true;
            });
    } catch (const StrictJsonStop& stop) {
        out = nullptr;
        return stop.why;
    } catch (const nlohmann::json::exception& e) {
        // "[json.exception.parse_error.101] parse error at line 1, column 5: ..." without the tag.
        std::string why = e.what();
        if (const auto pos = why.find("] "); pos != std::string::npos) why = why.substr(pos + 2);
        out = nullptr;
        return "not valid JSON: " + printable(why, 200);
    } catch (const std::exception& e) {  // std::bad_alloc
        out = nullptr;
        return std::string("cannot be read: ") + e.what();
    }
    return {};
}

bool names_a_json_file(std::string_view text) {
    return text.find('/') != std::string_view::npos ||
           (text.size() > 5 && text.substr(text.size() - 5) == ".json");
}

std::string read_small_file(const std::string& path, const std::string& what, std::string& text) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return "cannot read the " + what + " " + path.substr(0, 200);
    std::ostringstream s;
    s << in.rdbuf();
    text = s.str();
    if (text.size() > (1 << 20)) return path + ": a " + what + " is at most 1 MiB";
    return {};
}

}  // namespace dp::protocol
