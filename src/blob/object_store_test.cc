#include "blob/object_store.h"
#include "common/temp_dir_testing.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace oml::blob {
namespace {

namespace fs = std::filesystem;

class LocalObjectStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = OpenObjectStore("file://" + (root_ / "store").string());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(store).value();
  }
  oml::testing::ScopedTempDir tmp_{"oml-blob-test"};
  const fs::path root_ = tmp_.path();
  std::unique_ptr<ObjectStore> store_;  // destroyed before tmp_ removes its directory
};

TEST_F(LocalObjectStoreTest, OpenCreatesDirectory) {
  EXPECT_TRUE(fs::is_directory(root_ / "store"));
}

TEST_F(LocalObjectStoreTest, PutGetOverwrite) {
  ASSERT_TRUE(store_->Put("oml-heads/t1", "first").ok());
  auto got = store_->Get("oml-heads/t1");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ(**got, "first");

  ASSERT_TRUE(store_->Put("oml-heads/t1", "second, longer").ok());
  got = store_->Get("oml-heads/t1");
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ(**got, "second, longer");
  // The object is a real file under the directory.
  EXPECT_TRUE(fs::is_regular_file(root_ / "store" / "oml-heads" / "t1"));
}

TEST_F(LocalObjectStoreTest, BinaryAndEmptyValues) {
  std::string bin("a\0b\xff\x00z", 6);
  ASSERT_TRUE(store_->Put("bin", bin).ok());
  ASSERT_TRUE(store_->Put("empty", "").ok());
  auto got = store_->Get("bin");
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ(**got, bin);
  got = store_->Get("empty");
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ(**got, "");
}

TEST_F(LocalObjectStoreTest, GetMissingIsNullopt) {
  auto got = store_->Get("no/such/key");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_FALSE(got->has_value());
}

TEST_F(LocalObjectStoreTest, ListSortedByPrefix) {
  for (const char* k : {"oml-heads/t2", "oml-heads/t1", "other/x", "oml-heads/sub/t3", "oml-headsx"}) {
    ASSERT_TRUE(store_->Put(k, k).ok()) << k;
  }
  auto all = store_->List("");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(*all, (std::vector<std::string>{"oml-heads/sub/t3", "oml-heads/t1", "oml-heads/t2",
                                            "oml-headsx", "other/x"}));

  auto heads = store_->List("oml-heads/");
  ASSERT_TRUE(heads.ok());
  EXPECT_EQ(*heads, (std::vector<std::string>{"oml-heads/sub/t3", "oml-heads/t1", "oml-heads/t2"}));

  // Plain string prefix, like S3.
  auto partial = store_->List("oml-heads/t");
  ASSERT_TRUE(partial.ok());
  EXPECT_EQ(*partial, (std::vector<std::string>{"oml-heads/t1", "oml-heads/t2"}));

  auto none = store_->List("nothing/");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST_F(LocalObjectStoreTest, Delete) {
  ASSERT_TRUE(store_->Put("a/b", "1").ok());
  ASSERT_TRUE(store_->Put("a/c", "2").ok());
  ASSERT_TRUE(store_->Delete("a/b").ok());
  auto got = store_->Get("a/b");
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
  auto keys = store_->List("");
  ASSERT_TRUE(keys.ok());
  EXPECT_EQ(*keys, (std::vector<std::string>{"a/c"}));
  // Deleting a missing key is fine.
  EXPECT_TRUE(store_->Delete("a/b").ok());
}

TEST_F(LocalObjectStoreTest, BadKeysAreInvalidArgument) {
  EXPECT_EQ(store_->Put("", "x").code(), Code::kInvalidArgument);
  EXPECT_EQ(store_->Put("../escape", "x").code(), Code::kInvalidArgument);
  EXPECT_EQ(store_->Put("a//b", "x").code(), Code::kInvalidArgument);
  EXPECT_FALSE(fs::exists(root_ / "escape"));
}

TEST_F(LocalObjectStoreTest, BareAbsolutePathIsLocal) {
  ASSERT_TRUE(store_->Put("k", "v").ok());
  auto again = OpenObjectStore((root_ / "store").string());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto got = (*again)->Get("k");
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ(**got, "v");
}

TEST(OpenObjectStoreTest, BadSchemeIsInvalidArgument) {
  for (const char* url : {"gs://bucket/x", "http://example.com/x", "relative/dir", ""}) {
    auto s = OpenObjectStore(url);
    ASSERT_FALSE(s.ok()) << url;
    EXPECT_EQ(s.status().code(), Code::kInvalidArgument) << url << ": " << s.status().ToString();
  }
}

}  // namespace
}  // namespace oml::blob
