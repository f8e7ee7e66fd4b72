#include "runtime/models/qwen_image/qwen_image_transformer.h"
