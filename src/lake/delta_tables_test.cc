#include "lake/delta_tables.h"
#include "common/temp_dir_testing.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "oml_storage.h"

namespace oml::lake {
namespace {

namespace fs = std::filesystem;

class DeltaTablesTest : public ::testing::Test {
 protected:
  oml::testing::ScopedTempDir tmp_{"oml-lake-test"};
  const fs::path root_ = tmp_.path();
};

TEST_F(DeltaTablesTest, CreatesBronzeEventsAtVersionZero) {
  const fs::path lake = root_ / "lake";  // does not exist yet
  Status st = EnsureBronzeEvents(lake.string());
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(fs::is_regular_file(lake / "bronze" / "events" / "_delta_log" /
                                  "00000000000000000000.json"));
  auto v = TableVersion((lake / "bronze" / "events").string());
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 0);

  // The commit records the table name and every column.
  std::ifstream in(lake / "bronze" / "events" / "_delta_log" / "00000000000000000000.json");
  std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(log.find("\"name\":\"bronze.events\""), std::string::npos) << log;
  for (const char* col : {"tenant_id", "seq", "prev_hash", "event_hash", "event_type", "key_id",
                          "principal", "occurred_at", "signed_bytes", "signature", "outbox_seq"}) {
    EXPECT_NE(log.find(std::string("\\\"") + col + "\\\""), std::string::npos) << col;
  }
}

TEST_F(DeltaTablesTest, Idempotent) {
  ASSERT_TRUE(EnsureBronzeEvents(root_.string()).ok());
  Status again = EnsureBronzeEvents(root_.string() + "/");  // trailing slash: same table
  ASSERT_TRUE(again.ok()) << again.ToString();
  auto v = TableVersion(root_.string() + "/bronze/events");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 0);
}

TEST_F(DeltaTablesTest, FileUrlRoot) {
  ASSERT_TRUE(EnsureBronzeEvents("file://" + root_.string()).ok());
  auto v = TableVersion("file://" + root_.string() + "/bronze/events");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 0);
}

TEST_F(DeltaTablesTest, TableVersionOnEmptyDirIsNotFound) {
  auto v = TableVersion(root_.string());
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), Code::kNotFound) << v.status().ToString();

  auto missing = TableVersion((root_ / "does-not-exist").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound) << missing.status().ToString();
}

TEST_F(DeltaTablesTest, DifferentExistingSchemaIsFailedPrecondition) {
  const std::string uri = (root_ / "bronze" / "events").string();
  OmlStorageError err{};
  int64_t version = -1;
  int32_t created = 0, matches = 0;
  ASSERT_EQ(oml_storage_delta_create_table(uri.c_str(),
                                           R"([{"name":"tenant_id","type":"string","nullable":false}])",
                                           nullptr, nullptr, &version, &created, &matches, &err),
            OML_STORAGE_OK)
      << (err.message ? err.message : "");
  EXPECT_EQ(created, 1);
  EXPECT_EQ(version, 0);
  Status st = EnsureBronzeEvents(root_.string());
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.ToString();
}

TEST(DeltaStorageAbiTest, BadSchemaIsInvalidArgument) {
  OmlStorageError err{};
  int64_t version = -1;
  int32_t created = 0, matches = 0;
  int32_t rc = oml_storage_delta_create_table("/tmp/oml-never-created", R"([{"name":"x","type":"decimal"}])",
                                              nullptr, nullptr, &version, &created, &matches, &err);
  EXPECT_EQ(rc, OML_STORAGE_INVALID_ARGUMENT);
  EXPECT_EQ(err.code, OML_STORAGE_INVALID_ARGUMENT);
  ASSERT_NE(err.message, nullptr);
  oml_storage_free_string(err.message);
  EXPECT_FALSE(std::filesystem::exists("/tmp/oml-never-created"));
}

}  // namespace
}  // namespace oml::lake
