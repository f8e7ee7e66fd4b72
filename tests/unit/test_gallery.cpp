#include <doctest/doctest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "launcher/gallery.h"
#include "unit/temp_dir.h"

using dp::launcher::gallery_html;
using dp::launcher::GallerySummary;
using dp::launcher::write_gallery;

namespace {

std::size_t count_of(const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
}

std::size_t cards(const std::string& html) { return count_of(html, "<figure class=\"item\""); }

struct GalleryDir : dp::test::TempDir {
    GalleryDir() : dp::test::TempDir("gallery") {}
};

// `n` records: every third one failed, the others made.
std::vector<nlohmann::json> run_of(int n) {
    std::vector<nlohmann::json> records;
    for (int i = 0; i < n; ++i) {
        if (i % 3 == 1)
            records.push_back({{"index", i},
                               {"prompt", "p" + std::to_string(i)},
                               {"status", "failed"},
                               {"error", "reason <" + std::to_string(i) + ">"}});
        else
            records.push_back({{"index", i},
                               {"prompt", "p" + std::to_string(i)},
                               {"status", "ok"},
                               {"file", "img-" + std::to_string(i) + ".png"},
                               {"width", 32},
                               {"height", 32}});
    }
    return records;
}

dp::launcher::RecordSource source(const std::vector<nlohmann::json>& records) {
    return [&records](const dp::launcher::RecordVisitor& visit) {
        for (const nlohmann::json& r : records) visit(r);
    };
}

}  // namespace

TEST_CASE("the gallery: one card per record, text escaped, no external resources") {
    std::vector<nlohmann::json> records = {
        {{"index", 0},
         {"prompt", "a <b>red</b> \"circle\" & 'more'"},
         {"seed", 5},
         {"status", "ok"},
         {"file", "00000-a.png"},
         {"rank", 1},
         {"ms", 12},
         {"width", 32},
         {"height", 32}},
        {{"index", 1}, {"prompt", "x"}, {"seed", 6}, {"status", "failed"}, {"error", "size <bad>"}},
        {{"index", 2}, {"line", 3}, {"status", "invalid"}, {"error", "line 3: empty prompt"}}};
    GallerySummary s;
    s.model = "models/<m>";
    s.images = 1;
    s.failed = 1;
    s.invalid = 1;
    s.seconds = 2;
    const std::string html = gallery_html(records, s);
    CHECK(cards(html) == 3);
    CHECK(html.find("<a href=\"00000-a.png\"><img src=\"00000-a.png\"") !=
          std::string::npos);                // full size on a click
    CHECK(count_of(html, "<a href=") == 1);  // only the card with an image links
    CHECK(html.find("a &lt;b&gt;red&lt;/b&gt; &quot;circle&quot; &amp; &#39;more&#39;") != std::string::npos);
    CHECK(html.find("<b>red</b>") == std::string::npos);
    CHECK(html.find("size &lt;bad&gt;") != std::string::npos);
    CHECK(html.find("models/&lt;m&gt;") != std::string::npos);
    CHECK(html.find("1 images, 1 failed, 1 invalid, 0 not run") != std::string::npos);
    CHECK(html.find("0.50 images/s") != std::string::npos);
    CHECK(html.find("seed 5 &middot; rank 1 &middot; 12 ms") != std::string::npos);
    for (const char* external : {"http://", "https://", "//cdn", "@import"})
        CHECK(html.find(external) == std::string::npos);
    // An edit shows its input beside it, linked by its file: URL (each odd byte percent-encoded).
    std::vector<nlohmann::json> edits = records;
    edits[0]["image"] = {{"path", "/data/my photos/cat&1.png"}, {"sha256", std::string(64, 'a')}};
    edits[0]["strength"] = 0.6;
    const std::string edited = gallery_html(edits, s);
    CHECK(edited.find("edited from <a href=\"file:///data/my%20photos/cat%261.png\">cat&amp;1.png</a> at "
                      "strength 0.6") != std::string::npos);
    CHECK(edited.find("<img class=\"input\" src=\"file:///data/my%20photos/cat%261.png\"") !=
          std::string::npos);
    // A run of up to a page is that one page, as index.html.
    const GalleryDir dir;
    write_gallery(dir.path, source(records), s, 3);
    CHECK(dir.read("index.html") == html);
    CHECK_FALSE(dir.has("page-2.html"));
}

TEST_CASE(
    "the gallery of a long run: pages of a few cards, the prompts without an image first on the index") {
    const GalleryDir dir;
    const std::vector<nlohmann::json> records = run_of(10);  // 3 failed: 1, 4, 7
    GallerySummary s;
    s.images = 7;
    s.failed = 3;
    write_gallery(dir.path, source(records), s, 4);
    REQUIRE(dir.has("index.html"));
    REQUIRE(dir.has("page-2.html"));
    REQUIRE(dir.has("page-3.html"));
    CHECK_FALSE(dir.has("page-4.html"));
    const std::string index = dir.read("index.html");
    // The failed ones with their reasons, before the first page's cards (records 0 to 3).
    const std::size_t problems = index.find("Without an image: 3");
    const std::size_t first_page = index.find("Page 1 of 3");
    REQUIRE(problems != std::string::npos);
    REQUIRE(first_page != std::string::npos);
    CHECK(problems < first_page);
    for (const char* reason : {"reason &lt;1&gt;", "reason &lt;4&gt;", "reason &lt;7&gt;"}) {
        CHECK(index.find(reason) < first_page);
        CHECK(index.find(reason) > problems);
    }
    CHECK(index.find("img-0.png") > first_page);
    CHECK(index.find("img-3.png") > first_page);
    CHECK(index.find("img-5.png") == std::string::npos);
    CHECK(cards(index) == 3 + 4);
    CHECK(index.find("<a href=\"page-2.html\">2</a>") != std::string::npos);
    CHECK(index.find("<a href=\"page-3.html\">3</a>") != std::string::npos);
    CHECK(index.find("7 images, 3 failed") != std::string::npos);
    const std::string second = dir.read("page-2.html"), third = dir.read("page-3.html");
    CHECK(cards(second) == 4);
    CHECK(cards(third) == 2);
    CHECK(second.find("img-5.png") != std::string::npos);
    CHECK(third.find("img-9.png") != std::string::npos);
    CHECK(third.find("<a href=\"index.html\">1</a>") != std::string::npos);
    CHECK(third.find("page 3 of 3") != std::string::npos);
    for (const std::string& page : {index, second, third})
        for (const char* external : {"http://", "https://", "//cdn", "@import"})
            CHECK(page.find(external) == std::string::npos);
}

TEST_CASE("the gallery removes the pages of an earlier, longer run") {
    const GalleryDir dir;
    GallerySummary s;
    const std::vector<nlohmann::json> long_run = run_of(13), shorter = run_of(6), one_page = run_of(3);
    write_gallery(dir.path, source(long_run), s, 4);
    REQUIRE(dir.has("page-4.html"));
    std::ofstream(dir.path + "/page-2.html.bak") << "not a page";  // not a page's name: kept
    write_gallery(dir.path, source(shorter), s, 4);
    CHECK(dir.has("page-2.html"));
    CHECK_FALSE(dir.has("page-3.html"));
    CHECK_FALSE(dir.has("page-4.html"));
    CHECK(cards(dir.read("page-2.html")) == 2);
    write_gallery(dir.path, source(one_page), s, 4);
    CHECK_FALSE(dir.has("page-2.html"));
    CHECK(dir.has("page-2.html.bak"));
    CHECK(cards(dir.read("index.html")) == 3);
    CHECK(dir.read("index.html").find("Pages:") == std::string::npos);
}
