#pragma once
// Strict reading of one JSON object of the protocol (the job file, a status event): every key has
// the type and range the contract says, required keys are present and no other key is there.
// Each error is an InputDataError naming the key by its path ("requests[2].seed: ...").
// Internal to protocol/.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

namespace dp::protocol::detail {

class Fields {
  public:
    // Throws InputDataError unless `j` is an object. `path` names it ("" for the top level).
    Fields(const nlohmann::json& j, std::string path);

    std::string string(const char* key);
    // A string, or null for none (the key is still required).
    std::optional<std::string> string_or_null(const char* key);
    int64_t integer(const char* key, int64_t lo, int64_t hi);
    uint64_t unsigned_integer(const char* key);
    double number(const char* key, double lo, double hi);
    bool boolean(const char* key);
    const nlohmann::json& array(const char* key);
    const nlohmann::json& object(const char* key);
    bool has(const char* key) const { return j_.contains(key); }

    // The path of `key`, or of element `i` of the array `key`, for nested readers and messages.
    std::string path(const char* key) const;
    std::string path(const char* key, std::size_t i) const;

    // Counts `key` as read (a key its caller read itself).
    void mark_read(const std::string& key) { read_.insert(key); }
    // Throws InputDataError naming a key that no read asked for.
    void no_other_keys() const;

  private:
    const nlohmann::json& at(const char* key, bool (nlohmann::json::*is)() const noexcept,
                             const char* expected);
    const nlohmann::json& j_;
    std::string path_;
    std::set<std::string> read_;
};

}  // namespace dp::protocol::detail
