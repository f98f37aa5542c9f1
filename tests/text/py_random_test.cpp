// CPython's random module reproduced (text/py_random.h) against /usr/bin/python3's own (tests/oracle/
// py_random_oracle.py): the Mersenne Twister's words after random.seed of 1- and 2-word integers, and random.sample's
// draws one after another from one generator, across seeds, population sizes and k on both of sample's branches (a
// pool where n <= setsize, rejection from a set past it).
#include <gtest/gtest.h>

#include "castor/fs.h"
#include "castor/json.h"
#include "test_util.h"
#include "text/py_random.h"

namespace castor::data {
namespace {

TEST(PyRandom, WordsAndSamplesArePythons) {
  const uint64_t seeds[] = {0, 1, 42, 1234, 4294967295ull, 4294967296ull, 0x123456789abcdefull};
  // (n, k): k = 0, 1, n; the setsize rule's edges (21 + 4^ceil(log4(3k)) for k > 5: n = 85/86 at k = 6, ...).
  const std::vector<std::pair<int64_t, int64_t>> draws = {
      {1, 1},   {1, 0},    {2, 2},     {5, 3},      {21, 5},    {22, 5},     {85, 6}, {86, 6},
      {200, 6}, {200, 1},  {10000, 9}, {40, 40},    {1000, 30}, {1001, 22},  {3, 2},  {100000, 3},
      {7, 7},   {149, 11}, {150, 11},  {2000, 100}, {600, 6},   {70000, 600}};
  Json::Array cases;
  for (uint64_t seed : seeds) {
    Json::Array d;
    for (const auto& [n, k] : draws) d.push_back(Json::Array{n, k});
    cases.push_back(Json::Object{{"seed", static_cast<int64_t>(seed)}, {"words", 1300}, {"draws", d}});
  }
  const test::ScratchDir dir("py_random");
  atomic_write_file(dir.file("cases.json"), Json(cases).dump());
  ASSERT_TRUE(test::run_oracle("py_random_oracle.py", {dir.file("cases.json"), dir.file("out.json")}));
  const Json want = Json::parse(test::read_text(dir.file("out.json")));
  for (size_t c = 0; c < std::size(seeds); ++c) {
    SCOPED_TRACE(seeds[c]);
    const Json& w = want.as_array().at(c);
    PyRandom words(seeds[c]);
    for (const Json& x : w.at("words").as_array()) ASSERT_EQ(words.next_u32(), static_cast<uint32_t>(x.as_int()));
    PyRandom r(seeds[c]);
    for (size_t i = 0; i < draws.size(); ++i) {
      std::vector<int64_t> theirs;
      for (const Json& x : w.at("samples").as_array().at(i).as_array()) theirs.push_back(x.as_int());
      EXPECT_EQ(r.sample(draws[i].first, draws[i].second), theirs) << draws[i].first << " " << draws[i].second;
    }
  }
  PyRandom r(1);
  EXPECT_THROW(r.sample(3, 4), Error);
}

}  // namespace
}  // namespace castor::data
