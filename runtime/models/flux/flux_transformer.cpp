#include "runtime/models/flux/flux_transformer.h"
