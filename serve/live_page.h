#pragma once
// The server's page at "/": the queue (each job's state, progress and place) and the latest
// images, in the gallery's style, refreshed every two seconds from the API itself (with the key
// the page was opened with, ?key=KEY, when the server has one). No external resources.
#include <string>

namespace dp::serve {

// The page; `model` is shown in its heading (HTML-escaped).
std::string live_page_html(const std::string& model);

}  // namespace dp::serve
