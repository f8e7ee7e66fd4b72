#pragma once
// A deterministic prompt-adherence checker for the shapes world: no learned judge, only colour
// classification and simple geometry on the generated pixels.
//
// Each pixel takes the palette colour it is nearest to, then the majority of its 3 x 3
// neighbourhood where there is one (sampling noise). The background is the colour most border
// pixels have; shape pixels are the others, grouped into 4-connected components. Each shape the
// prompt asks for is matched to the largest component of its colour (else the largest unmatched
// one, whose colour is then wrong). A component's kind comes from its bounding box: a triangle's
// top quarter is much narrower than its bottom quarter; otherwise a square fills its box (>= 0.86)
// and a circle less. Its position is the anchor (left, right, top, bottom, centre) nearest the
// centre of its box.

#include <cstdint>
#include <string>
#include <vector>

#include "shapes/shapes_world.h"

namespace dp::shapes {

struct ShapeVerdict {
    bool found = false;  // a component was matched to this shape
    bool colour = false, kind = false, position = false;
    std::string seen_colour, seen_kind, seen_position;  // what the image shows ("" when not found)
};

struct Verdict {
    bool background = false;
    std::string seen_background;
    std::vector<ShapeVerdict> shapes;  // one per shape of the expected scene, in its order
};

// `rgb`: width x height x 3, row-major. Never reads outside it; any size from 1 x 1.
Verdict check_image(const uint8_t* rgb, int width, int height, const Scene& expected);

// Totals over many images: the fraction correct of each attribute (shapes counted one by one),
// the images whose every shape is right in colour, kind and position (`shapes_right`), and those
// right in everything, background included (`all_right`).
struct AdherenceTotals {
    int images = 0, shapes = 0;
    int background = 0, colour = 0, kind = 0, position = 0;
    int shapes_right = 0, all_right = 0;
    void add(const Verdict& v);
    double rate(int n, int of) const { return of ? static_cast<double>(n) / of : 0.0; }
};

}  // namespace dp::shapes
