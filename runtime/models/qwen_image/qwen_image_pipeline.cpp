#include "runtime/models/qwen_image/qwen_image_pipeline.h"
