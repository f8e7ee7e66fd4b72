#pragma once
// A second generator of prompts for the shapes world, separate from the trainer's grammar
// (describe in shapes/shapes_world.h) and kept fixed: other connectives and orders, to measure
// whether the model follows the words of a prompt rather than the sentences it was trained on.
// Every prompt parses back to its scene with parse_prompt, uses only grammar_words(), and holds
// a word or mark describe never writes, so the two sets of prompts are disjoint. No LibTorch.

#include <random>
#include <string>
#include <vector>

#include "shapes/shapes_world.h"

namespace dp::shapes {

struct Phrasing {
    std::string prompt;
    std::string family;  // one of free_families()
};

// The phrasing families, in the order free_family() tries them.
const std::vector<std::string>& free_families();

// A prompt for the scene in a family and an order chosen by `rng`.
Phrasing describe_freely(const Scene& scene, std::mt19937_64& rng);

// The family a prompt of describe_freely belongs to, read from its words; "" for any other
// prompt (describe's among them).
std::string free_family(const std::string& prompt);

}  // namespace dp::shapes
