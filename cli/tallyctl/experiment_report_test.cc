#include "cli/tallyctl/experiment_report.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::cli {
namespace {

using ::tally::v1::EvalPoint;
using ::tally::v1::Experiment;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// --- A small XML reader, strict where the renderer's output must be. -------

struct Element {
  std::string name;
  std::map<std::string, std::string> attrs;  // entities decoded
  std::string text;                          // direct character data, decoded
};

struct Document {
  std::vector<Element> elements;  // in document order; [0] is the root
};

bool IsNameChar(char c, bool first) {
  return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
         (!first && (absl::ascii_isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.'));
}

bool ValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xE  ? 3
                 : (c >> 3) == 0x1E ? 4
                                    : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

// Decodes character data, refusing a raw '<', a bare '&' and control
// characters XML 1.0 forbids.
absl::StatusOr<std::string> Decode(absl::string_view raw) {
  std::string out;
  for (size_t i = 0; i < raw.size(); ++i) {
    const char c = raw[i];
    if (c == '<') return absl::InvalidArgumentError(absl::StrCat("raw '<' in \"", raw, "\""));
    if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t' && c != '\r') {
      return absl::InvalidArgumentError("control character in character data");
    }
    if (c != '&') {
      out += c;
      continue;
    }
    const size_t semi = raw.find(';', i);
    if (semi == absl::string_view::npos) return absl::InvalidArgumentError("bare '&'");
    const absl::string_view entity = raw.substr(i + 1, semi - i - 1);
    static const auto* const kEntities = new std::map<std::string, std::string, std::less<>>{
        {"amp", "&"}, {"lt", "<"}, {"gt", ">"}, {"quot", "\""}, {"apos", "'"}};
    const auto it = kEntities->find(entity);
    if (it == kEntities->end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown entity &", entity, ";"));
    }
    out += it->second;
    i = semi;
  }
  return out;
}

absl::StatusOr<Document> ParseXml(absl::string_view xml) {
  if (!ValidUtf8(xml)) return absl::InvalidArgumentError("not UTF-8");
  Document doc;
  std::vector<size_t> open;
  bool root_closed = false;
  size_t i = 0;
  if (absl::StartsWith(xml, "<?xml")) {
    i = xml.find("?>");
    if (i == absl::string_view::npos) return absl::InvalidArgumentError("unterminated <?xml");
    i += 2;
  }
  while (i < xml.size()) {
    const size_t lt = xml.find('<', i);
    const absl::string_view text = xml.substr(i, lt == absl::string_view::npos ? xml.npos : lt - i);
    auto decoded = Decode(text);
    if (!decoded.ok()) return decoded.status();
    if (open.empty()) {
      if (!absl::StripAsciiWhitespace(*decoded).empty()) {
        return absl::InvalidArgumentError("text outside the root element");
      }
    } else {
      doc.elements[open.back()].text += *decoded;
    }
    if (lt == absl::string_view::npos) break;
    i = lt + 1;
    if (i < xml.size() && xml[i] == '/') {
      const size_t gt = xml.find('>', i);
      if (gt == absl::string_view::npos) return absl::InvalidArgumentError("unterminated end tag");
      const absl::string_view name = xml.substr(i + 1, gt - i - 1);
      if (open.empty() || doc.elements[open.back()].name != name) {
        return absl::InvalidArgumentError(absl::StrCat("</", name, "> closes nothing open"));
      }
      open.pop_back();
      if (open.empty()) root_closed = true;
      i = gt + 1;
      continue;
    }
    if (root_closed) return absl::InvalidArgumentError("a second root element");
    Element e;
    while (i < xml.size() && IsNameChar(xml[i], e.name.empty())) e.name += xml[i++];
    if (e.name.empty()) return absl::InvalidArgumentError("a '<' without a tag name");
    bool self_closing = false;
    while (true) {
      const size_t before = i;
      while (i < xml.size() && absl::ascii_isspace(static_cast<unsigned char>(xml[i]))) ++i;
      if (i >= xml.size()) return absl::InvalidArgumentError("unterminated tag");
      if (xml[i] == '>') {
        ++i;
        break;
      }
      if (xml.substr(i, 2) == "/>") {
        i += 2;
        self_closing = true;
        break;
      }
      if (i == before) return absl::InvalidArgumentError("attributes need spaces between them");
      std::string attr;
      while (i < xml.size() && IsNameChar(xml[i], attr.empty())) attr += xml[i++];
      if (attr.empty() || i + 1 >= xml.size() || xml[i] != '=' ||
          (xml[i + 1] != '"' && xml[i + 1] != '\'')) {
        return absl::InvalidArgumentError(absl::StrCat("bad attribute in <", e.name, ">"));
      }
      const char quote = xml[i + 1];
      const size_t end = xml.find(quote, i + 2);
      if (end == absl::string_view::npos) return absl::InvalidArgumentError("unterminated value");
      auto value = Decode(xml.substr(i + 2, end - i - 2));
      if (!value.ok()) return value.status();
      if (!e.attrs.emplace(attr, *value).second) {
        return absl::InvalidArgumentError(absl::StrCat("duplicate attribute ", attr));
      }
      i = end + 1;
    }
    if (open.empty() && !doc.elements.empty()) {
      return absl::InvalidArgumentError("a second root element");
    }
    doc.elements.push_back(std::move(e));
    if (self_closing) {
      if (open.empty()) root_closed = true;
    } else {
      open.push_back(doc.elements.size() - 1);
    }
  }
  if (!open.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("<", doc.elements[open.back()].name, "> not closed"));
  }
  if (doc.elements.empty()) return absl::InvalidArgumentError("no root element");
  return doc;
}

// --- Helpers over a rendered document. -------------------------------------

Document Render(const Experiment& experiment, const std::vector<VariantCurve>& curves,
                const ReportOptions& options = {}) {
  const std::string svg = RenderExperimentSvg(experiment, curves, options);
  absl::StatusOr<Document> doc = ParseXml(svg);
  EXPECT_TRUE(doc.ok()) << doc.status() << "\n" << svg;
  if (!doc.ok()) return Document{};
  const Element& root = doc->elements[0];
  EXPECT_EQ(root.name, "svg");
  EXPECT_EQ(root.attrs.count("xmlns") ? root.attrs.at("xmlns") : "", "http://www.w3.org/2000/svg");
  // Every geometric attribute is a finite number, whatever went in.
  for (const Element& e : doc->elements) {
    for (const char* a : {"x", "y", "x1", "y1", "x2", "y2", "cx", "cy", "r", "width", "height"}) {
      const auto it = e.attrs.find(a);
      if (it == e.attrs.end() || it->second == "100%") continue;
      double v;
      EXPECT_TRUE(absl::SimpleAtod(it->second, &v) && std::isfinite(v))
          << "<" << e.name << " " << a << "=\"" << it->second << "\">";
    }
  }
  return *std::move(doc);
}

std::vector<const Element*> WithClass(const Document& doc, absl::string_view name,
                                      absl::string_view cls) {
  std::vector<const Element*> out;
  for (const Element& e : doc.elements) {
    const auto it = e.attrs.find("class");
    if (e.name == name && it != e.attrs.end() && it->second == cls) out.push_back(&e);
  }
  return out;
}

std::string AllText(const Document& doc) {
  std::string out;
  for (const Element& e : doc.elements) absl::StrAppend(&out, e.text, "\n");
  return out;
}

// The x axis's tick labels, left to right.
std::vector<std::string> XTicks(const Document& doc) {
  std::vector<std::string> ticks;
  bool in_x = false;
  for (const Element& e : doc.elements) {
    if (e.name == "g") in_x = e.attrs.count("class") && e.attrs.at("class") == "x-axis";
    if (in_x && e.name == "text") ticks.push_back(e.text);
  }
  return ticks;
}

struct XY {
  double x;
  double y;
};

// The vertices of a path drawn as "M x y L x y ...".
std::vector<XY> Vertices(const Element& path) {
  std::vector<XY> out;
  std::vector<std::string> tokens = absl::StrSplit(path.attrs.at("d"), ' ', absl::SkipEmpty());
  for (size_t i = 0; i + 1 < tokens.size(); i += 2) {
    absl::string_view x = tokens[i];
    EXPECT_TRUE(absl::ConsumePrefix(&x, "M") || absl::ConsumePrefix(&x, "L")) << tokens[i];
    XY p;
    EXPECT_TRUE(absl::SimpleAtod(x, &p.x) && std::isfinite(p.x)) << tokens[i];
    EXPECT_TRUE(absl::SimpleAtod(tokens[i + 1], &p.y) && std::isfinite(p.y)) << tokens[i + 1];
    out.push_back(p);
  }
  EXPECT_EQ(tokens.size() % 2, 0u) << path.attrs.at("d");
  return out;
}

double Attr(const Element& e, const std::string& name) {
  double v = kNaN;
  EXPECT_TRUE(absl::SimpleAtod(e.attrs.at(name), &v)) << name;
  return v;
}

EvalPoint Eval(double cost_usd, double val_loss, int64_t tokens = 0) {
  EvalPoint p;
  p.set_cost_usd(cost_usd);
  p.set_val_loss(val_loss);
  p.set_tokens(tokens);
  return p;
}

// An evaluation at `step` that had been billed `billed` dollars.
EvalPoint EvalAt(int64_t step, double billed, double loss) {
  EvalPoint p = Eval(billed, loss);
  p.set_step(step);
  return p;
}

Experiment MakeExperiment(std::vector<std::string> names, double target = 0) {
  Experiment e;
  e.set_name("experiments/7");
  e.mutable_spec()->set_display_name("lr sweep");
  e.set_state(tally::v1::EXPERIMENT_STATE_RUNNING);
  e.set_target_val_loss(target);
  for (const std::string& n : names) e.add_variants()->set_name(n);
  return e;
}

std::vector<VariantCurve> ThreeCurves() {
  return {{"baseline", {Eval(0.1, 5.0), Eval(0.4, 4.0), Eval(0.9, 3.5)}},
          {"lr-high", {Eval(0.1, 4.6), Eval(0.3, 3.2), Eval(0.6, 2.8)}},
          {"lr-low", {Eval(0.2, 5.2), Eval(0.5, 4.9)}}};
}

// --- Tests. -----------------------------------------------------------------

TEST(ExperimentReportTest, XmlReaderRejectsWhatItShould) {
  EXPECT_TRUE(ParseXml("<svg xmlns=\"a\"><g/><text>a &amp; b</text></svg>").ok());
  EXPECT_FALSE(ParseXml("<svg><g></svg>").ok());
  EXPECT_FALSE(ParseXml("<svg><text>a & b</text></svg>").ok());
  EXPECT_FALSE(ParseXml("<svg><text>a < b</text></svg>").ok());
  EXPECT_FALSE(ParseXml("<svg a=\"<\"/>").ok());
  EXPECT_FALSE(ParseXml("<svg a=\"1\" a=\"2\"/>").ok());
  EXPECT_FALSE(ParseXml("<svg/><svg/>").ok());
  EXPECT_FALSE(ParseXml("<svg>\x01</svg>").ok());
  EXPECT_FALSE(ParseXml("<svg>\xff</svg>").ok());
}

TEST(ExperimentReportTest, TitleNamesTheExperiment) {
  const Document doc =
      Render(MakeExperiment({"baseline", "lr-high", "lr-low"}, 3.0), ThreeCurves());
  const auto titles = WithClass(doc, "text", "title");
  ASSERT_THAT(titles, SizeIs(1));
  EXPECT_EQ(titles[0]->text, "lr sweep (experiments/7)");
  EXPECT_THAT(AllText(doc), HasSubstr("running"));
  EXPECT_THAT(AllText(doc), HasSubstr("target val loss 3.0000"));
}

TEST(ExperimentReportTest, OnePathPerVariantWithACurveAndALegendEntryForEach) {
  Experiment e = MakeExperiment({"baseline", "lr-high", "lr-low", "queued"}, 3.0);
  std::vector<VariantCurve> curves = ThreeCurves();
  curves.push_back({"queued", {}});
  const Document doc = Render(e, curves);
  const auto paths = WithClass(doc, "path", "variant");
  ASSERT_THAT(paths, SizeIs(3));
  std::set<std::string> colours;
  for (size_t i = 0; i < paths.size(); ++i) {
    EXPECT_EQ(paths[i]->attrs.at("data-variant"), curves[i].variant);
    EXPECT_THAT(Vertices(*paths[i]), SizeIs(curves[i].curve.size()));
    colours.insert(paths[i]->attrs.at("stroke"));
  }
  EXPECT_THAT(colours, SizeIs(3));
  std::vector<std::string> legend;
  for (const Element* t : WithClass(doc, "text", "legend-name")) legend.push_back(t->text);
  EXPECT_THAT(legend, ElementsAre("baseline", "lr-high", "lr-low", "queued"));
  EXPECT_THAT(AllText(doc), HasSubstr("no evaluations yet"));
}

TEST(ExperimentReportTest, ColoursFollowTheExperimentNotTheCurveOrder) {
  const Experiment e = MakeExperiment({"baseline", "lr-high", "lr-low"}, 3.0);
  std::vector<VariantCurve> curves = ThreeCurves();
  // (Each document kept while its elements are read: WithClass points into
  // it.)
  std::map<std::string, std::string> first;
  const Document before = Render(e, curves);
  for (const Element* p : WithClass(before, "path", "variant")) {
    first[p->attrs.at("data-variant")] = p->attrs.at("stroke");
  }
  std::swap(curves[0], curves[2]);
  curves.erase(curves.begin() + 1);
  std::map<std::string, std::string> second;
  const Document after = Render(e, curves);
  for (const Element* p : WithClass(after, "path", "variant")) {
    second[p->attrs.at("data-variant")] = p->attrs.at("stroke");
  }
  ASSERT_THAT(second, SizeIs(2));
  EXPECT_EQ(second["baseline"], first["baseline"]);
  EXPECT_EQ(second["lr-low"], first["lr-low"]);
}

TEST(ExperimentReportTest, NamesAndTextAreEscaped) {
  const std::string hostile = "a<b>&\"c'd</text><script>x</script>";
  Experiment e = MakeExperiment({hostile}, 3.0);
  e.mutable_spec()->set_display_name("<script>alert(1)</script> & \"co\"");
  e.mutable_variants(0)->set_note("never <reached> & \"stopped\"");
  const std::string svg = RenderExperimentSvg(e, {{hostile, {Eval(1, 4), Eval(2, 3.5)}}});
  EXPECT_THAT(svg, Not(HasSubstr("<script")));
  const Document doc = Render(e, {{hostile, {Eval(1, 4), Eval(2, 3.5)}}});
  const auto paths = WithClass(doc, "path", "variant");
  ASSERT_THAT(paths, SizeIs(1));
  EXPECT_EQ(paths[0]->attrs.at("data-variant"), hostile);
  EXPECT_THAT(WithClass(doc, "text", "title")[0]->text,
              HasSubstr("<script>alert(1)</script> & \"co\""));
  EXPECT_THAT(AllText(doc), HasSubstr("never <reached> & \"stopped\""));
}

TEST(ExperimentReportTest, InvalidUtf8AndControlCharactersStillMakeValidXml) {
  const std::string bad =
      std::string("x\xff\xc0\xafy\x01\x1b[31m\xed\xa0\x80z\xe2\x80\xaeq\xf0\x9f") +
      std::string(1, '\0') + "end";
  Experiment e = MakeExperiment({bad}, 3.0);
  e.mutable_spec()->set_display_name(bad);
  const Document doc = Render(e, {{bad, {Eval(1, 4), Eval(2, 2)}}});
  const auto paths = WithClass(doc, "path", "variant");
  ASSERT_THAT(paths, SizeIs(1));
  const std::string& name = paths[0]->attrs.at("data-variant");
  EXPECT_TRUE(absl::StartsWith(name, "x\uFFFD")) << name;
  EXPECT_THAT(name, HasSubstr("y\uFFFD"));
  EXPECT_THAT(name, Not(HasSubstr("\u202E")));
}

TEST(ExperimentReportTest, LongNamesAreCutInTheLegendButNotInTheData) {
  const std::string name(64, 'v');
  const Document doc = Render(MakeExperiment({name}), {{name, {Eval(1, 4), Eval(2, 3)}}});
  EXPECT_EQ(WithClass(doc, "path", "variant")[0]->attrs.at("data-variant"), name);
  const std::string& shown = WithClass(doc, "text", "legend-name")[0]->text;
  EXPECT_LT(shown.size(), name.size());
  EXPECT_TRUE(absl::EndsWith(shown, "\u2026")) << shown;
}

// target.metric quantized_val_loss: each curve is of its quantized losses
// (a point without one is not drawn), and the labels say so.
TEST(ExperimentReportTest, AQuantizedTargetPlotsTheQuantizedCurve) {
  Experiment e = MakeExperiment({"qat"}, 3.0);
  e.mutable_spec()->mutable_target()->set_metric("quantized_val_loss");
  auto quantized = [](double cost, double loss, std::optional<double> q) {
    EvalPoint p = Eval(cost, loss);
    if (q) p.set_quantized_val_loss(*q);
    return p;
  };
  const Document doc = Render(e, {{"qat", {quantized(0, 5, std::nullopt),
                                           quantized(1, 4, 4.4), quantized(2, 2, 3.3),
                                           quantized(3, 1.5, 2.8)}}});
  const auto paths = WithClass(doc, "path", "variant");
  ASSERT_THAT(paths, SizeIs(1));
  EXPECT_THAT(Vertices(*paths[0]), SizeIs(3)) << "the step without a quantized loss is left out";
  EXPECT_THAT(AllText(doc), HasSubstr("target quantized_val_loss 3.0000"));
  EXPECT_THAT(AllText(doc), HasSubstr("quantized validation loss"));
  const Document plain = Render(MakeExperiment({"qat"}, 3.0),
                                {{"qat", {quantized(0, 5, std::nullopt), quantized(1, 4, 4.4)}}});
  EXPECT_THAT(Vertices(*WithClass(plain, "path", "variant")[0]), SizeIs(2));
  EXPECT_THAT(AllText(plain), Not(HasSubstr("quantized")));
}

TEST(ExperimentReportTest, TargetLineOnlyWithATarget) {
  const Document with =
      Render(MakeExperiment({"baseline", "lr-high", "lr-low"}, 3.0), ThreeCurves());
  const auto lines = WithClass(with, "line", "target");
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_EQ(lines[0]->attrs.at("y1"), lines[0]->attrs.at("y2"));
  EXPECT_THAT(lines[0]->attrs.at("stroke-dasharray"), Not(IsEmpty()));
  EXPECT_THAT(WithClass(with, "text", "target-label"), SizeIs(1));

  const Document without =
      Render(MakeExperiment({"baseline", "lr-high", "lr-low"}, 0), ThreeCurves());
  EXPECT_THAT(WithClass(without, "line", "target"), IsEmpty());
  EXPECT_THAT(AllText(without), HasSubstr("no target yet"));
  for (double bad : {-1.0, kNaN, kInf}) {
    const Document doc = Render(MakeExperiment({"baseline"}, bad), ThreeCurves());
    EXPECT_THAT(WithClass(doc, "line", "target"), IsEmpty()) << bad;
  }
}

// The marker sits where the curve crosses the target: on a straight segment
// from (0, 4) to (10, 2), a crossing of loss 3 at $5 is the segment's middle.
TEST(ExperimentReportTest, CrossingMarkerSitsOnTheCurveAtTheTarget) {
  Experiment e = MakeExperiment({"fast", "slow", "never"}, 3.0);
  e.mutable_variants(0)->set_reached_target(true);
  e.mutable_variants(0)->set_cost_to_target_usd(5);
  e.mutable_variants(1)->set_reached_target(true);
  e.mutable_variants(1)->set_cost_to_target_usd(12);
  e.mutable_variants(2)->set_note("never reached the target");
  const Document doc = Render(e, {{"fast", {Eval(0, 4), Eval(10, 2)}},
                                  {"slow", {Eval(0, 4.5), Eval(8, 3.6), Eval(16, 2.5)}},
                                  {"never", {Eval(0, 5), Eval(14, 4)}}});
  const auto crossings = WithClass(doc, "circle", "crossing");
  ASSERT_THAT(crossings, SizeIs(2));
  EXPECT_EQ(crossings[0]->attrs.at("data-variant"), "fast");
  EXPECT_EQ(crossings[1]->attrs.at("data-variant"), "slow");
  const std::vector<XY> fast = Vertices(*WithClass(doc, "path", "variant")[0]);
  ASSERT_THAT(fast, SizeIs(2));
  EXPECT_NEAR(Attr(*crossings[0], "cx"), (fast[0].x + fast[1].x) / 2, 0.02);
  EXPECT_NEAR(Attr(*crossings[0], "cy"), (fast[0].y + fast[1].y) / 2, 0.02);
  EXPECT_GT(Attr(*crossings[1], "cx"), Attr(*crossings[0], "cx"));
  const Element& target = *WithClass(doc, "line", "target")[0];
  EXPECT_EQ(crossings[0]->attrs.at("cy"), target.attrs.at("y1"));
  EXPECT_EQ(crossings[0]->attrs.at("stroke"),
            WithClass(doc, "path", "variant")[0]->attrs.at("stroke"));
  const std::string text = AllText(doc);
  EXPECT_THAT(text, HasSubstr("$5.00 to target"));
  EXPECT_THAT(text, HasSubstr("$12.00 to target"));
  EXPECT_THAT(text, HasSubstr("never reached the target"));
}

// Recipe dollars on x (the default when every variant has step times):
// each evaluation at its step times the variant's price per step, the
// crossing at its recipe cost; billed dollars when asked, or when a variant
// has no step times.
TEST(ExperimentReportTest, RecipeDollarsAreTheDefaultAxisAndBilledOnRequest) {
  Experiment e = MakeExperiment({"naive", "packed"}, 3.0);
  auto* naive = e.mutable_variants(0);
  naive->set_recipe_usd_per_step(0.01);
  naive->set_reached_target(true);
  naive->set_recipe_cost_to_target_usd(1.0);  // step 100
  naive->set_cost_to_target_usd(3.0);         // billed on a busy machine
  auto* packed = e.mutable_variants(1);
  packed->set_recipe_usd_per_step(0.01);
  packed->set_reached_target(true);
  packed->set_recipe_cost_to_target_usd(0.5);
  packed->set_cost_to_target_usd(0.6);
  const std::vector<VariantCurve> curves = {
      {"naive", {EvalAt(0, 0, 5.0), EvalAt(50, 2.0, 3.5), EvalAt(150, 4.0, 2.5)}},
      {"packed", {EvalAt(0, 0, 5.0), EvalAt(25, 0.3, 3.5), EvalAt(75, 0.9, 2.5)}}};
  const Document recipe = Render(e, curves);
  EXPECT_THAT(WithClass(recipe, "text", "axis-label")[0]->text, HasSubstr("recipe dollars"));
  EXPECT_THAT(AllText(recipe), HasSubstr("$1.00 to target"));
  EXPECT_THAT(AllText(recipe), HasSubstr("$0.5 to target"));
  // naive's crossing at $1.00 is the middle of its segment from $0.50 to $1.50.
  const std::vector<XY> n = Vertices(*WithClass(recipe, "path", "variant")[0]);
  ASSERT_THAT(n, SizeIs(3));
  EXPECT_NEAR(Attr(*WithClass(recipe, "circle", "crossing")[0], "cx"), (n[1].x + n[2].x) / 2,
              0.02);

  ReportOptions billed;
  billed.billed = true;
  const Document b = Render(e, curves, billed);
  EXPECT_THAT(WithClass(b, "text", "axis-label")[0]->text, HasSubstr("dollars billed"));
  EXPECT_THAT(AllText(b), HasSubstr("$3.00 to target"));
  // A variant without step times: billed, saying why.
  e.mutable_variants(1)->set_recipe_usd_per_step(0);
  const Document fallback = Render(e, curves);
  EXPECT_THAT(WithClass(fallback, "text", "axis-label")[0]->text,
              HasSubstr("a variant has no step times"));
}

// With replicates, a whisker on the target line spans each variant's 90%
// interval of the mean recipe cost; none on a billed axis.
TEST(ExperimentReportTest, ReplicatesDrawTheIntervalOfTheMeanOnTheTargetLine) {
  Experiment e = MakeExperiment({"naive", "packed"}, 3.0);
  e.mutable_spec()->set_replicates(3);
  for (int i = 0; i < 2; ++i) {
    auto* v = e.mutable_variants(i);
    v->set_recipe_usd_per_step(0.01);
    v->set_reached_target(true);
    v->set_recipe_cost_to_target_usd(i == 0 ? 1.0 : 0.5);
    v->set_cost_to_target_usd(i == 0 ? 1.0 : 0.5);
  }
  auto* s = e.add_summaries();
  s->set_name("packed");
  s->set_replicates(3);
  s->set_recipe_cost_ci90_low_usd(0.4);
  s->set_recipe_cost_ci90_high_usd(0.7);
  const std::vector<VariantCurve> curves = {
      {"naive", {EvalAt(0, 0, 5.0), EvalAt(50, 0.5, 3.5), EvalAt(150, 1.5, 2.5)}},
      {"packed", {EvalAt(0, 0, 5.0), EvalAt(25, 0.25, 3.5), EvalAt(75, 0.75, 2.5)}}};
  const Document doc = Render(e, curves);
  const auto whiskers = WithClass(doc, "path", "interval");
  ASSERT_THAT(whiskers, SizeIs(1));
  EXPECT_EQ(whiskers[0]->attrs.at("data-variant"), "packed");
  EXPECT_THAT(AllText(doc), HasSubstr("90% interval of the mean over replicates"));
  s->set_recipe_cost_to_target_usd(0.55);
  s->set_reached_target(3);
  EXPECT_THAT(AllText(Render(e, curves)), HasSubstr("mean $0.55 to target, 3 of 3 runs"));
  // It spans $0.40 to $0.70 on the same scale as packed's crossing at $0.50.
  const std::vector<XY> w = Vertices(*whiskers[0]);
  ASSERT_GE(w.size(), 2u);
  const double cross = Attr(*WithClass(doc, "circle", "crossing")[1], "cx");
  EXPECT_NEAR((cross - w[0].x) / (w[1].x - w[0].x), (0.5 - 0.4) / (0.7 - 0.4), 0.01);
  ReportOptions billed;
  billed.billed = true;
  EXPECT_THAT(WithClass(Render(e, curves, billed), "path", "interval"), IsEmpty());
}

// The y axis zooms to the region around the target (the curves' early,
// steep part is alike for every variant), clipping what lies above it;
// --svg_y=full shows every loss.
TEST(ExperimentReportTest, TheYAxisZoomsToTheTarget) {
  const Experiment e = MakeExperiment({"baseline", "lr-high", "lr-low"}, 3.0);
  auto top_tick = [](const Document& d) {
    double top = -1;
    bool in_y = false;
    for (const Element& el : d.elements) {
      if (el.name == "g") in_y = el.attrs.count("class") && el.attrs.at("class") == "y-axis";
      double v;
      if (in_y && el.name == "text" && absl::SimpleAtod(el.text, &v)) top = std::max(top, v);
    }
    return top;
  };
  const Document zoomed = Render(e, ThreeCurves());
  EXPECT_LE(top_tick(zoomed), 4.5);
  EXPECT_THAT(WithClass(zoomed, "g", "curves"), SizeIs(1)) << "clipped to the plot";
  ReportOptions full;
  full.zoom = false;
  const Document all = Render(e, ThreeCurves(), full);
  EXPECT_GE(top_tick(all), 5.2);
  EXPECT_THAT(WithClass(all, "g", "curves"), IsEmpty());
}

TEST(ExperimentReportTest, NoCrossingMarkersWithoutATarget) {
  Experiment e = MakeExperiment({"fast"}, 0);
  e.mutable_variants(0)->set_reached_target(true);
  e.mutable_variants(0)->set_cost_to_target_usd(5);
  const Document doc = Render(e, {{"fast", {Eval(0, 4), Eval(10, 2)}}});
  EXPECT_THAT(WithClass(doc, "circle", "crossing"), IsEmpty());
}

TEST(ExperimentReportTest, WithoutPricesPlotsAgainstTokensAndSaysSo) {
  Experiment e = MakeExperiment({"a", "b"}, 3.0);
  e.mutable_variants(0)->set_reached_target(true);
  e.mutable_variants(0)->set_tokens_to_target(1'000'000);
  const Document doc = Render(e, {{"a", {Eval(0, 4, 0), Eval(0, 2, 2'000'000)}},
                                  {"b", {Eval(0, 5, 0), Eval(0, 4, 2'500'000)}}});
  const auto labels = WithClass(doc, "text", "axis-label");
  ASSERT_THAT(labels, SizeIs(2));
  EXPECT_THAT(labels[0]->text, HasSubstr("tokens"));
  EXPECT_THAT(labels[0]->text, Not(HasSubstr("dollars spent")));
  const auto crossings = WithClass(doc, "circle", "crossing");
  ASSERT_THAT(crossings, SizeIs(1));
  const std::vector<XY> a = Vertices(*WithClass(doc, "path", "variant")[0]);
  EXPECT_NEAR(Attr(*crossings[0], "cx"), (a[0].x + a[1].x) / 2, 0.02);
  EXPECT_THAT(AllText(doc), HasSubstr("1.00M tokens to target"));
  const std::vector<std::string> ticks = XTicks(doc);
  EXPECT_THAT(ticks, ElementsAre("0", "0.5M", "1.0M", "1.5M", "2.0M", "2.5M"));
}

TEST(ExperimentReportTest, DollarTicksAreRound) {
  const Document doc = Render(MakeExperiment({"a"}), {{"a", {Eval(0.05, 4), Eval(0.93, 3)}}});
  const std::vector<std::string> ticks = XTicks(doc);
  EXPECT_THAT(ticks, ElementsAre("$0", "$0.2", "$0.4", "$0.6", "$0.8", "$1.0"));
}

TEST(ExperimentReportTest, NonFiniteAndAbsurdValuesAreSkipped) {
  const Document doc = Render(MakeExperiment({"a", "b"}),
                              {{"a",
                                {Eval(1, 4), Eval(2, kNaN), Eval(3, kInf), Eval(kNaN, 3),
                                 Eval(kInf, 3), Eval(1e300, 3), Eval(4, -1e300), Eval(5, 2.5)}},
                               {"b", {Eval(1, kNaN), Eval(2, -kInf)}}});
  const auto paths = WithClass(doc, "path", "variant");
  ASSERT_THAT(paths, SizeIs(1));
  EXPECT_EQ(paths[0]->attrs.at("data-variant"), "a");
  EXPECT_THAT(Vertices(*paths[0]), SizeIs(2));
  EXPECT_THAT(RenderExperimentSvg(MakeExperiment({"a"}), {{"a", {Eval(1, 4), Eval(2, kNaN)}}}),
              Not(HasSubstr("nan")));
}

TEST(ExperimentReportTest, NothingToPlotStillRendersAndSaysSo) {
  for (const auto& [experiment, curves] :
       std::vector<std::pair<Experiment, std::vector<VariantCurve>>>{
           {Experiment(), {}},
           {MakeExperiment({"a", "b"}, 3.0), {}},
           {MakeExperiment({"a"}), {{"a", {}}}},
           {MakeExperiment({"a"}), {{"a", {Eval(kNaN, kNaN)}}}}}) {
    const Document doc = Render(experiment, curves);
    EXPECT_THAT(WithClass(doc, "path", "variant"), IsEmpty());
    EXPECT_THAT(WithClass(doc, "text", "empty"), SizeIs(1));
    EXPECT_THAT(AllText(doc), HasSubstr("no evaluations yet"));
    EXPECT_THAT(WithClass(doc, "text", "axis-label")[0]->text, HasSubstr("dollars"));
  }
  EXPECT_EQ(WithClass(Render(Experiment(), {}), "text", "title")[0]->text, "Experiment");
}

TEST(ExperimentReportTest, DegenerateCurvesRender) {
  // One evaluation: a path and a dot.
  Document doc = Render(MakeExperiment({"a"}), {{"a", {Eval(0.5, 3)}}});
  ASSERT_THAT(WithClass(doc, "path", "variant"), SizeIs(1));
  EXPECT_THAT(WithClass(doc, "circle", "point"), SizeIs(1));
  // Every loss the same, every cost the same.
  doc = Render(MakeExperiment({"a"}), {{"a", {Eval(2, 3), Eval(2, 3), Eval(2, 3)}}});
  EXPECT_THAT(Vertices(*WithClass(doc, "path", "variant")[0]), SizeIs(3));
  // No costs and no tokens: everything at x = 0, loss 0.
  doc = Render(MakeExperiment({"a"}, 3.0), {{"a", {Eval(0, 0), Eval(0, 0)}}});
  EXPECT_THAT(WithClass(doc, "path", "variant"), SizeIs(1));
  // Tiny and huge (but finite) spans.
  doc = Render(MakeExperiment({"a"}), {{"a", {Eval(1, 3), Eval(1 + 1e-13, 3 + 1e-13)}}});
  EXPECT_THAT(WithClass(doc, "path", "variant"), SizeIs(1));
  doc = Render(MakeExperiment({"a"}), {{"a", {Eval(-1e90, 1e-90), Eval(1e90, 1e90)}}});
  EXPECT_THAT(WithClass(doc, "path", "variant"), SizeIs(1));
  // A curve for a name the experiment does not list, and one listed twice.
  doc = Render(MakeExperiment({"a"}),
               {{"a", {Eval(1, 3)}}, {"b", {Eval(1, 2)}}, {"a", {Eval(9, 9)}}});
  EXPECT_THAT(WithClass(doc, "path", "variant"), SizeIs(2));
  EXPECT_THAT(WithClass(doc, "text", "legend-name"), SizeIs(2));
}

TEST(ExperimentReportTest, ManyVariantsFitAndRepeatColoursDashed) {
  std::vector<std::string> names;
  std::vector<VariantCurve> curves;
  for (int i = 0; i < 32; ++i) {
    names.push_back(absl::StrCat("v", i));
    curves.push_back({names.back(), {Eval(1, 4 + i * 0.01), Eval(2, 3 + i * 0.01)}});
  }
  const Document doc = Render(MakeExperiment(names, 3.2), curves);
  const auto paths = WithClass(doc, "path", "variant");
  ASSERT_THAT(paths, SizeIs(32));
  EXPECT_EQ(paths[10]->attrs.at("stroke"), paths[0]->attrs.at("stroke"));
  EXPECT_EQ(paths[0]->attrs.count("stroke-dasharray"), 0u);
  EXPECT_EQ(paths[10]->attrs.count("stroke-dasharray"), 1u);
  const double height = Attr(doc.elements[0], "height");
  for (const Element* t : WithClass(doc, "text", "legend-detail")) {
    EXPECT_LT(Attr(*t, "y"), height);
  }
}

}  // namespace
}  // namespace tally::cli
