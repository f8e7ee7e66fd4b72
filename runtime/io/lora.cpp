#include "runtime/io/lora.h"

#include <ATen/ATen.h>

#include <vector>

#include "runtime/io/safetensors.h"
#include "runtime/io/tensor_io.h"
#include "strategies/model_files.h"
#include "strategies/sha256.h"

namespace dp::runtime {
namespace {

// The bytes of `adapter`'s file, read once into memory of their own: when the launcher gave the
// file's SHA-256 (the one the manifest records), they must be the bytes it hashed, or IoError (74)
// naming the file (Note [an adapter is the bytes it was hashed as], lora.h).
std::shared_ptr<SafetensorsFile> read_adapter(const protocol::Adapter& adapter) {
    if (adapter.sha256.empty()) return SafetensorsFile::read(adapter.path);  // no job checked it
    if (!strategies::model_file_exists(adapter.path))
        throw protocol::IoError(adapter.path +
                                " was removed while the job ran; a job's model and adapter files "
                                "must stay as they are until it ends");
    std::shared_ptr<SafetensorsFile> file = SafetensorsFile::read(adapter.path);
    const std::string now = strategies::sha256_hex(file->bytes().data(), file->bytes().size());
    if (now != adapter.sha256)
        throw protocol::IoError(adapter.path + " changed while the job ran: its SHA-256 is now " + now +
                                ", not the " + adapter.sha256 +
                                " dp-launch checked and records; a job's model and adapter files must stay "
                                "as they are until it ends: run it again once they have settled");
    return file;
}

}  // namespace

std::map<std::string, std::shared_ptr<const WeightDeltas>> load_lora_deltas(
    const protocol::Adapters& adapters, const strategies::ParallelSpec& spec,
    const strategies::ModelTensors& model) {
    std::map<std::string, WeightDeltas> by_component;
    for (const protocol::Adapter& adapter : adapters) {
        const std::shared_ptr<SafetensorsFile> file = read_adapter(adapter);
        const strategies::LoraLayout layout = strategies::read_lora_layout(*file, spec, model);
        for (const strategies::LoraTerm& term : layout.terms) {
            WeightDelta d;
            d.down = load_tensor(file, term.down, at::kFloat);
            at::Tensor up = load_tensor(file, term.up, at::kFloat);
            if (!term.up_rows.empty()) {
                std::vector<at::Tensor> parts;
                for (const auto& [first, count] : term.up_rows) parts.push_back(up.narrow(0, first, count));
                up = at::cat(parts, 0);
            }
            d.up = up.contiguous();
            d.factor = adapter.scale * term.alpha_scale;
            by_component[term.component][term.weight].push_back(std::move(d));
        }
    }
    std::map<std::string, std::shared_ptr<const WeightDeltas>> out;
    for (auto& [component, deltas] : by_component)
        out[component] = std::make_shared<const WeightDeltas>(std::move(deltas));
    return out;
}

}  // namespace dp::runtime
