#include "runtime/models/common/prompt_tokens.h"

#include "runtime/models/common/clip_tokenizer.h"
#include "runtime/models/common/t5_tokenizer.h"

namespace dp::runtime {

std::vector<int64_t> clip_ids(const ClipTokenizer& tokenizer, const std::vector<std::string>& prompts,
                              std::vector<std::string>* warnings) {
    std::vector<int64_t> ids;
    for (std::size_t k = 0; k < prompts.size(); ++k) {
        const ClipEncoding one = tokenizer.encode(prompts[k]);
        if (one.dropped_tokens > 0 && warnings)
            (*warnings)[k] =
                "The following part of your input was truncated because CLIP can only handle sequences up "
                "to " +
                std::to_string(tokenizer.model_max_length()) + " tokens (" +
                std::to_string(one.dropped_tokens) + " tokens dropped): " + tokenizer.decode(one.truncated);
        ids.insert(ids.end(), one.ids.begin(), one.ids.end());
    }
    return ids;
}

std::vector<int64_t> t5_ids(const T5Tokenizer& tokenizer, const std::vector<std::string>& prompts,
                            int max_length, std::vector<std::string>& warnings) {
    std::vector<int64_t> ids;
    for (std::size_t k = 0; k < prompts.size(); ++k) {
        const T5Encoding one = tokenizer.encode(prompts[k], max_length);
        if (one.dropped_tokens > 0) {
            std::string& warning = warnings[k];
            if (!warning.empty()) warning += "; ";
            warning +=
                "The following part of your input was truncated because `max_sequence_length` is set to " +
                std::to_string(max_length) + " tokens (" + std::to_string(one.dropped_tokens) +
                " tokens dropped): " + tokenizer.decode(one.truncated);
        }
        ids.insert(ids.end(), one.ids.begin(), one.ids.end());
    }
    return ids;
}

}  // namespace dp::runtime
