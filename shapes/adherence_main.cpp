// dp-adherence: how well the images of a dp-launch output folder follow their prompts, judged by
// the shapes checker (shapes/adherence.h). Reads manifest.jsonl and the PNGs it lists.
#include <png.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "shapes/adherence.h"
#include "shapes/free_phrasing.h"

namespace {

bool read_png(const std::string& path, std::vector<uint8_t>& rgb, int& width, int& height) {
    png_image image{};
    image.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&image, path.c_str())) return false;
    image.format = PNG_FORMAT_RGB;
    if (image.width > 16384 || image.height > 16384) {
        png_image_free(&image);
        return false;
    }
    rgb.resize(PNG_IMAGE_SIZE(image));
    if (!png_image_finish_read(&image, nullptr, rgb.data(), 0, nullptr)) return false;
    width = static_cast<int>(image.width);
    height = static_cast<int>(image.height);
    return true;
}

struct Rates {
    double background, colour, kind, position, shapes_right, all_right;
};
Rates rates_of(const dp::shapes::AdherenceTotals& t) {
    return {t.rate(t.background, t.images), t.rate(t.colour, t.shapes),       t.rate(t.kind, t.shapes),
            t.rate(t.position, t.shapes),   t.rate(t.shapes_right, t.images), t.rate(t.all_right, t.images)};
}

nlohmann::json json_of(const dp::shapes::AdherenceTotals& t) {
    const Rates r = rates_of(t);
    return {{"images", t.images},
            {"shapes", t.shapes},
            {"background", r.background},
            {"colour", r.colour},
            {"kind", r.kind},
            {"position", r.position},
            {"shapes_right", r.shapes_right},
            {"all_right", r.all_right}};
}

// One line of a group: "two shapes: 12 image(s), background ..., both shapes right ...".
void print_group(const std::string& name, const dp::shapes::AdherenceTotals& t, bool two) {
    const Rates r = rates_of(t);
    std::printf(
        "%-26s %4d image(s)  background %5.1f%%  colour %5.1f%%  kind %5.1f%%  position %5.1f%%  %s %5.1f%%  "
        "all right %5.1f%%\n",
        (name + ":").c_str(), t.images, 100 * r.background, 100 * r.colour, 100 * r.kind, 100 * r.position,
        two ? "both shapes right" : "shape right", 100 * r.shapes_right, 100 * r.all_right);
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app(
        "dp-adherence: checks that the images of a dp-launch output folder show what their prompts ask "
        "for (shapes world: background colour, shape colour, kind and position)");
    std::string dir;
    bool json = false, quiet = false;
    double min_background = 0, min_colour = 0, min_kind = 0, min_position = 0;
    int print_held_out = 0, print_free = 0;
    bool with_family = false, print_two_shapes = false;
    uint64_t seed = 0;
    app.add_option("OUTPUT_DIR", dir, "a folder written by dp-launch (manifest.jsonl and its PNGs)");
    app.add_option("--print-held-out", print_held_out,
                   "print N prompts of attribute combinations held out of training, one per line, and exit")
        ->check(CLI::Range(1, 1000000));
    app.add_option("--print-free", print_free,
                   "print N prompts of the same held-out combinations in the free phrasings (another "
                   "generator than the trainer's grammar), one per line, and exit")
        ->check(CLI::Range(1, 1000000));
    app.add_flag("--with-family", with_family, "with --print-free: write FAMILY<TAB>PROMPT");
    app.add_flag(
        "--two-shapes", print_two_shapes,
        "with --print-held-out or --print-free: two-shape scenes instead (of (colour, kind) pairs seen "
        "in training: a held-out pair is only ever shown alone)");
    app.add_option("--seed", seed, "seed of --print-held-out and --print-free");
    app.add_flag("--json", json, "print the totals as one JSON object");
    app.add_flag("-q,--quiet", quiet, "no line per image");
    app.add_option("--min-background", min_background, "fail (exit 1) below this fraction")
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--min-colour", min_colour, "fail (exit 1) below this fraction")
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--min-kind", min_kind, "fail (exit 1) below this fraction")->check(CLI::Range(0.0, 1.0));
    app.add_option("--min-position", min_position, "fail (exit 1) below this fraction")
        ->check(CLI::Range(0.0, 1.0));
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;
    }
    // The scene of each printed prompt: a held-out combination alone, or two shapes.
    const auto next_scene = [&](std::mt19937_64& rng) {
        if (!print_two_shapes) return dp::shapes::random_scene(rng, true);
        for (;;)
            if (dp::shapes::Scene s = dp::shapes::random_scene(rng, false); s.shapes.size() == 2) return s;
    };
    if (print_two_shapes && print_held_out == 0 && print_free == 0) {
        std::cerr << "dp-adherence: --two-shapes goes with --print-held-out N or --print-free N; see --help"
                  << std::endl;
        return 2;
    }
    if (print_held_out > 0) {
        std::mt19937_64 rng(seed);
        for (int i = 0; i < print_held_out; ++i) {
            const dp::shapes::Scene scene = next_scene(rng);
            std::cout << dp::shapes::describe(scene, rng) << "\n";
        }
        return 0;
    }
    if (print_free > 0) {
        std::mt19937_64 rng(seed);
        for (int i = 0; i < print_free; ++i) {
            const dp::shapes::Scene scene = next_scene(rng);
            const dp::shapes::Phrasing p = dp::shapes::describe_freely(scene, rng);
            std::cout << (with_family ? p.family + "\t" : "") << p.prompt << "\n";
        }
        return 0;
    }
    if (with_family) {
        std::cerr << "dp-adherence: --with-family goes with --print-free N; see --help" << std::endl;
        return 2;
    }
    if (dir.empty()) {
        std::cerr
            << "dp-adherence: OUTPUT_DIR is required (or --print-held-out N, --print-free N); see --help"
            << std::endl;
        return 2;
    }
    std::ifstream manifest(dir + "/manifest.jsonl");
    if (!manifest) {
        std::cerr << "dp-adherence: " << dir << "/manifest.jsonl: cannot read it (is " << dir
                  << " a dp-launch output folder?)" << std::endl;
        return 66;
    }
    dp::shapes::AdherenceTotals totals, one_shape, two_shapes;
    std::map<std::string, dp::shapes::AdherenceTotals> families;  // free phrasings, by family
    int unjudged = 0, line_no = 0;
    for (std::string line; std::getline(manifest, line);) {
        ++line_no;
        if (line.empty()) continue;
        nlohmann::json r;
        try {
            r = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception&) {
            std::cerr << "dp-adherence: " << dir << "/manifest.jsonl:" << line_no << ": not JSON; skipped"
                      << std::endl;
            ++unjudged;
            continue;
        }
        if (!r.is_object() || r.value("status", "") != "ok" || !r.contains("prompt") ||
            !r["prompt"].is_string() || !r.contains("file") || !r["file"].is_string())
            continue;
        const std::string prompt = r["prompt"].get<std::string>(), file = r["file"].get<std::string>();
        const auto scene = dp::shapes::parse_prompt(prompt);
        std::vector<uint8_t> rgb;
        int w = 0, h = 0;
        if (!scene || file.find('/') != std::string::npos || !read_png(dir + "/" + file, rgb, w, h)) {
            if (!quiet)
                std::cout << "-    " << file << ": not judged ("
                          << (scene ? "unreadable PNG" : "prompt outside the shapes grammar") << ")\n";
            ++unjudged;
            continue;
        }
        const dp::shapes::Verdict v = dp::shapes::check_image(rgb.data(), w, h, *scene);
        totals.add(v);
        (scene->shapes.size() == 1 ? one_shape : two_shapes).add(v);
        const std::string family = dp::shapes::free_family(prompt);
        if (!family.empty()) families[family].add(v);
        if (quiet) continue;
        bool all = v.background;
        std::string seen = "background " + v.seen_background;
        for (const auto& s : v.shapes) {
            all = all && s.colour && s.kind && s.position;
            seen += s.found ? "; " + s.seen_colour + " " + s.seen_kind + " " + s.seen_position : "; no shape";
        }
        std::cout << (all ? "ok   " : "MISS ") << file << ": \"" << prompt << "\" -> " << seen << "\n";
    }
    const double bg = totals.rate(totals.background, totals.images),
                 col = totals.rate(totals.colour, totals.shapes),
                 kind = totals.rate(totals.kind, totals.shapes),
                 pos = totals.rate(totals.position, totals.shapes);
    if (json) {
        nlohmann::json out = json_of(totals);
        out["not_judged"] = unjudged;
        out["one_shape"] = json_of(one_shape);
        out["two_shapes"] = json_of(two_shapes);
        out["families"] = nlohmann::json::object();
        for (const auto& [name, t] : families) out["families"][name] = json_of(t);
        std::cout << out.dump() << std::endl;
    } else {
        std::printf("%d image(s), %d shape(s) judged, %d not judged\n", totals.images, totals.shapes,
                    unjudged);
        std::printf("background colour %5.1f%%  shape colour %5.1f%%  kind %5.1f%%  position %5.1f%%\n",
                    100 * bg, 100 * col, 100 * kind, 100 * pos);
        if (one_shape.images) print_group("one shape", one_shape, false);
        if (two_shapes.images) print_group("two shapes", two_shapes, true);
        for (const auto& [name, t] : families) print_group("family " + name, t, false);
    }
    if (totals.images == 0) {
        std::cerr << "dp-adherence: no image could be judged" << std::endl;
        return 1;
    }
    bool ok = true;
    for (const auto& [name, got, need] :
         {std::tuple<const char*, double, double>{"background colour", bg, min_background},
          {"shape colour", col, min_colour},
          {"kind", kind, min_kind},
          {"position", pos, min_position}})
        if (got < need) {
            std::cerr << "dp-adherence: " << name << " " << 100 * got << "% is below the required "
                      << 100 * need << "%" << std::endl;
            ok = false;
        }
    return ok ? 0 : 1;
}
