#include "protocol/json_fields.h"

#include "protocol/errors.h"

namespace dp::protocol::detail {

namespace {

// A value as it appears in the file, cut short, for a message.
std::string shown(const nlohmann::json& v) {
    std::string text = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return text.size() > 40 ? text.substr(0, 37) + "..." : text;
}

}  // namespace

Fields::Fields(const nlohmann::json& j, std::string path) : j_(j), path_(std::move(path)) {
    if (!j_.is_object())
        throw InputDataError((path_.empty() ? std::string("the file") : path_) +
                             ": expected a JSON object, got " + shown(j_));
}

std::string Fields::path(const char* key) const { return path_.empty() ? key : path_ + "." + key; }

std::string Fields::path(const char* key, std::size_t i) const {
    return path(key) + "[" + std::to_string(i) + "]";
}

const nlohmann::json& Fields::at(const char* key, bool (nlohmann::json::*is)() const noexcept,
                                 const char* expected) {
    read_.insert(key);
    const auto it = j_.find(key);
    if (it == j_.end()) throw InputDataError(path(key) + ": missing (expected " + expected + ")");
    if (!((*it).*is)()) throw InputDataError(path(key) + ": expected " + expected + ", got " + shown(*it));
    return *it;
}

std::string Fields::string(const char* key) {
    return at(key, &nlohmann::json::is_string, "a string").get<std::string>();
}

std::optional<std::string> Fields::string_or_null(const char* key) {
    if (j_.contains(key) && j_[key].is_null()) {
        read_.insert(key);
        return std::nullopt;
    }
    return at(key, &nlohmann::json::is_string, "a string or null").get<std::string>();
}

int64_t Fields::integer(const char* key, int64_t lo, int64_t hi) {
    const std::string expected = "a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
    const nlohmann::json& v = at(key, &nlohmann::json::is_number_integer, expected.c_str());
    const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(hi) &&
                                                   static_cast<int64_t>(v.get<uint64_t>()) >= lo
                                             : v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
    if (!fits) throw InputDataError(path(key) + ": expected " + expected + ", got " + shown(v));
    return v.get<int64_t>();
}

uint64_t Fields::unsigned_integer(const char* key) {
    const nlohmann::json& v =
        at(key, &nlohmann::json::is_number_integer, "a whole number from 0 to 2^64 - 1");
    if (!v.is_number_unsigned() && v.get<int64_t>() < 0)
        throw InputDataError(path(key) + ": expected a whole number from 0 to 2^64 - 1, got " + shown(v));
    return v.get<uint64_t>();
}

double Fields::number(const char* key, double lo, double hi) {
    const std::string expected = "a number from " + shown(lo) + " to " + shown(hi);
    const nlohmann::json& v = at(key, &nlohmann::json::is_number, expected.c_str());
    const double x = v.get<double>();
    if (!(x >= lo && x <= hi))
        throw InputDataError(path(key) + ": expected " + expected + ", got " + shown(v));
    return x;
}

bool Fields::boolean(const char* key) {
    return at(key, &nlohmann::json::is_boolean, "true or false").get<bool>();
}

const nlohmann::json& Fields::array(const char* key) {
    return at(key, &nlohmann::json::is_array, "an array");
}

const nlohmann::json& Fields::object(const char* key) {
    return at(key, &nlohmann::json::is_object, "an object");
}

void Fields::no_other_keys() const {
    for (const auto& [key, value] : j_.items())
        if (read_.count(key) == 0) throw InputDataError(path(key.c_str()) + ": not a key of this format");
}

}  // namespace dp::protocol::detail
