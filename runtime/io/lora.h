#pragma once
// LoRA adapter files as weight changes: each term of each adapter's layout (strategies/lora.h)
// read from its file as fp32 tensors on the CPU, with its factor (the adapter's scale times
// alpha / rank), grouped by component and base weight for WeightStore::set_deltas.

#include <map>
#include <memory>
#include <string>

#include "protocol/call_arguments.h"
#include "runtime/io/weights.h"
#include "strategies/lora.h"

namespace dp::runtime {

// Note [an adapter is the bytes it was hashed as]: the launcher hashes each adapter file before
// the ranks start, and the manifest records that SHA-256 with every image the adapter changed. A
// rank reads an adapter's file whole into memory of its own (never mapped: nothing written to
// the file later can reach the weights made from it), hashes those bytes and makes the weight
// changes from them only. When they are not the bytes the launcher hashed (the file was
// rewritten, replaced or removed after the launcher read it) the rank stops with IoError (74)
// naming the file, as for a weight file that changes (Note [files that change under a job],
// strategies/mapped_files.h), rather than failing only its prompts: the ranks of a group read
// the file each for itself, and one that failed a batch the others run would leave them waiting
// in a collective. So every image recorded with a SHA-256 was made from exactly those bytes.

// Component -> the changes of its weights by `adapters`, in their order. Throws what
// strategies::read_lora_layout throws (a missing file, a file of another model, a shape that does
// not fit), ModelError naming the file for unreadable tensors, and IoError naming a file that is
// not the one the launcher hashed (Note [an adapter is the bytes it was hashed as]).
std::map<std::string, std::shared_ptr<const WeightDeltas>> load_lora_deltas(
    const protocol::Adapters& adapters, const strategies::ParallelSpec& spec,
    const strategies::ModelTensors& model);

}  // namespace dp::runtime
