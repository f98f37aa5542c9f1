// README.md and docs/*.md point only at files inside the repository, and those files exist: every relative markdown
// link, and every `path` in backticks that starts at one of the repository's top-level folders.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

namespace fs = std::filesystem;

std::vector<fs::path> documents() {
  const fs::path root(CASTOR_SOURCE_DIR);
  std::vector<fs::path> docs = {root / "README.md"};
  for (const fs::directory_entry& e : fs::directory_iterator(root / "docs"))
    if (e.path().extension() == ".md") docs.push_back(e.path());
  return docs;
}

std::string read_text(const fs::path& path) { return castor::test::read_text(path.string()); }

// Whether `target` (relative to `from`'s folder, or to the root for a path in backticks) stays inside the repository
// and exists there.
bool inside_and_present(const fs::path& base, const std::string& target) {
  const fs::path root = fs::weakly_canonical(CASTOR_SOURCE_DIR);
  const fs::path p = fs::weakly_canonical(base / target);
  const std::string rel = p.lexically_relative(root).string();
  return !rel.empty() && rel.rfind("..", 0) != 0 && fs::exists(p);
}

}  // namespace

TEST(DocsLinks, PointOnlyAtFilesOfTheRepository) {
  const std::regex link(R"(\]\(([^)\s]+)\))");
  const std::regex code(R"(`([A-Za-z0-9_./-]+)`)");
  const std::regex outside(R"(`(\.\./|/work/|shared/)[^`]*`)");
  const std::vector<std::string> top = {"docs/",     "src/",   "include/", "tests/", "scripts/", "bench/",
                                        "examples/", "tools/", "cmake/",   "fuzz/",  ".ci/"};
  int checked = 0;
  for (const fs::path& doc : documents()) {
    const std::string text = read_text(doc);
    SCOPED_TRACE(doc.filename().string());
    for (auto it = std::sregex_iterator(text.begin(), text.end(), link); it != std::sregex_iterator(); ++it) {
      std::string target = (*it)[1].str();
      if (target.find("://") != std::string::npos || target[0] == '#' || target.rfind("mailto:", 0) == 0) continue;
      target = target.substr(0, target.find('#'));
      EXPECT_TRUE(inside_and_present(doc.parent_path(), target)) << "link to " << target;
      ++checked;
    }
    for (auto it = std::sregex_iterator(text.begin(), text.end(), code); it != std::sregex_iterator(); ++it) {
      const std::string path = (*it)[1].str();
      bool repo_path = false;
      for (const std::string& t : top) repo_path |= path.rfind(t, 0) == 0;
      if (!repo_path) continue;
      EXPECT_TRUE(inside_and_present(CASTOR_SOURCE_DIR, path)) << "`" << path << "`";
      ++checked;
    }
    for (auto it = std::sregex_iterator(text.begin(), text.end(), outside); it != std::sregex_iterator(); ++it)
      ADD_FAILURE() << "a path outside the repository: " << (*it)[0].str();
  }
  EXPECT_GT(checked, 10);  // the documents do name files
}
