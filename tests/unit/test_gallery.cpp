#include <doctest/doctest.h>

#include "launcher/gallery.h"

using dp::launcher::gallery_html;
using dp::launcher::GallerySummary;

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
    std::size_t cards = 0;
    for (std::size_t at = html.find("<figure class=\"item\""); at != std::string::npos;
         at = html.find("<figure class=\"item\"", at + 1))
        ++cards;
    CHECK(cards == 3);
    CHECK(html.find("<img src=\"00000-a.png\"") != std::string::npos);
    CHECK(html.find("a &lt;b&gt;red&lt;/b&gt; &quot;circle&quot; &amp; &#39;more&#39;") != std::string::npos);
    CHECK(html.find("<b>red</b>") == std::string::npos);
    CHECK(html.find("size &lt;bad&gt;") != std::string::npos);
    CHECK(html.find("models/&lt;m&gt;") != std::string::npos);
    CHECK(html.find("1 images, 1 failed, 1 invalid, 0 not run") != std::string::npos);
    CHECK(html.find("0.50 images/s") != std::string::npos);
    CHECK(html.find("seed 5 &middot; rank 1 &middot; 12 ms") != std::string::npos);
    for (const char* external : {"http://", "https://", "//cdn", "@import"})
        CHECK(html.find(external) == std::string::npos);
}
