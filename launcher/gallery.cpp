#include "launcher/gallery.h"

#include <cstdio>

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

namespace {

std::string field(const nlohmann::json& r, const char* key) {
    if (!r.contains(key)) return "";
    const nlohmann::json& v = r[key];
    return html_escape(v.is_string() ? v.get<std::string>() : v.dump());
}

}  // namespace

std::string gallery_html(const std::vector<nlohmann::json>& records, const GallerySummary& s) {
    char summary[256];
    std::snprintf(
        summary, sizeof(summary),
        "%lld images, %lld failed, %lld invalid, %lld not run &middot; %.1f s, %.2f images/s &middot; "
        "%d rank(s)",
        static_cast<long long>(s.images), static_cast<long long>(s.failed), static_cast<long long>(s.invalid),
        static_cast<long long>(s.not_run), s.seconds,
        s.seconds > 0 ? static_cast<double>(s.images) / s.seconds : 0.0, s.world_size);
    std::string html =
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        "<title>dp-launch gallery</title>\n<style>\n"
        "body{font-family:system-ui,sans-serif;margin:1.5rem;background:#f4f4f4;color:#222}\n"
        "h1{font-size:1.3rem;margin:0 0 .3rem}.summary{color:#555;margin-bottom:1rem}\n"
        ".grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(180px,1fr));gap:12px}\n"
        ".item{background:#fff;border-radius:6px;padding:8px;box-shadow:0 1px 3px rgba(0,0,0,.15)}\n"
        ".item img{width:100%;height:auto;image-rendering:pixelated;display:block;border-radius:3px}\n"
        ".prompt{font-size:.85rem;margin:.4rem 0 .2rem;overflow-wrap:anywhere}\n"
        ".meta{font-size:.75rem;color:#666}.error{color:#b00020;font-size:.8rem;overflow-wrap:anywhere}\n"
        ".missing{aspect-ratio:1;background:#eee;display:flex;align-items:center;justify-content:center;"
        "color:#999;border-radius:3px}\n"
        "</style>\n</head>\n<body>\n<h1>dp-launch gallery</h1>\n<div class=\"summary\">" +
        std::string(summary) + " &middot; model " + html_escape(s.model) + "</div>\n<div class=\"grid\">\n";
    for (const nlohmann::json& r : records) {
        const std::string status = r.value("status", "");
        html += "<figure class=\"item\" data-status=\"" + html_escape(status) + "\" style=\"margin:0\">\n";
        if (status == "ok" && r.contains("file")) {
            html += "<img src=\"" + field(r, "file") + "\" alt=\"" + field(r, "prompt") + "\" width=\"" +
                    field(r, "width") + "\" height=\"" + field(r, "height") + "\">\n";
        } else {
            html += "<div class=\"missing\">" + html_escape(status.empty() ? "?" : status) + "</div>\n";
        }
        html += "<figcaption><div class=\"prompt\">" + field(r, "prompt") + "</div>\n<div class=\"meta\">#" +
                field(r, "index") + " &middot; seed " + field(r, "seed") +
                (r.contains("rank") ? " &middot; rank " + field(r, "rank") : "") +
                (r.contains("ms") ? " &middot; " + field(r, "ms") + " ms" : "") + "</div>\n";
        if (r.contains("error")) html += "<div class=\"error\">" + field(r, "error") + "</div>\n";
        html += "</figcaption>\n</figure>\n";
    }
    html +=
        "</div>\n<script>\n"
        "// Marks the page with how many images loaded, for automated checks.\n"
        "window.addEventListener('load',function(){var i=document.images,n=0;"
        "for(var k=0;k<i.length;k++)if(i[k].complete&&i[k].naturalWidth>0)n++;"
        "document.body.dataset.imagesLoaded=n;document.body.dataset.images=i.length;"
        "document.body.dataset.items=document.querySelectorAll('.item').length;});\n"
        "</script>\n</body>\n</html>\n";
    return html;
}

}  // namespace dp::launcher
