// The malformed-input corpus (tests/loader/corpus, made by make_corpus.py): every entry must be
// rejected with exactly the error kind, rule and tensor its MANIFEST line names.
#include <dirent.h>
#include <sys/stat.h>

#include <fstream>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "loader/format/checkpoint.h"
#include "tests/loader/test_util.h"

namespace metaload {
namespace {

struct Entry {
  std::string path, kind, rule, tensor;
};

std::string corpus_dir() {
  return testing::source_dir() + "/tests/loader/corpus";
}

std::vector<Entry> load_manifest() {
  std::vector<Entry> out;
  std::ifstream f(corpus_dir() + "/MANIFEST");
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    Entry e;
    in >> e.path >> e.kind >> e.rule >> e.tensor;
    if (e.tensor == "-") e.tensor.clear();
    out.push_back(e);
  }
  return out;
}

class Corpus : public ::testing::TestWithParam<Entry> {};

TEST_P(Corpus, RejectedWithItsKindRuleAndTensor) {
  const Entry& e = GetParam();
  std::string path = corpus_dir() + "/" + e.path;
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0) << path;
  // Directory cases are copied first: in Bazel's runfiles every file is a symlink into the source
  // tree, which open_checkpoint rightly refuses as shards leading outside the directory.
  testing::TempDir scratch;
  if (S_ISDIR(st.st_mode)) {
    const std::string copy = scratch / e.path;
    testing::make_dir(copy);
    DIR* d = ::opendir(path.c_str());
    ASSERT_NE(d, nullptr);
    while (dirent* de = ::readdir(d)) {
      std::string n = de->d_name;
      if (n != "." && n != "..")
        testing::write_file(copy + "/" + n, testing::read_file(path + "/" + n));
    }
    ::closedir(d);
    path = copy;
  }
  try {
    if (S_ISDIR(st.st_mode)) {
      open_checkpoint(path);
    } else if (e.path.size() > 11 && e.path.substr(e.path.size() - 11) == ".index.json") {
      read_safetensors_index(path);
    } else {
      read_safetensors_header(path);
    }
    ADD_FAILURE() << e.path << " was accepted";
  } catch (const FormatError& err) {
    EXPECT_EQ(err.kind(), e.kind) << err.what();
    EXPECT_EQ(err.rule(), e.rule) << err.what();
    EXPECT_EQ(err.tensor(), e.tensor) << err.what();
    // Messages name the file (or, for directories, a file inside it).
    EXPECT_NE(std::string(err.what()).find(path), std::string::npos) << err.what();
  }
}

std::string test_name(const ::testing::TestParamInfo<Entry>& info) {
  std::string n;
  for (char c : info.param.path) n += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Malformed, Corpus, ::testing::ValuesIn(load_manifest()), test_name);

TEST(CorpusManifest, ListsEveryFileAndHasAtLeastThirty) {
  auto entries = load_manifest();
  EXPECT_GE(entries.size(), 30u);
  std::set<std::string> listed;
  for (const auto& e : entries) listed.insert(e.path);
  DIR* d = ::opendir(corpus_dir().c_str());
  ASSERT_NE(d, nullptr);
  while (dirent* de = ::readdir(d)) {
    std::string n = de->d_name;
    if (n == "." || n == ".." || n == "MANIFEST" || n == "make_corpus.py") continue;
    EXPECT_TRUE(listed.count(n)) << n << " is not in the MANIFEST";
  }
  ::closedir(d);
}

}  // namespace
}  // namespace metaload
