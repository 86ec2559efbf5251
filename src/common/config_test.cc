#include "common/config.h"
#include "common/temp_dir_testing.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

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

TEST_F(ConfigTest, CursorSecretFileDefaultsUnderHomeAndComesFromFileOrEnvironment) {
  unsetenv("OML_CURSOR_SECRET_FILE");
  auto d = LoadConfig();
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->cursor_secret_file, (dir_ / "keys/cursor.key").string());
  WriteToml("cursor_secret_file = \"/run/secrets/oml/cursor.key\"\n");
  auto f = LoadConfig();
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->cursor_secret_file, "/run/secrets/oml/cursor.key");
  setenv("OML_CURSOR_SECRET_FILE", "/etc/oml/cursor.key", 1);
  auto e = LoadConfig();
  unsetenv("OML_CURSOR_SECRET_FILE");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->cursor_secret_file, "/etc/oml/cursor.key");
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

TEST_F(ConfigTest, UploadMinChunkDefaultsToAMebibyteOrTheRequestLimitAndMayNotExceedIt) {
  auto d = LoadConfig();
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->upload_min_chunk_bytes, 1u << 20);
  WriteToml("max_body_bytes = 10\n");  // requests of at most 60 + 64 KiB
  auto small = LoadConfig();
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  EXPECT_EQ(small->http_max_request_bytes, 60u + 65536u);
  EXPECT_EQ(small->upload_min_chunk_bytes, 60u + 65536u);
  WriteToml("max_body_bytes = 10\nupload_min_chunk_bytes = 1048576\n");
  auto over = LoadConfig();
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(over.status().message(),
            "setting upload_min_chunk_bytes: must be at most http_max_request_bytes (65596), or no chunk but the last "
            "could pass");
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

TEST_F(ConfigTest, BucketsDefaultComeFromFileOrEnvironmentAndAreValidated) {
  unsetenv("OML_QUARANTINE_BUCKET");
  unsetenv("OML_BODIES_BUCKET");
  auto c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->quarantine_bucket, "oml-quarantine");
  EXPECT_EQ(c->bodies_bucket, "oml-bodies");

  WriteToml("quarantine_bucket = \"q.example-1\"\nbodies_bucket = \"b-file\"\n");
  setenv("OML_BODIES_BUCKET", "b-env", 1);  // the environment wins over the file
  c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->quarantine_bucket, "q.example-1");
  EXPECT_EQ(c->bodies_bucket, "b-env");

  setenv("OML_BODIES_BUCKET", "Oml_Bodies", 1);
  c = LoadConfig();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(c.status().message(), "setting bodies_bucket: not a valid S3 bucket name: 'Oml_Bodies'");

  setenv("OML_BODIES_BUCKET", "q.example-1", 1);  // the same bucket as quarantine
  c = LoadConfig();
  unsetenv("OML_BODIES_BUCKET");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "settings quarantine_bucket and bodies_bucket must differ: 'q.example-1'");
}

TEST(BucketNameTest, FollowsTheS3Rules) {
  for (const char* ok : {"abc", "oml-quarantine", "oml-bodies", "a.b-c.d9", "1bucket",
                         "a23456789012345678901234567890123456789012345678901234567890123"}) {
    EXPECT_TRUE(IsValidBucketName(ok)) << ok;
  }
  for (const char* bad : {"", "ab", "a234567890123456789012345678901234567890123456789012345678901234",
                          "Upper", "under_score", "-lead", "trail-", ".lead", "trail.", "a..b", "a.-b",
                          "a-.b", "192.168.1.1", "xn--bucket", "sthree-x", "b-s3alias", "b--ol-s3",
                          "with/slash", "sp ace"}) {
    EXPECT_FALSE(IsValidBucketName(bad)) << bad;
  }
  EXPECT_TRUE(IsValidBucketName("192.168.1"));  // three groups: not an IPv4 address
}

TEST_F(ConfigTest, PdfExtractorLimitsDefaultComeFromFileOrEnvironmentAndAreBounded) {
  for (const char* v : {"OML_PDF_EXTRACT_MEMORY_MB", "OML_PDF_EXTRACT_CPU_S", "OML_PDF_EXTRACT_TIMEOUT_S",
                        "OML_PDF_EXTRACT_MAX", "OML_PDF_EXTRACT_PER_TENANT"})
    unsetenv(v);
  auto c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(std::vector<int64_t>({c->pdf_extract_memory_mb, c->pdf_extract_cpu_s, c->pdf_extract_timeout_s,
                                  c->pdf_extract_max, c->pdf_extract_per_tenant}),
            std::vector<int64_t>({1024, 10, 20, 4, 2}));
  WriteToml("pdf_extract_memory_mb = 256\npdf_extract_cpu_s = 3\npdf_extract_timeout_s = 7\npdf_extract_max = 8\n");
  setenv("OML_PDF_EXTRACT_PER_TENANT", "5", 1);
  c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(std::vector<int64_t>({c->pdf_extract_memory_mb, c->pdf_extract_cpu_s, c->pdf_extract_timeout_s,
                                  c->pdf_extract_max, c->pdf_extract_per_tenant}),
            std::vector<int64_t>({256, 3, 7, 8, 5}));
  setenv("OML_PDF_EXTRACT_PER_TENANT", "9", 1);
  c = LoadConfig();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "setting pdf_extract_per_tenant: must be at most pdf_extract_max");
  unsetenv("OML_PDF_EXTRACT_PER_TENANT");
  setenv("OML_PDF_EXTRACT_MEMORY_MB", "191", 1);
  c = LoadConfig();
  unsetenv("OML_PDF_EXTRACT_MEMORY_MB");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "setting pdf_extract_memory_mb: must be 192..65536");
}

TEST_F(ConfigTest, ReviewSettingsDefaultComeFromFileOrEnvironmentAndAreBounded) {
  for (const char* v : {"OML_DENY_LIST_FILE", "OML_CLAMD_ADDRESS", "OML_CLAMD_TIMEOUT_MS", "OML_REVIEW_MAX_TEXT_BYTES"})
    unsetenv(v);
  auto c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->deny_list_file, "");
  EXPECT_EQ(c->clamd_address, "");
  EXPECT_EQ(c->clamd_timeout_ms, 30000);
  EXPECT_EQ(c->review_max_text_bytes, 8u << 20);

  WriteToml("deny_list_file = \"/etc/oml/deny.toml\"\nclamd_address = \"unix:/run/clamav/clamd.ctl\"\n"
            "clamd_timeout_ms = 5000\nreview_max_text_bytes = 4096\n");
  setenv("OML_CLAMD_ADDRESS", "127.0.0.1:3310", 1);  // the environment wins over the file
  c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->deny_list_file, "/etc/oml/deny.toml");
  EXPECT_EQ(c->clamd_address, "127.0.0.1:3310");
  EXPECT_EQ(c->clamd_timeout_ms, 5000);
  EXPECT_EQ(c->review_max_text_bytes, 4096u);

  setenv("OML_REVIEW_MAX_TEXT_BYTES", "1023", 1);
  c = LoadConfig();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "setting review_max_text_bytes: must be 1024..1073741824");
  unsetenv("OML_REVIEW_MAX_TEXT_BYTES");
  setenv("OML_CLAMD_TIMEOUT_MS", "0", 1);
  c = LoadConfig();
  unsetenv("OML_CLAMD_TIMEOUT_MS");
  unsetenv("OML_CLAMD_ADDRESS");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "setting clamd_timeout_ms: must be 1..3600000");
}

TEST_F(ConfigTest, TlogOriginIsAKeyNamePrefix) {
  unsetenv("OML_TLOG_ORIGIN");
  auto c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->tlog_origin, "oml.local");
  WriteToml("tlog_origin = \"oml.example.com/log\"\n");
  c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->tlog_origin, "oml.example.com/log");
  for (const char* bad : {"a b", "a+b", "caf\xC3\xA9", "a\nb"}) {  // (an empty variable is an unset one)
    setenv("OML_TLOG_ORIGIN", bad, 1);
    c = LoadConfig();
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().message().substr(0, 76),
              "setting tlog_origin: 1..200 printable ASCII characters, no space or '+' (e.g") << bad;
  }
  setenv("OML_TLOG_ORIGIN", std::string(201, 'a').c_str(), 1);
  EXPECT_FALSE(LoadConfig().ok());
  unsetenv("OML_TLOG_ORIGIN");
}

TEST_F(ConfigTest, TlogWitnessAndPublisherSettings) {
  unsetenv("OML_TLOG_ORIGIN");
  auto c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->tlog_witnesses, "");
  EXPECT_EQ(c->tlog_witness_quorum, 0);
  EXPECT_EQ(c->tlog_witness_timeout_ms, 5000);
  EXPECT_EQ(c->tlog_publish_ms, 1000);
  // Witnesses under the default origin: refused, naming the setting.
  setenv("OML_TLOG_WITNESSES", "http://127.0.0.1:8473 w+00000000+BAAA", 1);
  c = LoadConfig();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().rfind("setting tlog_witnesses: set tlog_origin to this deployment's own name first", 0),
            0u)
      << c.status().message();
  setenv("OML_TLOG_ORIGIN", "oml.example.com/log", 1);
  c = LoadConfig();
  ASSERT_TRUE(c.ok()) << c.status().ToString();  // the entries themselves are parsed by journal::ParseTlogWitnesses
  EXPECT_EQ(c->tlog_witnesses, "http://127.0.0.1:8473 w+00000000+BAAA");
  setenv("OML_TLOG_WITNESS_QUORUM", "-1", 1);
  EXPECT_EQ(LoadConfig().status().message(), "setting tlog_witness_quorum: not a non-negative integer: '-1'");
  setenv("OML_TLOG_WITNESS_QUORUM", "101", 1);
  EXPECT_EQ(LoadConfig().status().message(), "setting tlog_witness_quorum: 0 (a majority) or 1..the number of tlog_witnesses");
  setenv("OML_TLOG_WITNESS_QUORUM", "2", 1);
  EXPECT_EQ(LoadConfig()->tlog_witness_quorum, 2);
  setenv("OML_TLOG_WITNESS_TIMEOUT_MS", "99", 1);
  EXPECT_EQ(LoadConfig().status().message(), "setting tlog_witness_timeout_ms: 100..600000");
  unsetenv("OML_TLOG_WITNESS_TIMEOUT_MS");
  for (const char* bad : {"50", "99", "3600001"}) {
    setenv("OML_TLOG_PUBLISH_MS", bad, 1);
    EXPECT_EQ(LoadConfig().status().message(), "setting tlog_publish_ms: 0 (no publisher on this replica) or 100..3600000")
        << bad;
  }
  setenv("OML_TLOG_PUBLISH_MS", "0", 1);
  EXPECT_EQ(LoadConfig()->tlog_publish_ms, 0);
  for (const char* v : {"OML_TLOG_PUBLISH_MS", "OML_TLOG_WITNESS_QUORUM", "OML_TLOG_WITNESSES", "OML_TLOG_ORIGIN"}) unsetenv(v);
}

}  // namespace
}  // namespace oml
