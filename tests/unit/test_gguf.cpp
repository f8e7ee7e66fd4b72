// The GGUF container as the launcher reads it (strategies/gguf.h): files written here byte by byte
// (header, metadata of every value type, tensor infos, alignment padding, data), read back with
// their shapes in torch's order, and every way a file can be wrong refused with the file named:
// truncation anywhere, a type we do not read (naming the tensor and the type id), rows that are
// not whole blocks, misaligned or overlapping data, and counts or lengths larger than the file.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "protocol/errors.h"
#include "strategies/family.h"
#include "strategies/gguf.h"
#include "strategies/parallel_spec.h"
#include "strategies/single_file.h"
#include "unit/st_writer.h"

using namespace dp::strategies;

namespace {

struct Bytes {
    std::string b;
    template <class T>
    Bytes& num(T v) {
        b.append(reinterpret_cast<const char*>(&v), sizeof(T));
        return *this;
    }
    Bytes& str(const std::string& s) {
        num<uint64_t>(s.size());
        b += s;
        return *this;
    }
};

struct GgufTensor {
    std::string name;
    std::vector<uint64_t> ne;  // ggml's order: the row length first
    uint32_t type;
    uint64_t bytes;  // data bytes written for it
};

// A GGUF file of `tensors` (their data zeros, laid out one after the other at `alignment`), with
// a string, a uint32 and an array of strings as metadata.
std::string write_gguf(const std::string& name, const std::vector<GgufTensor>& tensors,
                       uint32_t alignment = 32, std::size_t cut = 0, uint32_t version = 3) {
    Bytes h;
    h.b = "GGUF";
    h.num<uint32_t>(version).num<uint64_t>(tensors.size()).num<uint64_t>(alignment == 32 ? 3 : 4);
    h.str("general.architecture").num<uint32_t>(8).str("flux");
    h.str("general.quantization_version").num<uint32_t>(4).num<uint32_t>(2);
    h.str("tags").num<uint32_t>(9).num<uint32_t>(8).num<uint64_t>(2).str("a").str("bc");
    if (alignment != 32) h.str("general.alignment").num<uint32_t>(4).num<uint32_t>(alignment);
    uint64_t offset = 0;
    for (const GgufTensor& t : tensors) {
        h.str(t.name).num<uint32_t>(static_cast<uint32_t>(t.ne.size()));
        for (uint64_t n : t.ne) h.num<uint64_t>(n);
        h.num<uint32_t>(t.type).num<uint64_t>(offset);
        offset += (t.bytes + alignment - 1) / alignment * alignment;
    }
    h.b.append((alignment - h.b.size() % alignment) % alignment, '\0');
    h.b.append(offset, '\0');
    if (cut) h.b.resize(h.b.size() - cut);
    const std::string path = dp::test::scratch_path("gguf", name);
    std::ofstream(path, std::ios::binary) << h.b;
    return path;
}

std::string refusal(const std::string& path) {
    try {
        GgufFile::open(path);
    } catch (const dp::protocol::ModelError& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("a GGUF file: tensor shapes in torch's order, each type's bytes, string metadata, the alignment") {
    const std::string path = write_gguf("ok.gguf",
                                        {{"a.weight", {256, 3}, 12, 3 * 144},       // Q4_K [3, 256]
                                         {"b.weight", {64, 2}, 8, 2 * 2 * 34},      // Q8_0 [2, 64]
                                         {"c.bias", {5}, 0, 20},                    // F32 [5]
                                         {"d.weight", {32, 4, 2}, 2, 2 * 4 * 18}},  // Q4_0 [2, 4, 32]
                                        64);
    const auto f = GgufFile::open(path);
    CHECK(is_gguf_file(path));
    CHECK(f->info("a.weight").shape == std::vector<int64_t>{3, 256});
    CHECK(std::string(f->info("a.weight").type->name) == "Q4_K");
    CHECK(f->info("a.weight").nbytes == 3 * 144);
    CHECK(f->info("a.weight").row_bytes == 144);
    CHECK(f->info("b.weight").nbytes == 2 * 2 * 34);
    CHECK(f->info("c.bias").shape == std::vector<int64_t>{5});
    CHECK(f->info("d.weight").shape == std::vector<int64_t>{2, 4, 32});
    CHECK(f->metadata().at("general.architecture") == "flux");
    CHECK(f->data("b.weight") - f->data("a.weight") == 448);  // 432 bytes rounded up to the alignment 64
    CHECK_FALSE(
        is_gguf_file(dp::test::write_st_file(dp::test::scratch_path("gguf", "x.safetensors"), {{"t", {1}}})));
    // Every type we read has the block size ggml gives it.
    const std::vector<std::pair<uint32_t, std::pair<int64_t, int64_t>>> sizes = {
        {0, {1, 4}},      {1, {1, 2}},      {30, {1, 2}},    {2, {32, 18}},   {3, {32, 20}},
        {6, {32, 22}},    {7, {32, 24}},    {8, {32, 34}},   {10, {256, 84}}, {11, {256, 110}},
        {12, {256, 144}}, {13, {256, 176}}, {14, {256, 210}}};
    for (const auto& [id, size] : sizes) {
        CAPTURE(id);
        REQUIRE(ggml_type(id) != nullptr);
        CHECK(ggml_type(id)->block_elements == size.first);
        CHECK(ggml_type(id)->block_bytes == size.second);
    }
    CHECK(ggml_type(9) == nullptr);  // Q8_1: not a type of stored weights
}

TEST_CASE("a GGUF file that is wrong is refused, naming the file and what is wrong") {
    const std::vector<GgufTensor> two = {{"a.weight", {32, 4}, 8, 4 * 34}, {"b.weight", {32, 2}, 8, 2 * 34}};
    const std::string whole = write_gguf("whole.gguf", two);
    REQUIRE(refusal(whole).empty());
    // Truncated anywhere: in the data, in the tensor infos, in the metadata, in the counts.
    for (std::size_t cut :
         {std::size_t{30}, std::size_t{200}, std::size_t{260}, std::size_t{290}, std::size_t{400}}) {
        CAPTURE(cut);
        const std::string path = write_gguf("cut.gguf", two, 32, cut);
        const std::string why = refusal(path);
        CHECK(why.find(path) == 0);
        CHECK(why.find("truncated") != std::string::npos);
    }
    // A type we do not read: the tensor and the type id.
    const std::string iq = refusal(write_gguf("iq.gguf", {{"x.weight", {256, 1}, 19, 50}}));
    CHECK(iq.find("'x.weight'") != std::string::npos);
    CHECK(iq.find("ggml type 19 (IQ1_S)") != std::string::npos);
    CHECK(
        refusal(write_gguf("unknown.gguf", {{"x.weight", {32, 1}, 99, 34}})).find("ggml type 99 (unknown)") !=
        std::string::npos);
    // Rows that are not whole blocks.
    CHECK(refusal(write_gguf("rows.gguf", {{"x.weight", {48, 2}, 8, 136}})).find("not whole Q8_0 blocks") !=
          std::string::npos);
    // Another version, no magic, absurd counts and dimensions.
    CHECK(refusal(write_gguf("v1.gguf", two, 32, 0, 1)).find("version 1") != std::string::npos);
    std::string bytes;
    {
        std::ifstream in(whole, std::ios::binary);
        bytes.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    }
    const auto mutated = [&](const std::string& name, std::size_t at, uint64_t value) {
        std::string b = bytes;
        std::memcpy(&b[at], &value, 8);
        const std::string path = dp::test::scratch_path("gguf", name);
        std::ofstream(path, std::ios::binary) << b;
        return refusal(path);
    };
    CHECK(mutated("count.gguf", 8, uint64_t{1} << 60).find("corrupt") != std::string::npos);  // tensor count
    CHECK(mutated("kv.gguf", 16, uint64_t{1} << 60).find("corrupt") != std::string::npos);   // metadata count
    CHECK(mutated("key.gguf", 24, uint64_t{1} << 40).find("corrupt") != std::string::npos);  // a key's length
    std::string magic = bytes;
    magic[0] = 'X';
    const std::string no_magic = dp::test::scratch_path("gguf", "magic.gguf");
    std::ofstream(no_magic, std::ios::binary) << magic;
    CHECK(refusal(no_magic).find("not a GGUF file") != std::string::npos);
    CHECK(refusal(write_gguf("zero.gguf", {{"x.weight", {32, 0}, 8, 0}})).find("impossible dimension") !=
          std::string::npos);
    CHECK(refusal(write_gguf("dims.gguf", {{"x.weight", {32, 1, 1, 1, 1}, 8, 34}})).find("dimensions") !=
          std::string::npos);
}

TEST_CASE("a FLUX.1 GGUF file in Black Forest Labs' names maps as its safetensors twin does") {
    const std::string path =
        write_gguf("flux.gguf", {{"img_in.weight", {64, 8}, 8, 8 * 2 * 34},
                                 {"img_in.bias", {8}, 0, 32},
                                 {"double_blocks.0.img_attn.qkv.weight", {256, 24}, 12, 24 * 144}});
    const SingleFileLayout l = read_single_file_layout(path, family_spec("flux"), "transformer");
    CHECK(l.gguf);
    CHECK(l.layout == "Black Forest Labs' original (FLUX.1)");
    CHECK(l.format == "GGUF Q4_K (and F32, Q8_0)");
    CHECK(l.shapes.at("transformer_blocks.0.attn.to_v.weight") == std::vector<int64_t>{8, 256});
    CHECK(l.tensors.at("transformer_blocks.0.attn.to_v.weight").rows ==
          std::vector<std::pair<int64_t, int64_t>>{{16, 8}});
}
