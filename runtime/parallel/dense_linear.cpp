#include "runtime/parallel/dense_linear.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "strategies/cpu_dtype.h"

namespace dp::runtime {

namespace {

bool onednn_fp32(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
    static const bool avx512 = strategies::cpu_has("avx512f");
    return avx512 && x.is_cpu() && weight.is_cpu() && x.scalar_type() == at::kFloat &&
           weight.scalar_type() == at::kFloat && weight.dim() == 2 && x.dim() >= 2 && x.numel() > 0 &&
           weight.numel() > 0 && (!bias.defined() || bias.scalar_type() == at::kFloat);
}

}  // namespace

at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
    if (!onednn_fp32(x, weight, bias)) return at::linear(x, weight, bias);
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
    const int64_t in = x.size(-1);
    std::vector<c10::IValue> stack{x.reshape({-1, in}).contiguous(),
                                   weight.contiguous(),
                                   bias.defined() ? c10::IValue(bias.contiguous()) : c10::IValue(),
                                   std::string("none"),
                                   c10::List<std::optional<at::Scalar>>(),
                                   std::optional<std::string>("")};
    op.callBoxed(&stack);
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = weight.size(0);
    return stack.front().toTensor().view(shape);
}

}  // namespace dp::runtime
