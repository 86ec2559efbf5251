#include "common/config.h"
#include "common/temp_dir_testing.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace oml {
namespace {

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("OML_HOME", dir_.c_str(), 1);
    for (const char* v : {"OML_DATABASE_URL", "OML_LISTEN", "OML_MAX_BODY_BYTES"}) unsetenv(v);
  }
  void WriteToml(const std::string& s) { std::ofstream(dir_ / "oml.toml") << s; }
  oml::testing::ScopedTempDir tmp_{"oml-config-test"};
  const std::filesystem::path dir_ = tmp_.path();
};

TEST_F(ConfigTest, DefaultsDeriveFromHome) {
  auto c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->listen, "127.0.0.1:8470");
  EXPECT_EQ(c->ListenPort(), 8470);
  EXPECT_EQ(c->signing_key_file, (dir_ / "keys/signing.key").string());
  EXPECT_EQ(c->lake_root, (dir_ / "lake").string());
  EXPECT_EQ(c->max_body_bytes, 1u << 20);
}

TEST_F(ConfigTest, EnvironmentOverridesFile) {
  WriteToml("listen = \"127.0.0.1:9000\"\ndatabase_url = \"postgresql://file\"\nmax_body_bytes = 10\n");
  setenv("OML_LISTEN", "127.0.0.1:9100", 1);
  auto c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->listen, "127.0.0.1:9100");
  EXPECT_EQ(c->database_url, "postgresql://file");
  EXPECT_EQ(c->max_body_bytes, 10u);
  unsetenv("OML_LISTEN");
}

TEST_F(ConfigTest, UnknownKeyIsRejected) {
  WriteToml("lisen = \"x\"\n");
  auto c = LoadConfig();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  EXPECT_NE(c.status().message().find("unknown setting 'lisen'"), std::string::npos);
}

TEST_F(ConfigTest, BadNumberIsRejected) {
  setenv("OML_MAX_BODY_BYTES", "12x", 1);
  auto c = LoadConfig();
  unsetenv("OML_MAX_BODY_BYTES");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "setting max_body_bytes: not a non-negative integer: '12x'");
}

TEST_F(ConfigTest, AllowInsecureKeyFilesDefaultsOffAndComesFromFileOrEnvironment) {
  unsetenv("OML_ALLOW_INSECURE_KEY_FILES");
  auto c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->allow_insecure_key_files);
  WriteToml("allow_insecure_key_files = true\n");
  c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->allow_insecure_key_files);
  setenv("OML_ALLOW_INSECURE_KEY_FILES", "0", 1);  // the environment wins over the file
  c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->allow_insecure_key_files);
  setenv("OML_ALLOW_INSECURE_KEY_FILES", "maybe", 1);
  c = LoadConfig();
  unsetenv("OML_ALLOW_INSECURE_KEY_FILES");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "setting allow_insecure_key_files: not a boolean (true/false, 1/0, yes/no, on/off): 'maybe'");
}

}  // namespace
}  // namespace oml
