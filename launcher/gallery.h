#pragma once
// The output folder's gallery: offline pages (no external resources, no network) that show each
// manifest record as a card (the image, its prompt, seed, rank and time; or why it has no image)
// in a grid, under the run's summary. Images are linked by their file names in the same folder.
//
// A run of up to a page of records (kGalleryPageCards) has one page, index.html. A longer one has
// index.html with the summary, the prompts that have no image (failed, not run, invalid, with
// their reasons) first, then the first page's cards and links to page-2.html, page-3.html, ...,
// each of the next kGalleryPageCards records, so that a browser opens any page of a 100 000-prompt
// run at once. The pages are written one record at a time (memory does not grow with the run).

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dp::launcher {

inline constexpr std::size_t kGalleryPageCards = 300;

struct GallerySummary {
    std::string model;
    int world_size = 1;
    int64_t images = 0, failed = 0, invalid = 0, not_run = 0;
    double seconds = 0;
};

// The manifest's records in index order, each given to `visit`, once per call.
using RecordVisitor = std::function<void(const nlohmann::json&)>;
using RecordSource = std::function<void(const RecordVisitor& visit)>;

// Writes the gallery of `records` (read twice) into `dir`: index.html and its further pages, each
// atomically, the further pages first so that index.html never links to a missing one; then
// removes the page-N.html files of an earlier, longer run. Every text from a user is
// HTML-escaped. Throws IoError; the pages already replaced stay (each is whole).
void write_gallery(const std::string& dir, const RecordSource& records, const GallerySummary& summary,
                   std::size_t page_cards = kGalleryPageCards);

// The one-page gallery of `records` (the index.html of a run of up to a page).
std::string gallery_html(const std::vector<nlohmann::json>& records, const GallerySummary& summary);

// The file of gallery page `page` (1-based): index.html, page-2.html, ...
std::string gallery_page_name(std::size_t page);

// The pages' CSS (the server's live page shares it).
std::string gallery_style();

// &, <, >, " and ' as entities.
std::string html_escape(const std::string& text);

}  // namespace dp::launcher
