#include "common/secret_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/temp_dir_testing.h"

namespace oml {
namespace {

namespace fs = std::filesystem;

class SecretFileTest : public ::testing::Test {
 protected:
  static mode_t ModeOf(const fs::path& p) {
    struct stat st;
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    return st.st_mode & 07777;
  }
  static std::string Read(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // Names in dir_ other than `except`: leftover temp files show up here.
  std::vector<std::string> Others(const std::string& except) const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename() != except) out.push_back(e.path().filename().string());
    return out;
  }
  oml::testing::ScopedTempDir tmp_{"oml-secret-file-test"};
  const fs::path dir_ = tmp_.path();
};

TEST_F(SecretFileTest, WritesWithFinalModeWhateverTheUmask) {
  const mode_t old = ::umask(0);  // the most permissive umask: the mode must still be exact
  const fs::path p = dir_ / "token";
  Status s = WriteSecretFile(p.string(), "secret\n");
  ::umask(old);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(ModeOf(p), 0600u);
  EXPECT_EQ(Read(p), "secret\n");
  EXPECT_TRUE(Others("token").empty());
}

TEST_F(SecretFileTest, ReplaceSwapsTheWholeFile) {
  const fs::path p = dir_ / "superuser.url";
  std::ofstream(p) << "old contents that are longer than the new ones\n";
  ::chmod(p.c_str(), 0644);
  ASSERT_TRUE(WriteSecretFile(p.string(), "new\n").ok());
  EXPECT_EQ(Read(p), "new\n");
  EXPECT_EQ(ModeOf(p), 0600u);  // the new inode, not the old mode
  EXPECT_TRUE(Others("superuser.url").empty());
}

TEST_F(SecretFileTest, RefuseKeepsAnExistingFileAndSymlink) {
  const fs::path p = dir_ / "kek.key";
  std::ofstream(p) << "original\n";
  Status s = WriteSecretFile(p.string(), "other\n", 0600, IfExists::kRefuse);
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_EQ(s.message(), "refusing to overwrite existing file " + p.string());
  EXPECT_EQ(Read(p), "original\n");
  EXPECT_TRUE(Others("kek.key").empty());

  const fs::path link = dir_ / "link.key";
  fs::create_symlink(dir_ / "nowhere", link);  // dangling: must not be followed either
  s = WriteSecretFile(link.string(), "x", 0600, IfExists::kRefuse);
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_FALSE(fs::exists(dir_ / "nowhere"));
}

TEST_F(SecretFileTest, RefuseCreatesAMissingFile) {
  const fs::path p = dir_ / "dev-writer.token";
  ASSERT_TRUE(WriteSecretFile(p.string(), "t\n", 0600, IfExists::kRefuse).ok());
  EXPECT_EQ(Read(p), "t\n");
  EXPECT_EQ(ModeOf(p), 0600u);
  EXPECT_TRUE(Others("dev-writer.token").empty());
}

TEST_F(SecretFileTest, OtherModesAreExactToo) {
  const mode_t old = ::umask(077);
  const fs::path p = dir_ / "signing.key.pub";
  Status s = WriteSecretFile(p.string(), "{}\n", 0644);
  ::umask(old);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(ModeOf(p), 0644u);
}

TEST_F(SecretFileTest, MissingDirectoryFailsAndLeavesNothing) {
  Status s = WriteSecretFile((dir_ / "no" / "file").string(), "x");
  EXPECT_EQ(s.code(), Code::kInternal);
  EXPECT_NE(s.message().find((dir_ / "no" / "file").string()), std::string::npos) << s.message();
}

TEST_F(SecretFileTest, CreatePrivateDirsIgnoresTheUmaskAndReportsWhatItMade) {
  ASSERT_TRUE(fs::create_directory(dir_ / "a"));
  const mode_t old = ::umask(0);
  auto made = CreatePrivateDirs((dir_ / "a" / "b" / "c").string());
  ::umask(old);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_EQ(*made, (std::vector<std::string>{(dir_ / "a" / "b").string(), (dir_ / "a" / "b" / "c").string()}));
  EXPECT_EQ(ModeOf(dir_ / "a" / "b"), 0700u);
  EXPECT_EQ(ModeOf(dir_ / "a" / "b" / "c"), 0700u);
  auto again = CreatePrivateDirs((dir_ / "a" / "b" / "c").string());
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->empty());

  std::ofstream(dir_ / "file") << "x";
  auto bad = CreatePrivateDirs((dir_ / "file" / "d").string());
  EXPECT_EQ(bad.status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(bad.status().message(), "not a directory: " + (dir_ / "file").string());
}

TEST_F(SecretFileTest, KeyFileModeIsChecked) {
  const fs::path p = dir_ / "signing.key";
  std::ofstream(p) << "k";
  ::chmod(p.c_str(), 0600);
  EXPECT_TRUE(CheckKeyFilePermissions(p.string(), false).ok());
  ::chmod(p.c_str(), 0400);
  EXPECT_TRUE(CheckKeyFilePermissions(p.string(), false).ok());
  ::chmod(p.c_str(), 0640);
  Status s = CheckKeyFilePermissions(p.string(), false);
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_EQ(s.message(), "key file " + p.string() + " has mode 0640 (group or others may use it); run `chmod 600 " +
                             p.string() +
                             "` (where a container mount cannot set modes, set allow_insecure_key_files = true in "
                             "oml.toml or OML_ALLOW_INSECURE_KEY_FILES=1)");
  EXPECT_TRUE(CheckKeyFilePermissions(p.string(), true).ok());  // the override: a warning only

  // A symlink is followed: the file it names is what counts.
  const fs::path link = dir_ / "mounted.key";
  fs::create_symlink(p, link);
  EXPECT_EQ(CheckKeyFilePermissions(link.string(), false).code(), Code::kFailedPrecondition);
  ::chmod(p.c_str(), 0600);
  EXPECT_TRUE(CheckKeyFilePermissions(link.string(), false).ok());
  // Missing: left to the reader, which reports kNotFound.
  EXPECT_TRUE(CheckKeyFilePermissions((dir_ / "missing").string(), false).ok());
}

TEST_F(SecretFileTest, KeyFileOwnerIsChecked) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give the file away";
  const fs::path p = dir_ / "kek.key";
  std::ofstream(p) << "k";
  ::chmod(p.c_str(), 0600);
  ASSERT_EQ(::chown(p.c_str(), 65534, 65534), 0);
  Status s = CheckKeyFilePermissions(p.string(), false);
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_EQ(s.message(), "key file " + p.string() + " is owned by uid 65534, not by this process (uid 0); run `chown 0 " +
                             p.string() +
                             "` (where a container mount cannot set modes, set allow_insecure_key_files = true in "
                             "oml.toml or OML_ALLOW_INSECURE_KEY_FILES=1)");
  EXPECT_TRUE(CheckKeyFilePermissions(p.string(), true).ok());
}

}  // namespace
}  // namespace oml
