#include "runtime/models/common/qwen_image_vae.h"
