#pragma once
// Splitting work between processes, with accelerate's rule: for n items over `world` processes,
// q, r = divmod(n, world); process i takes the contiguous range starting at i*q + min(i, r), the
// lowest r processes one item more. Every item goes to exactly one process; a process may get none.

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace dp::strategies {

struct Range {
    int64_t begin = 0;
    int64_t end = 0;  // one past the last
    int64_t size() const { return end - begin; }
};

// Throws std::invalid_argument when world < 1, rank is outside [0, world) or n < 0.
inline Range split_between_processes(int64_t n, int64_t world, int64_t rank) {
    if (world < 1 || rank < 0 || rank >= world || n < 0)
        throw std::invalid_argument("split_between_processes: need n >= 0, world >= 1 and 0 <= rank < world");
    const int64_t q = n / world, r = n % world;
    const int64_t begin = rank * q + std::min(rank, r);
    return {begin, begin + q + (rank < r ? 1 : 0)};
}

// This process's share of `items`.
template <typename T>
std::vector<T> split_between_processes(const std::vector<T>& items, int64_t world, int64_t rank) {
    const Range range = split_between_processes(static_cast<int64_t>(items.size()), world, rank);
    return std::vector<T>(items.begin() + range.begin, items.begin() + range.end);
}

}  // namespace dp::strategies
