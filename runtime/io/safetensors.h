#pragma once
// The worker side's names for the safetensors reader (strategies/safetensors.h), which the
// launcher shares. Light header: no LibTorch (see tensor_io.h for tensors).

#include "strategies/safetensors.h"

namespace dp::runtime {

using strategies::parse_safetensors_header;
using strategies::parse_st_dtype;
using strategies::SafetensorsFile;
using strategies::st_dtype_name;
using strategies::st_dtype_size;
using strategies::StDType;
using strategies::StTensorInfo;

}  // namespace dp::runtime
