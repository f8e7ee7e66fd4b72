// The safetensors reader: every hostile or truncated file is a ModelError naming the file (and
// tensor), never a crash or an out-of-bounds read.
#include "unit/doctest_torch.h"

#include <unistd.h>

#include <fstream>
#include <random>
#include <set>

#include "runtime/io/errors.h"
#include "runtime/io/safetensors.h"
#include "runtime/io/tensor_io.h"

using namespace dp::runtime;

namespace {
std::string temp_path(const std::string& name) {
    return "/tmp/dp_st_" + std::to_string(getpid()) + "_" + name;
}

std::string raw_file(const std::string& header, const std::string& data, std::int64_t declared = -1) {
    std::string out(8, '\0');
    std::uint64_t len = declared < 0 ? header.size() : static_cast<std::uint64_t>(declared);
    for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((len >> (8 * i)) & 0xff);
    return out + header + data;
}

std::string write_bytes(const std::string& name, const std::string& bytes) {
    const std::string path = temp_path(name);
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
}

void expect_model_error(const std::string& bytes, const std::string& must_contain) {
    const std::string path = write_bytes("bad.safetensors", bytes);
    try {
        SafetensorsFile::open(path);
        FAIL("accepted: " << must_contain);
    } catch (const ModelError& e) {
        const std::string what = e.what();
        CHECK_MESSAGE(what.find(path) != std::string::npos, what);
        CHECK_MESSAGE(what.find(must_contain) != std::string::npos, what);
        CHECK(e.exit_code() == 65);
    }
}
}  // namespace

TEST_CASE("write then read: names, shapes, dtypes, values and metadata survive") {
    const std::string path = temp_path("rt.safetensors");
    at::Tensor a = at::arange(12, at::kFloat).reshape({3, 4});
    at::Tensor b = at::tensor({1.5, -2.25}, at::kDouble).to(at::kHalf);
    at::Tensor c = at::ones({2, 3}, at::kBFloat16).t();  // not contiguous
    save_safetensors(path, {{"a", a}, {"layer.b", b}, {"c", c}}, {{"format", "pt"}});
    auto file = SafetensorsFile::open(path);
    CHECK(file->tensors().size() == 3);
    CHECK(file->metadata().at("format") == "pt");
    CHECK(file->info("a").shape == std::vector<int64_t>{3, 4});
    CHECK(std::string(st_dtype_name(file->info("layer.b").dtype)) == "F16");
    CHECK(at::equal(load_tensor(file, "a", at::kFloat), a));
    CHECK(at::equal(load_tensor(file, "layer.b", at::kFloat), b.to(at::kFloat)));
    CHECK(at::equal(load_tensor(file, "c", at::kFloat), c.to(at::kFloat)));
    CHECK((load_tensor(file, "c", at::kBFloat16).scalar_type() == at::kBFloat16));
    CHECK_THROWS_WITH_AS(file->info("missing"), doctest::Contains("has no tensor 'missing'"), ModelError);
}

TEST_CASE("a tensor aliasing the mapping keeps the file mapped after the file object is gone") {
    const std::string path = temp_path("alias.safetensors");
    save_safetensors(path, {{"x", at::full({1000}, 7.0f)}});
    at::Tensor x;
    {
        auto file = SafetensorsFile::open(path);
        x = load_tensor(file, "x", at::kFloat);
        CHECK(x.data_ptr() == static_cast<const void*>(file->data("x")));  // written aligned, so mapped
    }
    CHECK(x.sum().item<float>() == doctest::Approx(7000.0f));
}

TEST_CASE(
    "weights load 64-byte aligned wherever the file puts them, and compute the same (Note [Weights are "
    "64-byte aligned])") {
    // A [64, 64] weight whose data starts at every 4-byte offset modulo 64 of the mapping; one row
    // through it (MKL's gemv, the path whose sums depend on the operand's alignment) must give the
    // bits of the same weight in a fresh tensor.
    const at::Tensor w = at::randn({64, 64}, at::TensorOptions().dtype(at::kFloat));
    const at::Tensor x = at::randn({1, 64}, at::TensorOptions().dtype(at::kFloat));
    const at::Tensor want = at::linear(x, w);
    const std::string data(reinterpret_cast<const char*>(w.data_ptr()), static_cast<std::size_t>(w.nbytes()));
    const std::string header = R"({"w":{"dtype":"F32","shape":[64,64],"data_offsets":[0,16384]}})";
    std::set<std::uintptr_t> starts;
    for (std::size_t start = 0; start < 64; start += 4) {
        const std::size_t pad = (start + 64 - (8 + header.size()) % 64) % 64;  // the data at `start` mod 64
        const std::string path =
            write_bytes("aligned.safetensors", raw_file(header + std::string(pad, ' '), data));
        auto file = SafetensorsFile::open(path);
        starts.insert(reinterpret_cast<std::uintptr_t>(file->data("w")) % 64);
        for (const at::Tensor& t : {load_tensor(file, "w", at::kFloat),
                                    load_tensor_slice(file, "w", at::kFloat, at::kCPU, 0, 0, 64)}) {
            CAPTURE(start);
            CHECK(reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 64 == 0);
            CHECK(at::equal(t, w));
            CHECK(at::equal(at::linear(x, t), want));
        }
    }
    CHECK(starts.size() == 16);  // every offset was tried
}

TEST_CASE("hostile and truncated files are refused with the reason") {
    const std::string ok_header = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    const std::string four(4, '\0'), eight(8, '\0');
    // One tensor 't' with `fields` (its dtype, shape and offsets), over eight data bytes.
    const auto one_tensor = [&](const std::string& fields) {
        return raw_file("{\"t\":{" + fields + "}}", eight);
    };
    const std::vector<std::pair<std::string, std::string>> files = {
        {"", "truncated"},
        {"abc", "truncated"},
        {raw_file(ok_header, eight, 1LL << 40), "header length"},
        {raw_file(ok_header, eight, static_cast<std::int64_t>(ok_header.size()) + 9), "header length"},
        {raw_file(ok_header, four), "outside the file's 4 data bytes"},
        {raw_file("{not json", ""), "not valid JSON"},
        {raw_file("[1,2]", ""), "expected a JSON object"},
        {one_tensor(R"("dtype":"F33","shape":[2],"data_offsets":[0,8])"), "unsupported dtype 'F33'"},
        {one_tensor(R"("dtype":"F32","shape":[3],"data_offsets":[0,8])"), "tensor 't'"},
        {one_tensor(R"("dtype":"F32","shape":[-2],"data_offsets":[0,8])"), "non-negative"},
        {one_tensor(R"("dtype":"F32","shape":[2],"data_offsets":[8,0])"), "data_offsets"},
        {one_tensor(R"("dtype":"F32","shape":[2],"data_offsets":[0])"), "data_offsets"},
        {one_tensor(
             R"("dtype":"F32","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,8])"),
         "too large"},
        {raw_file(R"({"t":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})", four),
         "shape"},
        {raw_file(
             R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
             eight),
         "overlap"},
        {raw_file(R"({"__metadata__":{"k":1}})", ""), "__metadata__"},
        {raw_file(R"({"t":"F32"})", ""), "tensor 't'"}};
    for (const auto& [bytes, reason] : files) {
        CAPTURE(reason);
        expect_model_error(bytes, reason);
    }
}

TEST_CASE("fuzz: random truncations and byte flips never crash the reader") {
    const std::string path = temp_path("fuzz_src.safetensors");
    save_safetensors(path, {{"w", at::randn({4, 5})}, {"b", at::randn({5}).to(at::kHalf)}}, {{"k", "v"}});
    std::ifstream in(path, std::ios::binary);
    const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::mt19937 rng(7);
    int accepted = 0, refused = 0;
    for (int trial = 0; trial < 1500; ++trial) {
        std::string bytes = good;
        if (trial % 3 == 0) bytes.resize(rng() % bytes.size());
        const int flips = 1 + static_cast<int>(rng() % 4);
        for (int f = 0; f < flips && !bytes.empty(); ++f)
            bytes[rng() % std::min<std::size_t>(bytes.size(), 160)] = static_cast<char>(rng());
        const std::string p = write_bytes("fuzz.safetensors", bytes);
        try {
            auto file = SafetensorsFile::open(p);
            for (const auto& [name, info] : file->tensors()) {
                // Every byte the reader hands out must lie inside the file.
                const std::byte* d = file->data(name);
                volatile unsigned sum = 0;
                for (std::size_t i = 0; i < info.nbytes; ++i) sum = sum + static_cast<unsigned>(d[i]);
            }
            ++accepted;
        } catch (const ModelError&) {
            ++refused;
        }
    }
    CHECK(refused > 0);
    CHECK(accepted + refused == 1500);
}
