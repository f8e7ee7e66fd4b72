#include "launcher/spelling.h"

#include <algorithm>
#include <cctype>

namespace dp::launcher {
namespace {

char folded(char c) {
    return c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
}

std::string fold(std::string_view s) {
    std::string out(s);
    std::transform(out.begin(), out.end(), out.begin(), folded);
    return out;
}

// Names longer than this are never close: the distance's table stays small.
constexpr std::size_t kMaxLength = 200;

}  // namespace

std::size_t spelling_distance(std::string_view a_text, std::string_view b_text) {
    const std::string a = fold(a_text.substr(0, kMaxLength)), b = fold(b_text.substr(0, kMaxLength));
    // Three rows of the table: two back for a swap of neighbours, the previous, the current.
    std::vector<std::size_t> before(b.size() + 1), previous(b.size() + 1), current(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) previous[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
        current[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
            const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                current[j] = std::min(current[j], before[j - 2] + 1);
        }
        before.swap(previous);
        previous.swap(current);
    }
    return previous[b.size()];
}

std::vector<std::string> closest_names(std::string_view given, const std::vector<std::string>& known) {
    if (given.empty() || given.size() > kMaxLength) return {};
    if (std::find(known.begin(), known.end(), given) != known.end()) return {};
    const std::string wanted = fold(given);
    const std::size_t allowed = std::clamp<std::size_t>(given.size() / 3, 1, 3);
    std::size_t best = allowed;
    std::vector<std::string> out;
    const auto add = [&](const std::string& name) {
        // One spelling of each name: the one that separates its words as `given` does.
        for (std::string& chosen : out) {
            if (fold(chosen) != fold(name)) continue;
            if (given.find('_') != std::string_view::npos && name.find('_') != std::string::npos)
                chosen = name;
            return;
        }
        out.push_back(name);
    };
    for (const std::string& name : known) {
        const std::size_t d = spelling_distance(given, name);
        if (d > best) continue;
        if (d < best) out.clear();
        best = d;
        add(name);
    }
    if (!out.empty() || given.size() < 4) return out;
    for (const std::string& name : known)
        if (name.size() > given.size() && fold(name).compare(0, wanted.size(), wanted) == 0) add(name);
    return out;
}

std::string did_you_mean(std::string_view given, const std::vector<std::string>& known,
                         const std::string& quote) {
    std::vector<std::string> names = closest_names(given, known);
    if (names.empty()) return "";
    if (names.size() > 3) names.resize(3);
    std::string out = " (did you mean ";
    for (std::size_t i = 0; i < names.size(); ++i)
        out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + quote + names[i] + quote;
    return out + "?)";
}

}  // namespace dp::launcher
