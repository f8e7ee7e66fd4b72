#include "runtime/models/flux/flux_pipeline.h"
