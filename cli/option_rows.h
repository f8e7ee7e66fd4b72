#pragma once
// The builders of the option tables' rows (cli/launch_options.h), one for each kind of value, each
// binding a row to its field: shared by the launch table (cli/launch_options.cpp) and the
// pipeline's job table (cli/job_options.cpp).

#include <cctype>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cli/launch_options.h"
#include "cli/option_groups.h"
#include "launcher/errors.h"
#include "launcher/values.h"

namespace dp::cli::rows {

using launcher::UsageError;

// Config keys are accepted in any of the option's long spellings, with dashes or underscores.
inline std::string normalize_key(std::string key) {
    for (char& c : key)
        if (c == '-') c = '_';
    return key;
}

inline void name_option(OptionDef& def, const char* flags, const char* value_name, OptionKind kind,
                        const char* help) {
    def.flags = flags;
    const std::size_t start = def.flags.find("--");
    def.long_flag = def.flags.substr(start, def.flags.find(',', start) - start);
    def.key = normalize_key(def.long_flag.substr(2));
    def.env = "DP_";
    for (char c : def.key) def.env += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    def.value_name = value_name;
    def.kind = kind;
    def.help = help;
}

template <class T>
using Setter = decltype(OptionRow<T>::set);
template <class T>
using Getter = decltype(OptionRow<T>::get);

// The rows' builders, one for each kind, each binding the row to its field.

template <class T>
OptionRow<T> row(const char* flags, const char* value_name, OptionKind kind, const char* help, Setter<T> set,
                 Getter<T> get) {
    OptionRow<T> r;
    name_option(r, flags, value_name, kind, help);
    r.set = std::move(set);
    r.get = std::move(get);
    return r;
}

// The text of a field's value: empty for an unset optional.
template <class V, class Text>
std::string value_text(const V& v, Text text) {
    if constexpr (std::is_arithmetic_v<V>) {
        return text(v);
    } else {
        return v ? text(*v) : std::string();
    }
}

// An int, or a std::optional<int> that is unset by default (the model family's default).
template <class T, class Field>
OptionRow<T> whole(const char* flags, const char* value_name, Field T::*field, int lo, int hi,
                   const char* help) {
    OptionRow<T> r = row<T>(
        flags, value_name, OptionKind::kInt, help,
        [=](T& t, const std::string& text, const std::string& source) {
            t.*field = launcher::parse_int(text, lo, hi, source);
        },
        [=](const T& t) { return value_text(t.*field, [](int v) { return std::to_string(v); }); });
    r.lo = lo;
    r.hi = hi;
    return r;
}

// A double, or a std::optional<double> that is unset by default.
template <class T, class Field>
OptionRow<T> number(const char* flags, const char* value_name, Field T::*field, double lo, double hi,
                    const char* unit, const char* help) {
    OptionRow<T> r = row<T>(
        flags, value_name, OptionKind::kNumber, help,
        [=](T& t, const std::string& text, const std::string& source) {
            t.*field = launcher::parse_number(text, lo, hi, source, unit);
        },
        [=](const T& t) { return value_text(t.*field, [](double v) { return launcher::number_text(v); }); });
    r.lo = lo;
    r.hi = hi;
    r.unit = unit;
    return r;
}

// A uint64_t, or a std::optional<uint64_t> that is unset by default: a field of T or of a base of
// T (`Owner`, as launcher::JobOptions' protocol::ModelLoad).
template <class T, class Field, class Owner>
OptionRow<T> u64(const char* flags, const char* value_name, Field Owner::*field, const char* help) {
    return row<T>(
        flags, value_name, OptionKind::kU64, help,
        [=](T& t, const std::string& text, const std::string& source) {
            t.*field = launcher::parse_u64(text, source);
        },
        [=](const T& t) -> std::string {
            if constexpr (std::is_same_v<Field, uint64_t>) {
                return std::to_string(t.*field);
            } else {
                return t.*field ? std::to_string(*(t.*field)) : "";
            }
        });
}

// `inverted`: the switch turns the field off (--no-prefix and prefix_output).
template <class T>
OptionRow<T> on_off(const char* flags, bool T::*field, const char* help, bool inverted = false) {
    return row<T>(
        flags, "", OptionKind::kSwitch, help,
        [=](T& t, const std::string& text, const std::string& source) {
            t.*field = launcher::parse_bool(text, source) != inverted;
        },
        [=](const T& t) { return (t.*field != inverted) ? "on" : "off"; });
}

// `as_empty`: that choice is kept as the empty text, the field's default (JobOptions::strategy's "data").
template <class T>
OptionRow<T> choice(const char* flags, std::string T::*field, std::vector<std::string> choices,
                    const char* help, const std::string& as_empty = "") {
    OptionRow<T> r = row<T>(
        flags, "", OptionKind::kChoice, help,
        [=](T& t, const std::string& text, const std::string& source) {
            const std::string value = launcher::parse_choice(text, choices, source);
            t.*field = value == as_empty ? "" : value;
        },
        [=](const T& t) { return (t.*field).empty() ? as_empty : t.*field; });
    for (const std::string& c : choices) r.value_name += (r.value_name.empty() ? "" : "|") + c;
    r.choices = std::move(choices);
    return r;
}

// `expected` ("a directory path"): refuses an empty text, or one with a NUL, saying it expects that.
template <class T>
OptionRow<T> text(const char* flags, const char* value_name, std::string T::*field, const char* help,
                  const char* expected = nullptr) {
    return row<T>(
        flags, value_name, OptionKind::kText, help,
        [=](T& t, const std::string& text, const std::string& source) {
            if (expected && (text.empty() || text.find('\0') != std::string::npos))
                throw UsageError(source + ": expected " + std::string(expected));
            t.*field = text;
        },
        [=](const T& t) { return t.*field; });
}

// The same row, read by `set` (which still honours the row's range).
template <class T>
OptionRow<T> read_by(OptionRow<T> r, Setter<T> set) {
    r.set = std::move(set);
    return r;
}

// The same row, read by `set` and shown by `get`: a spelling that sets another row's field its own way.
template <class T>
OptionRow<T> bound(OptionRow<T> r, Setter<T> set, Getter<T> get) {
    r.set = std::move(set);
    r.get = std::move(get);
    return r;
}

// The row's default, when nothing sets the option: `value`, parsed as if given.
template <class T>
OptionRow<T> applied(OptionRow<T> r, const char* value) {
    r.default_kind = DefaultKind::kApplied;
    r.default_text = value;
    return r;
}

// The row's field's default means `meaning`, which is not a value of the option.
template <class T>
OptionRow<T> described(OptionRow<T> r, const char* meaning) {
    r.default_kind = DefaultKind::kDescribed;
    r.default_text = meaning;
    return r;
}

// Puts each row under its heading of --help (cli/option_groups.h; `group` when none holds it) and
// renders the defaults read from a default-constructed target.
template <class T>
std::vector<OptionRow<T>> finish(std::vector<OptionRow<T>> table, const char* group) {
    for (OptionRow<T>& r : table) {
        r.group = option_group(r.key, group);
        if (r.default_kind == DefaultKind::kTarget) r.default_text = r.get(T{});
    }
    return table;
}

}  // namespace dp::cli::rows
