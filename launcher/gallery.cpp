#include "launcher/gallery.h"

#include <dirent.h>

#include <cctype>
#include <cstdio>
#include <memory>

#include "protocol/atomic_file.h"

namespace dp::launcher {

std::string html_escape(const std::string& text) {
    std::string out;
    out.reserve(text.size());
    for (char c : text) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&quot;";
                break;
            case '\'':
                out += "&#39;";
                break;
            default:
                out += c;
        }
    }
    return out;
}

std::string gallery_page_name(std::size_t page) {
    return page <= 1 ? "index.html" : "page-" + std::to_string(page) + ".html";
}

namespace {

std::string field(const nlohmann::json& r, const char* key) {
    if (!r.contains(key)) return "";
    const nlohmann::json& v = r[key];
    return html_escape(v.is_string() ? v.get<std::string>() : v.dump());
}

bool has_image(const nlohmann::json& r) { return r.value("status", "") == "ok"; }

}  // namespace

std::string gallery_style() {
    return "body{font-family:system-ui,sans-serif;margin:1.5rem;background:#f4f4f4;color:#222}\n"
           "h1{font-size:1.3rem;margin:0 0 .3rem}.summary{color:#555;margin-bottom:1rem}\n"
           "h2{font-size:1.05rem;margin:1.2rem 0 .5rem}.pages{margin:.6rem 0 1rem;line-height:1.8}\n"
           ".pages a,.pages b{margin-right:.5rem}\n"
           ".grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(180px,1fr));gap:12px}\n"
           ".item{background:#fff;border-radius:6px;padding:8px;box-shadow:0 1px 3px rgba(0,0,0,.15)}\n"
           ".item img{width:100%;height:auto;image-rendering:pixelated;display:block;border-radius:3px}\n"
           ".item img.input{width:40%;margin-top:.3rem;opacity:.9}\n"
           ".prompt{font-size:.85rem;margin:.4rem 0 .2rem;overflow-wrap:anywhere}\n"
           ".meta{font-size:.75rem;color:#666}.error{color:#b00020;font-size:.8rem;overflow-wrap:anywhere}\n"
           ".missing{aspect-ratio:1;background:#eee;display:flex;align-items:center;justify-content:center;"
           "color:#999;border-radius:3px}\n";
}

namespace {

// The page up to its first grid: the summary, then `between` (navigation, the prompts without an
// image), then the opening of the cards' grid.
std::string page_head(const std::string& title, const GallerySummary& s, const std::string& between) {
    char summary[256];
    std::snprintf(
        summary, sizeof(summary),
        "%lld images, %lld failed, %lld invalid, %lld not run &middot; %.1f s, %.2f images/s &middot; "
        "%d rank(s)",
        static_cast<long long>(s.images), static_cast<long long>(s.failed), static_cast<long long>(s.invalid),
        static_cast<long long>(s.not_run), s.seconds,
        s.seconds > 0 ? static_cast<double>(s.images) / s.seconds : 0.0, s.world_size);
    return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
           "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
           "<title>" +
           title + "</title>\n<style>\n" + gallery_style() +
           "</style>\n</head>\n<body>\n<h1>dp-launch gallery</h1>\n<div class=\"summary\">" +
           std::string(summary) + " &middot; model " + html_escape(s.model) + "</div>\n" + between +
           "<div class=\"grid\">\n";
}

// An absolute path as a file: URL, every byte but letters, digits, '/', '-', '_', '.' and '~'
// percent-encoded.
std::string file_url(const std::string& path) {
    static const char* const kHex = "0123456789ABCDEF";
    std::string url = "file://";
    for (const unsigned char c : path) {
        if (std::isalnum(c) || c == '/' || c == '-' || c == '_' || c == '.' || c == '~') {
            url += static_cast<char>(c);
        } else {
            url += '%';
            url += kHex[c >> 4];
            url += kHex[c & 15];
        }
    }
    return url;
}

// An edit's input beside its output (Note [input images]): the input's picture, linked, and the strength.
std::string edit_input(const nlohmann::json& r) {
    if (!r.contains("image") || !r["image"].is_object() || !r["image"].contains("path") ||
        !r["image"]["path"].is_string())
        return "";
    const std::string path = r["image"]["path"].get<std::string>();
    const std::string url = html_escape(file_url(path));
    const std::string name = html_escape(path.substr(path.rfind('/') + 1));
    return "<div class=\"meta\">edited from <a href=\"" + url + "\">" + name + "</a>" +
           (r.contains("strength") ? " at strength " + field(r, "strength") : "") + "</div>\n<a href=\"" +
           url + "\"><img class=\"input\" src=\"" + url + "\" alt=\"input " + name + "\"></a>\n";
}

std::string card(const nlohmann::json& r) {
    const std::string status = r.value("status", "");
    std::string html =
        "<figure class=\"item\" data-status=\"" + html_escape(status) + "\" style=\"margin:0\">\n";
    if (has_image(r) && r.contains("file")) {
        // The card's image links to the file itself, at full size.
        html += "<a href=\"" + field(r, "file") + "\"><img src=\"" + field(r, "file") + "\" alt=\"" +
                field(r, "prompt") + "\" width=\"" + field(r, "width") + "\" height=\"" + field(r, "height") +
                "\"></a>\n";
    } else {
        html += "<div class=\"missing\">" + html_escape(status.empty() ? "?" : status) + "</div>\n";
    }
    html += "<figcaption><div class=\"prompt\">" + field(r, "prompt") + "</div>\n<div class=\"meta\">#" +
            field(r, "index") + " &middot; seed " + field(r, "seed") +
            (r.contains("rank") ? " &middot; rank " + field(r, "rank") : "") +
            (r.contains("ms") ? " &middot; " + field(r, "ms") + " ms" : "") + "</div>\n";
    html += edit_input(r);
    if (r.contains("error")) html += "<div class=\"error\">" + field(r, "error") + "</div>\n";
    html += "</figcaption>\n</figure>\n";
    return html;
}

// Closes the grid and the page. The script marks the page with how many images loaded, for
// automated checks.
std::string page_foot(const std::string& after) {
    return "</div>\n" + after +
           "<script>\n"
           "window.addEventListener('load',function(){var i=document.images,n=0;"
           "for(var k=0;k<i.length;k++)if(i[k].complete&&i[k].naturalWidth>0)n++;"
           "document.body.dataset.imagesLoaded=n;document.body.dataset.images=i.length;"
           "document.body.dataset.items=document.querySelectorAll('.item').length;});\n"
           "</script>\n</body>\n</html>\n";
}

// Links to every page, the current one in bold.
std::string page_links(std::size_t page, std::size_t pages) {
    std::string html = "<nav class=\"pages\">Pages: ";
    for (std::size_t p = 1; p <= pages; ++p)
        html += p == page ? "<b>" + std::to_string(p) + "</b>"
                          : "<a href=\"" + gallery_page_name(p) + "\">" + std::to_string(p) + "</a>";
    return html + "</nav>\n";
}

// Removes DIR/page-N.html for N > pages: what an earlier, longer run left.
void remove_pages_after(const std::string& dir, std::size_t pages) {
    const std::unique_ptr<DIR, int (*)(DIR*)> d(opendir(dir.c_str()), closedir);
    if (!d) return;
    std::vector<std::string> stale;
    while (const dirent* e = readdir(d.get())) {
        const std::string name = e->d_name;
        unsigned long long n = 0;
        char tail[8] = {};
        if (std::sscanf(name.c_str(), "page-%llu%7s", &n, tail) == 2 && std::string(tail) == ".html" &&
            name == gallery_page_name(n) && n > pages)
            stale.push_back(name);
    }
    for (const std::string& name : stale) std::remove((dir + "/" + name).c_str());
}

}  // namespace

std::string gallery_html(const std::vector<nlohmann::json>& records, const GallerySummary& s) {
    std::string html = page_head("dp-launch gallery", s, "");
    for (const nlohmann::json& r : records) html += card(r);
    return html + page_foot("");
}

void write_gallery(const std::string& dir, const RecordSource& records, const GallerySummary& s,
                   std::size_t page_cards) {
    if (page_cards == 0) page_cards = 1;
    // First pass: how many records, and the first page's worth of those without an image.
    std::size_t count = 0, problems = 0;
    std::string problem_cards;
    records([&](const nlohmann::json& r) {
        ++count;
        if (has_image(r)) return;
        if (++problems <= page_cards) problem_cards += card(r);
    });
    const std::size_t pages = count <= page_cards ? 1 : (count + page_cards - 1) / page_cards;
    std::unique_ptr<protocol::AtomicFile> index, page;  // index.html is renamed last
    std::size_t at = 0;
    const auto open_page = [&](std::size_t p) {
        const std::string title =
            "dp-launch gallery, page " + std::to_string(p) + " of " + std::to_string(pages);
        if (p == 1) {
            index = std::make_unique<protocol::AtomicFile>(dir + "/index.html");
            std::string between;
            if (pages > 1) {
                between = page_links(1, pages);
                if (problems > 0) {
                    between += "<h2>Without an image: " + std::to_string(problems) + "</h2>\n";
                    if (problems > page_cards)
                        between += "<p>The first " + std::to_string(page_cards) +
                                   " are shown here; every one is on its own page too.</p>\n";
                    between += "<div class=\"grid problems\">\n" + problem_cards + "</div>\n";
                }
                between += "<h2>Page 1 of " + std::to_string(pages) + "</h2>\n";
            }
            index->write(page_head(pages > 1 ? title : "dp-launch gallery", s, between));
        } else {
            page = std::make_unique<protocol::AtomicFile>(dir + "/" + gallery_page_name(p));
            page->write(page_head(title, s, page_links(p, pages)));
        }
    };
    const auto close_page = [&](std::size_t p) {
        const std::string after = pages > 1 ? page_links(p, pages) : "";
        if (p == 1) {
            index->write(page_foot(after));
        } else {
            page->write(page_foot(after));
            page->commit();
            page.reset();
        }
    };
    open_page(1);
    records([&](const nlohmann::json& r) {
        const std::size_t p = at / page_cards + 1;
        if (at > 0 && at % page_cards == 0) {
            close_page(p - 1);
            open_page(p);
        }
        (p == 1 ? index : page)->write(card(r));
        ++at;
    });
    const std::size_t last = at == 0 ? 1 : (at - 1) / page_cards + 1;
    close_page(last);
    index->commit();
    remove_pages_after(dir, pages);
}

}  // namespace dp::launcher
