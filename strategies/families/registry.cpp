// The families dp-launch runs (Note [a family in one place]): one line each, in the order messages
// list them.
#include "strategies/family.h"

#include <algorithm>

#include "protocol/errors.h"

#include <nlohmann/json.hpp>

namespace dp::strategies {

const FamilyFacts& sd3_family();                   // families/sd3.cpp
const FamilyFacts& qwen_image_family();            // families/qwen_image.cpp
const FamilyFacts& flux_family();                  // families/flux.cpp
const FamilyFacts& flux_fill_family();             // families/flux.cpp
const FamilyFacts& flux_kontext_family();          // families/flux.cpp
const FamilyFacts& qwen_image_edit_family();       // families/qwen_image.cpp
const FamilyFacts& qwen_image_edit_plus_family();  // families/qwen_image.cpp
const FamilyFacts& z_image_family();               // families/z_image.cpp
const FamilyFacts& flux2_klein_family();           // families/flux2.cpp
const FamilyFacts& flux2_dev_family();             // families/flux2.cpp

const std::vector<const FamilyFacts*>& families() {
    static const std::vector<const FamilyFacts*> all = {&sd3_family(),
                                                        &qwen_image_family(),
                                                        &flux_family(),
                                                        &flux_fill_family(),
                                                        &flux_kontext_family(),
                                                        &qwen_image_edit_family(),
                                                        &qwen_image_edit_plus_family(),
                                                        &z_image_family(),
                                                        &flux2_klein_family(),
                                                        &flux2_dev_family()};
    return all;
}

const std::vector<protocol::Preset>& shipped_presets() {
    static const std::vector<protocol::Preset> all = [] {
        std::vector<protocol::Preset> out;
        for (const FamilyFacts* f : families())
            for (const char* text : f->presets) {
                protocol::Preset p;
                const std::string why =
                    protocol::read_preset(nlohmann::json::parse(text), "a shipped preset", p);
                if (!why.empty()) throw protocol::InternalError(why);
                const bool seen = std::any_of(out.begin(), out.end(),
                                              [&](const protocol::Preset& o) { return o.name == p.name; });
                if (!seen) out.push_back(std::move(p));
            }
        return out;
    }();
    return all;
}

const std::vector<const ParallelSpec*>& parallel_specs() {
    static const std::vector<const ParallelSpec*> all = [] {
        std::vector<const ParallelSpec*> specs;
        for (const FamilyFacts* f : families()) specs.push_back(&f->spec);
        return specs;
    }();
    return all;
}

const ParallelSpec* find_parallel_spec(const std::string& pipeline_class) {
    for (const ParallelSpec* s : parallel_specs())
        if (s->pipeline_class == pipeline_class) return s;
    return nullptr;
}

bool names_fit(const FamilyFacts& facts, const std::string& guess) {
    return guess.empty() || guess == facts.spec.display_name || guess == facts.names_as;
}

const FamilyFacts& facts_of(const ParallelSpec& spec) {
    for (const FamilyFacts* f : families())
        if (f->spec.family == spec.family) return *f;
    throw protocol::InternalError("no model family is registered as '" + spec.family + "'");
}

namespace {

const FamilyFacts* family_named(std::string_view family, bool& variant) {
    for (const FamilyFacts* f : families()) {
        variant = !f->spec.variant_family.empty() && f->spec.variant_family == family;
        if (f->spec.family == family || variant) return f;
    }
    throw protocol::InternalError("no model family is named '" + std::string(family) + "'");
}

}  // namespace

const ParallelSpec& family_spec(std::string_view family) {
    bool variant = false;
    return family_named(family, variant)->spec;
}

protocol::FamilyArguments family_arguments(std::string_view family) {
    bool variant = false;
    const FamilyFacts* f = family_named(family, variant);
    return protocol::FamilyArguments(std::string(family), variant ? f->variant_arguments : f->arguments);
}

}  // namespace dp::strategies
