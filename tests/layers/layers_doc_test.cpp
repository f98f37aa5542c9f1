// docs/design.md's layer table says what cmake/layers.cmake enforces: the same layers in the same order, with the
// same uses, source directories and public headers.
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

struct Layer {
  std::string name;
  std::set<std::string> dirs, headers, uses;
};

using castor::test::read_text;

// The castor_layer(NAME DIRS ... HEADERS ... USES ...) calls, in order ("version" is generated, not in the doc).
std::vector<Layer> cmake_layers() {
  const std::string text = read_text(std::string(CASTOR_SOURCE_DIR) + "/cmake/layers.cmake");
  std::vector<Layer> out;
  const std::regex call(R"(\ncastor_layer\(([^)]*)\))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), call); it != std::sregex_iterator(); ++it) {
    std::istringstream words((*it)[1].str());
    Layer l;
    words >> l.name;
    std::set<std::string>* into = nullptr;
    for (std::string w; words >> w;) {
      if (w == "DIRS")
        into = &l.dirs;
      else if (w == "HEADERS")
        into = &l.headers;
      else if (w == "USES")
        into = &l.uses;
      else if (into && w != "version")
        into->insert(w);
    }
    out.push_back(l);
  }
  return out;
}

std::set<std::string> split_list(const std::string& s) {
  std::set<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) out.insert(item);
  }
  return out;
}

// The rows of the table headed "| layer | uses | where | ...".
std::vector<Layer> doc_layers() {
  std::istringstream lines(read_text(std::string(CASTOR_SOURCE_DIR) + "/docs/design.md"));
  std::vector<Layer> out;
  bool in_table = false;
  const std::regex headers(R"(include/castor/\{([^}]*)\}\.h)"), dir(R"(`src/([a-z_]+))");
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| layer | uses | where |", 0) == 0) {
      in_table = true;
      continue;
    }
    if (!in_table || line.rfind("|---", 0) == 0) continue;
    if (line.rfind("| ", 0) != 0) break;
    std::vector<std::string> cells;
    std::stringstream ss(line.substr(2));
    for (std::string cell; std::getline(ss, cell, '|');) cells.push_back(cell);
    if (cells.size() < 3) break;
    Layer l;
    l.name = cells[0].substr(0, cells[0].find(' '));
    const std::string uses = cells[1];
    if (uses.find("all") != std::string::npos)
      for (const Layer& below : out) l.uses.insert(below.name);
    else if (uses.find('-') == std::string::npos)
      l.uses = split_list(uses);
    std::smatch m;
    if (std::regex_search(cells[2], m, headers)) l.headers = split_list(m[1].str());
    for (auto it = std::sregex_iterator(cells[2].begin(), cells[2].end(), dir); it != std::sregex_iterator(); ++it)
      l.dirs.insert((*it)[1].str());
    out.push_back(l);
  }
  return out;
}

TEST(Layers, DesignDocTableMatchesTheBuild) {
  const std::vector<Layer> built = cmake_layers(), documented = doc_layers();
  ASSERT_FALSE(built.empty());
  ASSERT_EQ(documented.size(), built.size()) << "docs/design.md and cmake/layers.cmake list different layers";
  for (size_t i = 0; i < built.size(); ++i) {
    const Layer &b = built[i], &d = documented[i];
    EXPECT_EQ(d.name, b.name) << "layer " << i;
    EXPECT_EQ(d.uses, b.uses) << b.name << ": uses";
    EXPECT_EQ(d.dirs, b.dirs) << b.name << ": source directories";
    EXPECT_EQ(d.headers, b.headers) << b.name << ": public headers";
  }
}

}  // namespace
