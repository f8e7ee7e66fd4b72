#include "strategies/pass_flops.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace dp::strategies {

void PassFlops::linear(int64_t tokens, int64_t in, int64_t out, int64_t count) {
    if (tokens > 0 && in > 0 && out > 0 && count > 0) gemms.push_back({tokens, in, out, count});
}

void PassFlops::attend(int64_t queries, int64_t keys, int64_t width, int64_t count) {
    attention += 4.0 * static_cast<double>(queries) * static_cast<double>(keys) * static_cast<double>(width) *
                 static_cast<double>(count);
    if (queries > 0 && keys > 0 && count > 0) attentions.push_back({queries, keys, count});
}

double PassFlops::gemm() const {
    double sum = 0;
    for (const GemmShape& g : gemms) sum += g.flops();
    return sum;
}

RankFlops rank_flops(PassFlopsCount count, const nlohmann::json& config, const PassTokens& tokens,
                     const MeshDegrees& degrees, bool text_split) {
    const int64_t cp = std::max(1, degrees.ring * degrees.ulysses), tp = std::max(1, degrees.tp);
    const auto share = [cp](int64_t n) { return (n + cp - 1) / cp; };
    const PassFlops whole = count(config, tokens);
    const PassFlops own = count(config, {share(tokens.image), text_split ? share(tokens.text) : tokens.text});
    RankFlops rank{own.gemm() / static_cast<double>(tp), whole.attention / static_cast<double>(cp * tp),
                   own.gemms};
    for (GemmShape& g : rank.gemms) g.n = (g.n + tp - 1) / tp;
    rank.attentions = whole.attentions;  // its heads over tp (the caller's), its share of the queries
    for (AttentionShape& a : rank.attentions) a.queries = share(a.queries);
    return rank;
}

std::string flops_text(double flops) {
    static const char* const kUnits[] = {"FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"};
    int unit = 0;
    while (unit < 6 && std::fabs(flops) >= 1000) flops /= 1000, ++unit;
    char text[48];
    std::snprintf(text, sizeof(text), "%.3g %s", flops, kUnits[unit]);
    return text;
}

}  // namespace dp::strategies
