// The worker side links the pinned LibTorch from the wheel and computes with it on CPU.
#include "unit/doctest_torch.h"

#include "runtime/libtorch_info.h"

TEST_CASE("the worker is built against the LibTorch the build configured") {
    const std::string expected = DP_EXPECTED_LIBTORCH;  // e.g. "2.15.0+cu132"
    CHECK(!dp::runtime::libtorch_version().empty());
    CHECK(expected.rfind(dp::runtime::libtorch_version(), 0) == 0);
}

TEST_CASE("LibTorch computes on CPU here (a closed-form check)") {
    at::Tensor a = at::arange(1, 101, at::kDouble);  // 1..100
    CHECK(a.sum().item<double>() == doctest::Approx(5050.0));
    at::Tensor m = at::eye(3, at::kFloat) * 2;
    CHECK(at::matmul(m, at::ones({3}, at::kFloat)).sum().item<float>() == doctest::Approx(6.0f));
}
