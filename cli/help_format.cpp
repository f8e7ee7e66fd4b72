#include "cli/help_format.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>

namespace dp::cli {
namespace {

// The first `n` code points of `word`, and the rest after them.
std::pair<std::string, std::string> split_at(const std::string& word, std::size_t n) {
    std::size_t i = 0;
    for (std::size_t points = 0; i < word.size(); ++i) {
        if ((static_cast<unsigned char>(word[i]) & 0xC0) == 0x80) continue;
        if (points++ == n) break;
    }
    return {word.substr(0, i), word.substr(i)};
}

// One paragraph (no '\n') of wrap_text into `out`.
void wrap_paragraph(const std::string& text, std::size_t width, std::size_t first_indent, std::size_t indent,
                    std::string& out) {
    std::string line(first_indent, ' ');
    std::size_t used = first_indent;
    bool empty = true;
    const auto flush = [&] {
        out += empty ? std::string() : line;
        out += '\n';
        line.assign(indent, ' ');
        used = indent;
        empty = true;
    };
    bool any = false;
    std::istringstream words(text);
    for (std::string word; words >> word;) {
        any = true;
        std::size_t w = display_width(word);
        while (true) {
            const std::size_t gap = empty ? 0 : 1;
            if (used + gap + w <= width) {
                line += (empty ? "" : " ") + word;
                used += gap + w;
                empty = false;
                break;
            }
            if (!empty) {
                flush();
                continue;
            }
            // Longer than a whole line: cut it.
            const std::size_t room = width > used ? width - used : 1;
            auto [head, rest] = split_at(word, room);
            line += head;
            empty = false;
            flush();
            word = rest;
            w -= std::min(w, room);
            if (word.empty()) break;
        }
    }
    if (!empty) flush();
    if (!any) out += '\n';  // a blank line stays one
}

// The heading of a section, wrapped.
std::string heading(const std::string& text, std::size_t width) {
    return "\n" + wrap_text(text + ":", width, 0, 2);
}

}  // namespace

std::size_t help_width(const EnvLookup& env) {
    std::size_t width = 0;
    if (const char* columns = env("COLUMNS");
        columns && *columns && std::string(columns).size() < 6 &&
        std::string(columns).find_first_not_of("0123456789") == std::string::npos)
        width = std::stoul(columns);
    winsize size{};
    if (width == 0 && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0) width = size.ws_col;
    if (width == 0) width = 80;
    return std::clamp(width, kMinHelpWidth, kMaxHelpWidth);
}

std::size_t display_width(const std::string& text) {
    return static_cast<std::size_t>(std::count_if(
        text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

std::string wrap_text(const std::string& text, std::size_t width, std::size_t first_indent,
                      std::size_t indent) {
    // Every line holds at least half a line of text, however deep the indent.
    const std::size_t deepest = width / 2;
    first_indent = std::min(first_indent, deepest);
    indent = std::min(indent, deepest);
    std::string out;
    std::istringstream paragraphs(text);
    bool first = true;
    for (std::string paragraph; std::getline(paragraphs, paragraph);) {
        wrap_paragraph(paragraph, width, first ? first_indent : indent, indent, out);
        first = false;
    }
    if (first) out += '\n';  // no text: one empty line
    return out;
}

std::string two_columns(const std::vector<std::pair<std::string, std::string>>& rows, std::size_t width,
                        const TwoColumns& layout) {
    std::string out;
    for (const auto& [term, text] : rows) {
        const std::size_t term_width = layout.indent + display_width(term);
        if (term_width + 2 <= layout.column && layout.column + 8 <= width) {
            std::string body = text.empty() ? "\n" : wrap_text(text, width, layout.column, layout.column);
            const std::string head = std::string(layout.indent, ' ') + term;
            out += text.empty()
                       ? head + "\n"
                       : head + std::string(layout.column - term_width, ' ') + body.substr(layout.column);
            continue;
        }
        // The term on lines of its own, cut at its spaces, then the text below it.
        const std::size_t mark = display_width(layout.continuation);
        std::istringstream lines(
            wrap_text(term, width > mark ? width - mark : width, layout.indent, layout.indent + 4));
        std::vector<std::string> term_lines;
        for (std::string line; std::getline(lines, line);) term_lines.push_back(line);
        for (std::size_t i = 0; i < term_lines.size(); ++i)
            out += term_lines[i] + (i + 1 < term_lines.size() ? layout.continuation : "") + "\n";
        const std::size_t below =
            layout.column > layout.indent && layout.column <= width / 3 ? layout.column : layout.indent + 4;
        if (!text.empty()) out += wrap_text(text, width, below, below);
    }
    return out;
}

const HelpPage& HelpFormatter::page(const CLI::App* app) const {
    static const HelpPage none;
    const auto it = pages_.find(app->get_name());
    return it == pages_.end() ? none : it->second;
}

std::size_t HelpFormatter::option_column() const { return std::clamp<std::size_t>(width_ * 3 / 10, 12, 30); }

std::string HelpFormatter::make_option_name(const CLI::Option* opt, bool is_positional) const {
    if (is_positional) return opt->get_name(true, false);
    std::string out;
    for (const std::string& s : opt->get_snames()) out += (out.empty() ? "-" : ", -") + s;
    const std::vector<std::string>& longs = opt->get_lnames();
    for (const std::string& l : longs) {
        // accelerate's spelling is listed when no '-' twin is: every --a-b is also --a_b.
        std::string dashed = l;
        std::replace(dashed.begin(), dashed.end(), '_', '-');
        if (dashed != l && std::find(longs.begin(), longs.end(), dashed) != longs.end()) continue;
        out += (out.empty() ? "--" : ", --") + l;
    }
    return out;
}

std::string HelpFormatter::make_option(const CLI::Option* opt, bool is_positional) const {
    const std::string term =
        make_option_name(opt, is_positional) + (is_positional ? "" : make_option_opts(opt));
    TwoColumns layout;
    layout.column = option_column();
    return two_columns({{term, opt->get_description()}}, width_, layout);
}

std::string HelpFormatter::make_description(const CLI::App* app) const {
    return app->get_description().empty() ? "" : wrap_text(app->get_description(), width_, 0, 0);
}

std::string HelpFormatter::make_usage(const CLI::App* app, std::string name) const {
    std::vector<std::string> forms = page(app).usage;
    if (forms.empty())
        forms.push_back((app->get_parent() ? app->get_parent()->get_name() + " " : "") +
                        (name.empty() ? app->get_name() : name) + " [OPTIONS]");
    std::string out = "\n";
    for (std::size_t i = 0; i < forms.size(); ++i)
        out += wrap_text((i == 0 ? "Usage: " : "") + forms[i], width_, i == 0 ? 0 : 7, 11);
    return out;
}

std::vector<std::string> HelpFormatter::headings(const CLI::App* app) const {
    std::vector<std::string> found;
    for (const CLI::Option* opt : app->get_options())
        if (!opt->get_group().empty() &&
            std::find(found.begin(), found.end(), opt->get_group()) == found.end())
            found.push_back(opt->get_group());
    const auto rank = [&](const std::string& h) {
        const auto at = std::find(order_.begin(), order_.end(), h);
        return at != order_.end() ? static_cast<std::size_t>(at - order_.begin())
               : h == "Options"   ? order_.size() + 1
                                  : order_.size();
    };
    std::stable_sort(found.begin(), found.end(),
                     [&](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
    return found;
}

std::string HelpFormatter::group_of(const CLI::App* app, const std::string& title) const {
    std::string out;
    for (const CLI::Option* opt :
         app->get_options([&](const CLI::Option* o) { return o->get_group() == title; }))
        out += make_option(opt, opt->get_positional());
    return out.empty() ? "" : heading(title, width_) + out;
}

std::string HelpFormatter::make_subcommands(const CLI::App* app, CLI::AppFormatMode) const {
    std::vector<std::pair<std::string, std::string>> rows;
    std::size_t longest = 0;
    for (const CLI::App* sub : app->get_subcommands({})) {
        if (sub->get_group().empty()) continue;  // not for users (serve's warm-ranks)
        rows.emplace_back(sub->get_name(), sub->get_description());
        longest = std::max(longest, display_width(sub->get_name()));
    }
    if (rows.empty()) return "";
    TwoColumns layout;
    layout.column = layout.indent + longest + 2;
    return heading("Subcommands (each with its own --help)", width_) + two_columns(rows, width_, layout);
}

std::string HelpFormatter::make_footer(const CLI::App* app) const {
    const HelpPage& p = page(app);
    std::string out;
    if (!p.examples.empty()) {
        // Side by side when every command leaves its text 30 columns, else each command above its text.
        TwoColumns layout;
        std::size_t longest = 0;
        for (const auto& e : p.examples) longest = std::max(longest, display_width(e.first));
        layout.column = longest + 36 <= width_ ? longest + 4 : 0;
        layout.continuation = " \\";
        out += heading("Examples", width_) + two_columns(p.examples, width_, layout);
    }
    for (const std::string& note : p.notes) out += "\n" + wrap_text(note, width_, 0, 0);
    if (!p.codes.empty()) {
        TwoColumns layout;
        layout.column = 9;
        out += heading("Exit codes (docs/launcher.md)", width_) + two_columns(p.codes, width_, layout);
    }
    return out;
}

std::string HelpFormatter::make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const {
    std::string out = make_description(app) + make_usage(app, name);
    for (const std::string& h : headings(app)) out += group_of(app, h);
    if (app->get_parent())
        for (const std::string& h : page(app).parent_groups) out += group_of(app->get_parent(), h);
    return out + make_subcommands(app, mode) + make_footer(app);
}

}  // namespace dp::cli
