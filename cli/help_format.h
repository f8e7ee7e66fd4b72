#pragma once
// --help as torchrun's and accelerate's read: wrapped to the terminal's width with hanging indents,
// the options under the headings of cli/option_groups.h, each subcommand with its own usage and
// options and without the launcher's examples. A CLI11 formatter: it renders, never prints.

#include <CLI/CLI.hpp>
#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cli/launch_options.h"

namespace dp::cli {

inline constexpr std::size_t kMinHelpWidth = 30;
inline constexpr std::size_t kMaxHelpWidth = 120;  // longer lines are hard to read

// The columns --help is wrapped to: $COLUMNS when it is a whole number, else the width of the
// terminal on stdout (TIOCGWINSZ), else 80 (not a terminal); kept from kMinHelpWidth to
// kMaxHelpWidth.
std::size_t help_width(const EnvLookup& env);

// The characters `text` takes on a terminal: its UTF-8 code points.
std::size_t display_width(const std::string& text);

// `text` wrapped to `width` columns: each line starts with `indent` spaces (the first with
// `first_indent`), words move whole to the next line, a word longer than a line is cut, and '\n'
// starts a new line. Every line ends with '\n'.
std::string wrap_text(const std::string& text, std::size_t width, std::size_t first_indent,
                      std::size_t indent);

// Two columns: each term from `indent`, its text from `column` on the same line when the term
// leaves room, else on the lines below it. A term wider than a line is wrapped at its spaces,
// `continuation` (" \\" for a shell command) ending each of its lines but the last.
struct TwoColumns {
    std::size_t indent = 2;
    std::size_t column = 24;
    std::string continuation;
};
std::string two_columns(const std::vector<std::pair<std::string, std::string>>& rows, std::size_t width,
                        const TwoColumns& layout);

// What a page of help shows besides the app's own options.
struct HelpPage {
    std::vector<std::string> usage;          // "dp-launch plan [OPTIONS] [PROMPTS]", one per form
    std::vector<std::string> parent_groups;  // headings of the parent's options this subcommand takes
    std::vector<std::pair<std::string, std::string>> examples;  // a command, and what it does
    std::vector<std::string> notes;                             // paragraphs after the examples
    std::vector<std::pair<std::string, std::string>> codes;     // exit codes, and what each means
};

class HelpFormatter : public CLI::Formatter {
  public:
    // `order`: the option headings, in the order they are shown; others follow.
    HelpFormatter(std::size_t width, std::vector<std::string> order)
        : width_(width), order_(std::move(order)) {}

    // The page of the app or subcommand named `name` ("dp-launch", "plan").
    void set_page(const std::string& name, HelpPage page) { pages_[name] = std::move(page); }

    std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override;
    std::string make_usage(const CLI::App* app, std::string name) const override;
    std::string make_description(const CLI::App* app) const override;
    std::string make_option(const CLI::Option* opt, bool is_positional) const override;
    std::string make_option_name(const CLI::Option* opt, bool is_positional) const override;
    std::string make_subcommands(const CLI::App* app, CLI::AppFormatMode mode) const override;
    std::string make_footer(const CLI::App* app) const override;

  private:
    // `app`'s options under `heading`, or none.
    std::string group_of(const CLI::App* app, const std::string& heading) const;
    std::vector<std::string> headings(const CLI::App* app) const;
    const HelpPage& page(const CLI::App* app) const;
    std::size_t option_column() const;

    std::size_t width_;
    std::vector<std::string> order_;
    std::map<std::string, HelpPage> pages_;
};

}  // namespace dp::cli
