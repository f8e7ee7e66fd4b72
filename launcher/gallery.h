#pragma once
// The output folder's index.html: an offline page (no external resources, no network) that shows
// each manifest record as a card (the image, its prompt, seed, rank and time; or why it has no
// image) in a grid, under the run's summary. Images are linked by their file names in the same
// folder.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dp::launcher {

struct GallerySummary {
    std::string model;
    int world_size = 1;
    int64_t images = 0, failed = 0, invalid = 0, not_run = 0;
    double seconds = 0;
};

// `records`: the manifest's records in index order. Every text from a user is HTML-escaped.
std::string gallery_html(const std::vector<nlohmann::json>& records, const GallerySummary& summary);

// &, <, >, " and ' as entities.
std::string html_escape(const std::string& text);

}  // namespace dp::launcher
