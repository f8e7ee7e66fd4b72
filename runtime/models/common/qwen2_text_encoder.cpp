#include "runtime/models/common/qwen2_text_encoder.h"
