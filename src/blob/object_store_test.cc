#include "blob/object_store.h"
#include "blob/object_store_testing.h"
#include "common/temp_dir_testing.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <thread>
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

TEST_F(LocalObjectStoreTest, ListMetaGivesSizeAndModificationTime) {
  const int64_t before = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch()).count();
  ASSERT_TRUE(store_->Put("t/b", "12345").ok());
  ASSERT_TRUE(store_->Put("t/a", "").ok());
  ASSERT_TRUE(store_->Put("u/c", "xy").ok());
  auto listed = store_->ListMeta("t/");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].key, "t/a");
  EXPECT_EQ((*listed)[0].size, 0u);
  EXPECT_EQ((*listed)[1].key, "t/b");
  EXPECT_EQ((*listed)[1].size, 5u);
  for (const auto& m : *listed) {
    // File systems keep whole seconds on some mounts: allow the second the Put began in.
    EXPECT_GE(m.modified_ms, before - 1000) << m.key;
    EXPECT_LE(m.modified_ms, before + 60000) << m.key;
  }
  auto keys = store_->List("");
  ASSERT_TRUE(keys.ok());
  auto all = store_->ListMeta("");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), keys->size());
  for (size_t i = 0; i < keys->size(); ++i) EXPECT_EQ((*all)[i].key, (*keys)[i]);
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

// What a killed write leaves (<name>#<digits>, hidden from List) goes once older than the
// grace; a younger one, and objects whose names only look alike, stay.
TEST_F(LocalObjectStoreTest, SweepStagingRemovesOnlyOldStagingFiles) {
  const fs::path dir = root_ / "store" / "t1";
  fs::create_directories(dir / "deep");
  auto write = [](const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; };
  const auto old = fs::file_time_type::clock::now() - std::chrono::hours(2);
  for (const char* name : {"obj#12", "deep/obj#90000000010000000002"}) {
    write(dir / name, "partial");
    fs::last_write_time(dir / name, old);
  }
  write(dir / "young#7", "in progress");
  // Objects whose names hold '#': after the first '#' not only digits (LocalFileSystem's rule).
  const std::vector<std::string> objects = {"t1/a#x#12", "t1/looks#like", "t1/plain"};
  for (const auto& key : objects) {
    ASSERT_TRUE(store_->Put(key, "an object").ok()) << key;
    fs::last_write_time(root_ / "store" / key, old);
  }
  auto listed = store_->List("t1/");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(*listed, objects);  // staging files are hidden

  auto n = store_->SweepStaging(std::chrono::hours(1));
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 2u);
  EXPECT_FALSE(fs::exists(dir / "obj#12"));
  EXPECT_FALSE(fs::exists(dir / "deep/obj#90000000010000000002"));
  EXPECT_TRUE(fs::exists(dir / "young#7"));
  auto again = store_->SweepStaging(std::chrono::hours(1));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 0u);
  EXPECT_EQ(*store_->List("t1/"), objects);
  auto young = store_->SweepStaging(std::chrono::seconds(0));
  ASSERT_TRUE(young.ok());
  EXPECT_EQ(*young, 1u);
}

// A local resumable write takes its parts' aligned middles past the page cache (O_DIRECT, the
// adapter's write_staging): whatever the offsets, lengths and syncs, and a put that rewinds to an
// earlier offset, the object holds exactly the bytes a plain pwrite of each put would leave. The
// sizes straddle the 4 KiB blocks, the 64 KiB direct minimum and the 256 KiB bounce buffer.
void ResumablePutsLeaveExactlyTheirBytes(ObjectStore* store_, const std::string& name = "t1", uint32_t seed0 = 12345) {
  const std::string staging = name + "/up/object";
  auto handle = store_->ResumableStart(staging);
  ASSERT_TRUE(handle.ok()) << handle.status().ToString();
  std::string expect;
  uint32_t seed = seed0;
  auto piece = [&](size_t n) {
    std::string p(n, '\0');
    for (auto& c : p) c = static_cast<char>((seed = seed * 1103515245u + 12345u) >> 16);
    return p;
  };
  const std::vector<size_t> sizes = {100,    70000,   (1u << 20) + 13, 300000, 5,     4096 * 64,
                                     4096,   65536,   262144 + 4095,   1,      65535, 3 * 262144 + 1};
  uint32_t part = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::string p = piece(sizes[i]);
    auto put = store_->ResumablePut(staging, *handle, part++, expect.size(), p, /*sync=*/i % 3 == 2);
    ASSERT_TRUE(put.ok()) << "put " << i << ": " << put.status().ToString();
    expect += p;
    // A put that never committed is cut off by the next one at an earlier offset.
    if (i == 6) {
      const uint64_t back = expect.size() - 70001;
      const std::string again = piece(200000);
      auto rewound = store_->ResumablePut(staging, *handle, part++, back, again, /*sync=*/false);
      ASSERT_TRUE(rewound.ok()) << rewound.status().ToString();
      expect.resize(back);
      expect += again;
    }
  }
  // A put past the file's end is refused, never padded.
  auto past = store_->ResumablePut(staging, *handle, part, expect.size() + 1, piece(100000), /*sync=*/true);
  EXPECT_EQ(past.status().code(), Code::kNotFound) << past.status().ToString();
  ASSERT_TRUE(store_->ResumablePut(staging, *handle, part, expect.size(), "", /*sync=*/true).ok());
  ASSERT_TRUE(store_->ResumableFinish(staging, *handle, {}, expect.size(), name + "/obj").ok());
  auto got = store_->Get(name + "/obj");
  ASSERT_TRUE(got.ok() && got->has_value());
  ASSERT_EQ((*got)->size(), expect.size());
  EXPECT_TRUE(**got == expect) << "the object's bytes differ from the puts'";
}

TEST_F(LocalObjectStoreTest, ResumablePutsAtAnyOffsetLeaveExactlyTheirBytes) {
  const uint64_t direct = DirectWriteCount();
  ResumablePutsLeaveExactlyTheirBytes(store_.get());
  // The puts of at least 64 KiB of whole blocks went out with O_DIRECT (not through the fallback,
  // which would hide an alignment error), unless this file system refuses it at open.
  if (DirectWriteCount() == direct) {
    const int fd = ::open((root_ / "probe").c_str(), O_CREAT | O_WRONLY | O_DIRECT, 0600);
    if (fd >= 0) ::close(fd);
    ASSERT_LT(fd, 0) << "O_DIRECT is available here, but no put used it";
    GTEST_SKIP() << "the temporary directory's file system refuses O_DIRECT: only the fallback ran";
  }
  EXPECT_GE(DirectWriteCount() - direct, 7u);
}

// Two writes at once (two uploads' PATCHes in one server) share the bounce-buffer pool: each
// object still holds exactly its own puts' bytes.
TEST_F(LocalObjectStoreTest, ConcurrentResumableWritesKeepTheirOwnBytes) {
  std::thread other([&] { ResumablePutsLeaveExactlyTheirBytes(store_.get(), "t2", 777); });
  ResumablePutsLeaveExactlyTheirBytes(store_.get(), "t1", 12345);
  other.join();
}

// The same on tmpfs, which refuses O_DIRECT before Linux 6.6 (every byte through the page cache)
// and takes it since.
TEST(LocalObjectStoreOnTmpfsTest, ResumablePutsAtAnyOffsetLeaveExactlyTheirBytes) {
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  oml::testing::ScopedTempDir shm{"/dev/shm/oml-blob-test"};
  auto store = OpenObjectStore("file://" + (shm.path() / "store").string());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ResumablePutsLeaveExactlyTheirBytes(store->get());
}

// Forwards to a store and counts the SweepStaging calls that returned.
class CountingSweeps : public testing::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  Result<uint64_t> SweepStaging(std::chrono::seconds grace) override {
    auto n = ForwardingStore::SweepStaging(grace);
    sweeps_.fetch_add(1);
    return n;
  }
  int sweeps() const { return sweeps_.load(); }

 private:
  std::atomic<int> sweeps_{0};
};

// `oml serve` and `oml lakewriter` run a StagingSweeper: one pass at start, then one every
// interval. With an interval of an hour only the pass at start runs: it removes what was left
// before, and a staging file left after it stays. With a short interval, a staging file that a
// killed write leaves while the sweeper runs (written after its first pass returned, mtime two
// hours back) is removed by a later pass; a young one and the objects stay. Once the sweeper is
// gone, nothing is removed any more.
TEST_F(LocalObjectStoreTest, StagingSweeperSweepsAtStartAndThenEveryInterval) {
  using namespace std::chrono_literals;
  const fs::path dir = root_ / "store" / "t1";
  fs::create_directories(dir);
  auto write_old = [&](const std::string& name) {
    std::ofstream(dir / name, std::ios::binary) << "partial";
    fs::last_write_time(dir / name, fs::file_time_type::clock::now() - std::chrono::hours(2));
  };
  CountingSweeps counting(store_.get());
  auto wait_for_passes = [&](int n) {
    const auto start = std::chrono::steady_clock::now();
    while (counting.sweeps() < n) {
      ASSERT_LT(std::chrono::steady_clock::now() - start, 5s) << "pass " << n << " never came";
      std::this_thread::sleep_for(5ms);
    }
  };
  ASSERT_TRUE(store_->Put("t1/object", "an object").ok());
  write_old("before-start#1");
  {
    StagingSweeper hourly({&counting}, {"test"}, std::chrono::hours(1), std::chrono::hours(1));
    wait_for_passes(1);
    EXPECT_FALSE(fs::exists(dir / "before-start#1"));
    write_old("left-after-start#2");
    std::this_thread::sleep_for(500ms);
    EXPECT_EQ(counting.sweeps(), 1);
    EXPECT_TRUE(fs::exists(dir / "left-after-start#2"));
  }
  EXPECT_FALSE(fs::exists(dir / "before-start#1"));
  fs::remove(dir / "left-after-start#2");
  {
    StagingSweeper every({&counting}, {"test"}, std::chrono::hours(1), 200ms);
    wait_for_passes(2);  // its pass at start
    const int at_start = counting.sweeps();
    write_old("left-while-running#90000000010000000002");
    std::ofstream(dir / "young#7", std::ios::binary) << "a write in progress";
    const auto left_at = std::chrono::steady_clock::now();
    while (fs::exists(dir / "left-while-running#90000000010000000002")) {
      ASSERT_LT(std::chrono::steady_clock::now() - left_at, 3s) << "no later pass removed it";
      std::this_thread::sleep_for(5ms);
    }
    // The pass that removed it counts once it returns (CountingSweeps counts after the sweep).
    while (counting.sweeps() <= at_start) {
      ASSERT_LT(std::chrono::steady_clock::now() - left_at, 3s) << "the pass that removed it never returned";
      std::this_thread::sleep_for(5ms);
    }
    std::this_thread::sleep_for(500ms);  // two more passes: the young one and the object stay
    EXPECT_GE(counting.sweeps(), at_start + 2);
    EXPECT_TRUE(fs::exists(dir / "young#7"));
    EXPECT_EQ(*store_->List("t1/"), std::vector<std::string>{"t1/object"});
  }
  const int passes = counting.sweeps();
  write_old("after-the-sweeper#3");
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(counting.sweeps(), passes);
  EXPECT_TRUE(fs::exists(dir / "after-the-sweeper#3"));
}

TEST(OpenObjectStoreTest, BadSchemeIsInvalidArgument) {
  for (const char* url : {"gs://bucket/x", "http://example.com/x", "relative/dir", ""}) {
    auto s = OpenObjectStore(url);
    ASSERT_FALSE(s.ok()) << url;
    EXPECT_EQ(s.status().code(), Code::kInvalidArgument) << url << ": " << s.status().ToString();
  }
}

// ---- The contract of the D3 operations, on both backends ------------------------------------
// "local": two bucket directories under a fresh temp dir. "s3": two S3 buckets named by
// OML_TEST_S3_BUCKET and OML_TEST_S3_BUCKET_B, endpoint and credentials from AWS_*; skipped
// unless both are set. tests/test_object_store_s3.py runs this binary against moto's server
// with them set and then inspects what some tests leave behind (named below).
//
// Each test works under the prefix <test name> of bucket A (store_) and of bucket B (other_).

// Byte i is (i + seed) % 251: 251 is prime, so the pattern never lines up with a part or a range.
std::string Pattern(size_t n, int seed = 0) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i + static_cast<size_t>(seed)) % 251);
  return s;
}

std::string Sha256Hex(const std::string& bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EXPECT_EQ(EVP_Digest(bytes.data(), bytes.size(), md, &n, EVP_sha256(), nullptr), 1);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < n; ++i) {
    hex += kHex[md[i] >> 4];
    hex += kHex[md[i] & 15];
  }
  return hex;
}

constexpr uint64_t kMiB = 1 << 20;

class ObjectStoreContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    prefix_ = name.substr(0, name.find('/'));
    if (GetParam() == "s3") {
      const char* a = std::getenv("OML_TEST_S3_BUCKET");
      const char* b = std::getenv("OML_TEST_S3_BUCKET_B");
      if (a == nullptr || b == nullptr) GTEST_SKIP() << "OML_TEST_S3_BUCKET(_B) unset";
      bucket_a_ = a;
      bucket_b_ = b;
      config_.object_store_url = "s3://" + bucket_a_ + "/unused-prefix";
    } else {
      bucket_a_ = "bucket-a";
      bucket_b_ = "bucket-b";
      config_.object_store_url = "file://" + root_.string();
    }
    auto a = BucketUrl(config_, bucket_a_);
    auto b = BucketUrl(config_, bucket_b_);
    ASSERT_TRUE(a.ok() && b.ok());
    auto sa = OpenObjectStore(*a + "/" + prefix_);
    auto sb = OpenObjectStore(*b + "/" + prefix_);
    ASSERT_TRUE(sa.ok()) << sa.status().ToString();
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    store_ = std::move(sa).value();
    other_ = std::move(sb).value();
  }
  bool local() const { return GetParam() == "local"; }

  // Every regular file under the local root, hidden staging files included.
  std::vector<std::string> FilesOnDisk() const {
    std::vector<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(root_)) {
      if (e.is_regular_file()) out.push_back(fs::relative(e.path(), root_).string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  void ExpectObject(ObjectStore& s, const std::string& key, const std::string& want) {
    auto got = s.Get(key);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE(got->has_value()) << key;
    EXPECT_EQ((*got)->size(), want.size()) << key;
    EXPECT_TRUE(**got == want) << key << ": bytes differ";
  }
  void ExpectNoObject(ObjectStore& s, const std::string& key) {
    auto got = s.Get(key);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_FALSE(got->has_value()) << key;
    auto size = s.Size(key);
    ASSERT_TRUE(size.ok()) << size.status().ToString();
    EXPECT_FALSE(size->has_value()) << key;
  }
  // Writes `bytes` through a writer in `chunk`-sized writes and finishes.
  void WriteThrough(ObjectStore& s, const std::string& key, const std::string& bytes, size_t chunk) {
    auto w = s.OpenWriter(key);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    for (size_t off = 0; off < bytes.size(); off += chunk) {
      ASSERT_TRUE((*w)->Write(std::string_view(bytes).substr(off, chunk)).ok());
    }
    Status st = (*w)->Finish();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  oml::testing::ScopedTempDir tmp_{"oml-blob-contract"};
  const fs::path root_ = tmp_.path();
  Config config_;
  std::string prefix_, bucket_a_, bucket_b_;
  std::unique_ptr<ObjectStore> store_, other_;  // destroyed before tmp_
};

std::string GetRangeOf(ObjectStore& s, const std::string& key, uint64_t off, uint64_t len) {
  auto r = s.GetRange(key, off, len);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return "<error>";
  if (!r->has_value()) return "<missing>";
  return **r;
}

TEST_P(ObjectStoreContractTest, GetRangeEdges) {
  const std::string data = Pattern(1000);
  ASSERT_TRUE(store_->Put("k", data).ok());
  ASSERT_TRUE(store_->Put("empty", "").ok());
  EXPECT_EQ(GetRangeOf(*store_, "k", 0, 10), data.substr(0, 10));
  EXPECT_EQ(GetRangeOf(*store_, "k", 123, 456), data.substr(123, 456));
  EXPECT_EQ(GetRangeOf(*store_, "k", 990, 10), data.substr(990, 10));  // exactly to the end
  EXPECT_EQ(GetRangeOf(*store_, "k", 999, 1), data.substr(999, 1));
  EXPECT_EQ(GetRangeOf(*store_, "k", 995, 10), data.substr(995));  // runs past the end: clamped
  EXPECT_EQ(GetRangeOf(*store_, "k", 0, UINT64_MAX), data);
  EXPECT_EQ(GetRangeOf(*store_, "k", 500, UINT64_MAX), data.substr(500));  // offset + length overflows
  EXPECT_EQ(GetRangeOf(*store_, "k", 1000, 1), "");  // starts at the end
  EXPECT_EQ(GetRangeOf(*store_, "k", 5000, 10), "");  // starts past the end
  EXPECT_EQ(GetRangeOf(*store_, "k", 10, 0), "");  // zero length
  EXPECT_EQ(GetRangeOf(*store_, "k", 5000, 0), "");
  EXPECT_EQ(GetRangeOf(*store_, "empty", 0, 10), "");
  EXPECT_EQ(GetRangeOf(*store_, "empty", 0, 0), "");
  EXPECT_EQ(GetRangeOf(*store_, "missing", 0, 10), "<missing>");
  EXPECT_EQ(GetRangeOf(*store_, "missing", 0, 0), "<missing>");
  EXPECT_EQ(GetRangeOf(*store_, "missing", 5000, 10), "<missing>");
  auto bad = store_->GetRange("../k", 0, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
}

// GetRangeInto gives GetRange's bytes, replacing what *out held (a longer string reused, old
// bytes and all), on the store itself (a local store reads the file into *out) and through a
// wrapper (the default, by GetRange). A missing object, and a key naming a "directory" of
// others, are false with *out empty.
TEST_P(ObjectStoreContractTest, GetRangeIntoGivesGetRangesBytesIntoAReusedString) {
  const std::string data = Pattern(1000);
  ASSERT_TRUE(store_->Put("k", data).ok());
  ASSERT_TRUE(store_->Put("empty", "").ok());
  ASSERT_TRUE(store_->Put("dir/inner", "x").ok());
  testing::ForwardingStore wrapped(store_.get());
  for (ObjectStore* s : {static_cast<ObjectStore*>(store_.get()), static_cast<ObjectStore*>(&wrapped)}) {
    std::string out(5000, 'x');  // longer than any answer: must be replaced, not appended to
    auto into = [&](const std::string& key, uint64_t offset, uint64_t length) -> std::string {
      auto got = s->GetRangeInto(key, offset, length, &out);
      EXPECT_TRUE(got.ok()) << got.status().ToString();
      if (!got.ok()) return "<error>";
      if (!*got) return out.empty() ? "<missing>" : "<missing, not cleared>";
      return out;
    };
    EXPECT_EQ(into("k", 0, 10), data.substr(0, 10));
    EXPECT_EQ(into("k", 123, 456), data.substr(123, 456));
    EXPECT_EQ(into("k", 995, 10), data.substr(995));  // runs past the end: what there is
    EXPECT_EQ(into("k", 0, 1000), data);
    EXPECT_EQ(into("k", 1000, 10), "");  // starts at the end
    EXPECT_EQ(into("k", 5000, 10), "");  // past it
    EXPECT_EQ(into("k", 10, 0), "");
    EXPECT_EQ(into("empty", 0, 10), "");
    EXPECT_EQ(into("missing", 0, 10), "<missing>");
    EXPECT_EQ(into("dir", 0, 10), "<missing>");
    EXPECT_EQ(into("k", 7, 3), data.substr(7, 3));  // a shorter answer after a longer one
  }
  std::string out;
  EXPECT_EQ(store_->GetRangeInto("../k", 0, 1, &out).status().code(), Code::kInvalidArgument);
}

TEST_P(ObjectStoreContractTest, SizeIsTheObjectLength) {
  ASSERT_TRUE(store_->Put("k", Pattern(1000)).ok());
  ASSERT_TRUE(store_->Put("empty", "").ok());
  auto s = store_->Size("k");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s->has_value());
  EXPECT_EQ(**s, 1000u);
  s = store_->Size("empty");
  ASSERT_TRUE(s.ok() && s->has_value());
  EXPECT_EQ(**s, 0u);
  ExpectNoObject(*store_, "missing");
}

// Leaves PutIfAbsent/k = "first" in bucket A (the pytest reads it back from moto).
TEST_P(ObjectStoreContractTest, PutIfAbsent) {
  auto r = store_->PutIfAbsent("k", "first");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(*r);
  r = store_->PutIfAbsent("k", "second, longer");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(*r);
  ExpectObject(*store_, "k", "first");
  // A deleted key is free again.
  ASSERT_TRUE(store_->PutIfAbsent("gone", "1").ok());
  ASSERT_TRUE(store_->Delete("gone").ok());
  r = store_->PutIfAbsent("gone", "2");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(*r);
  ExpectObject(*store_, "gone", "2");
  // An object made by a writer counts as present.
  WriteThrough(*store_, "written", "w", 1);
  r = store_->PutIfAbsent("written", "other");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(*r);
  ExpectObject(*store_, "written", "w");
}

TEST_P(ObjectStoreContractTest, CopyWithinTheStore) {
  const std::string data = Pattern(3000, 1);
  ASSERT_TRUE(store_->Put("a", data).ok());
  ASSERT_TRUE(store_->Put("b", "old").ok());
  ASSERT_TRUE(store_->Copy("a", "b").ok());  // replaces
  ASSERT_TRUE(store_->Copy("a", "sub/c").ok());
  ExpectObject(*store_, "b", data);
  ExpectObject(*store_, "sub/c", data);
  // The copy is independent of its source afterwards (a local hard link must not alias).
  ASSERT_TRUE(store_->Put("a", "replaced").ok());
  ASSERT_TRUE(store_->Delete("sub/c").ok());
  ExpectObject(*store_, "b", data);
  ExpectObject(*store_, "a", "replaced");
  Status st = store_->Copy("missing", "d");
  EXPECT_EQ(st.code(), Code::kNotFound) << st.ToString();
  ExpectNoObject(*store_, "d");
}

TEST_P(ObjectStoreContractTest, WriterAbortLeavesNothing) {
  auto w = store_->OpenWriter("k");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const std::string data = Pattern(kWriterPartBytes + 1 * kMiB);  // one part already uploaded
  ASSERT_TRUE((*w)->Write(data).ok());
  Status st = (*w)->Abort();
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectNoObject(*store_, "k");
  auto keys = store_->List("");
  ASSERT_TRUE(keys.ok());
  EXPECT_TRUE(keys->empty());
  if (local()) {
    EXPECT_EQ(FilesOnDisk(), std::vector<std::string>{});  // no staging file either
  }
  EXPECT_TRUE((*w)->Abort().ok());  // again: fine
  EXPECT_EQ((*w)->Write("x").code(), Code::kFailedPrecondition);
  EXPECT_EQ((*w)->Finish().code(), Code::kFailedPrecondition);
  ExpectNoObject(*store_, "k");
}

TEST_P(ObjectStoreContractTest, UnfinishedWriterLeavesNoVisibleObject) {
  ASSERT_TRUE(store_->Put("k", "old").ok());
  {
    auto over = store_->OpenWriter("k");      // would replace k
    auto fresh = store_->OpenWriter("new");   // would create new
    ASSERT_TRUE(over.ok() && fresh.ok());
    const std::string data = Pattern(kWriterPartBytes + 2 * kMiB);
    ASSERT_TRUE((*over)->Write(data).ok());
    ASSERT_TRUE((*fresh)->Write(data).ok());
    ExpectObject(*store_, "k", "old");
    ExpectNoObject(*store_, "new");
    auto keys = store_->List("");
    ASSERT_TRUE(keys.ok());
    EXPECT_EQ(*keys, std::vector<std::string>{"k"});
  }  // destroyed without Finish: aborted
  ExpectObject(*store_, "k", "old");
  ExpectNoObject(*store_, "new");
  if (local()) {
    EXPECT_EQ(FilesOnDisk(), std::vector<std::string>{"bucket-a/UnfinishedWriterLeavesNoVisibleObject/k"});
  }
}

TEST_P(ObjectStoreContractTest, WriterReplacesAtFinishOnly) {
  ASSERT_TRUE(store_->Put("k", "old").ok());
  const std::string data = Pattern(kWriterPartBytes + 5, 2);
  auto w = store_->OpenWriter("k");
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Write(data).ok());
  ExpectObject(*store_, "k", "old");
  ASSERT_TRUE((*w)->Finish().ok());
  ExpectObject(*store_, "k", data);
  EXPECT_EQ((*w)->Finish().code(), Code::kFailedPrecondition);
  EXPECT_EQ((*w)->Write("x").code(), Code::kFailedPrecondition);
  EXPECT_EQ((*w)->Abort().code(), Code::kFailedPrecondition);
  w->reset();  // destroying a finished writer leaves the object alone
  ExpectObject(*store_, "k", data);
}

TEST_P(ObjectStoreContractTest, EmptyWriterMakesAnEmptyObject) {
  WriteThrough(*store_, "empty", "", 1);
  auto s = store_->Size("empty");
  ASSERT_TRUE(s.ok() && s->has_value()) << s.status().ToString();
  EXPECT_EQ(**s, 0u);
  ExpectObject(*store_, "empty", "");
}

TEST_P(ObjectStoreContractTest, MultipartTwentyMiBReadsBackIdentical) {
  const std::string data = Pattern(20 * kMiB, 5);
  WriteThrough(*store_, "big", data, 3 * kMiB + 1);  // writes straddle the part boundaries
  ExpectObject(*store_, "big", data);
  auto s = store_->Size("big");
  ASSERT_TRUE(s.ok() && s->has_value());
  EXPECT_EQ(**s, 20 * kMiB);
  // Ranges across the part boundaries at 8 and 16 MiB.
  for (uint64_t at : {kWriterPartBytes, 2 * kWriterPartBytes}) {
    EXPECT_TRUE(GetRangeOf(*store_, "big", at - 3, 7) == data.substr(at - 3, 7)) << at;
  }
  EXPECT_EQ(Sha256Hex(GetRangeOf(*store_, "big", 0, UINT64_MAX)), Sha256Hex(data));
}

// Leaves MultipartTwelveMiB/obj (Pattern(12 MiB), two parts) in bucket A for the pytest.
TEST_P(ObjectStoreContractTest, MultipartTwelveMiB) {
  const std::string data = Pattern(12 * kMiB);
  WriteThrough(*store_, "obj", data, kMiB);
  ExpectObject(*store_, "obj", data);
}

TEST_P(ObjectStoreContractTest, CopyBetweenStoresKeepsTheBytes) {
  // Two full ranges and a ragged tail, so every copy path runs.
  const std::string data = Pattern(2 * kCopyRangeBytes + 12345, 7);
  WriteThrough(*store_, "src", data, 4 * kMiB);
  ASSERT_TRUE(other_->Put("dst", "old").ok());
  Status st = CopyBetween(*store_, "src", *other_, "dst");
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto copied = other_->Get("dst");
  ASSERT_TRUE(copied.ok() && copied->has_value());
  EXPECT_EQ((*copied)->size(), data.size());
  EXPECT_EQ(Sha256Hex(**copied), Sha256Hex(data));
  ExpectObject(*store_, "src", data);  // the source stays

  ASSERT_TRUE(store_->Put("small", "tiny").ok());
  ASSERT_TRUE(CopyBetween(*store_, "small", *other_, "small").ok());
  ExpectObject(*other_, "small", "tiny");
  ASSERT_TRUE(store_->Put("empty", "").ok());
  ASSERT_TRUE(CopyBetween(*store_, "empty", *other_, "empty").ok());
  ExpectObject(*other_, "empty", "");

  st = CopyBetween(*store_, "missing", *other_, "nothing");
  EXPECT_EQ(st.code(), Code::kNotFound) << st.ToString();
  ExpectNoObject(*other_, "nothing");
}

TEST_P(ObjectStoreContractTest, OpenBucketReachesTheNamedBucket) {
  auto b = OpenBucket(config_, bucket_b_);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE((*b)->Put(prefix_ + "/via-open-bucket", "x").ok());
  ExpectObject(*other_, "via-open-bucket", "x");
  ExpectNoObject(*store_, "via-open-bucket");
}

INSTANTIATE_TEST_SUITE_P(Backends, ObjectStoreContractTest, ::testing::Values("local", "s3"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(BucketUrlTest, LocalBucketsAreSubdirectoriesAndS3BucketsAreBuckets) {
  Config c;
  c.object_store_url = "file:///var/oml/objects";
  EXPECT_EQ(BucketUrl(c, "oml-quarantine").value(), "file:///var/oml/objects/oml-quarantine");
  c.object_store_url = "file:///var/oml/objects//";
  EXPECT_EQ(BucketUrl(c, "oml-bodies").value(), "file:///var/oml/objects/oml-bodies");
  c.object_store_url = "/var/oml/objects";
  EXPECT_EQ(BucketUrl(c, "oml-bodies").value(), "file:///var/oml/objects/oml-bodies");
  c.object_store_url = "file:///";
  EXPECT_EQ(BucketUrl(c, "oml-bodies").value(), "file:///oml-bodies");
  c.object_store_url = "s3://oml-main/heads";
  EXPECT_EQ(BucketUrl(c, "oml-bodies").value(), "s3://oml-bodies");
  for (const char* bad : {"", "Oml", "a/b", "../x", "oml_bodies"}) {
    auto r = BucketUrl(c, bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
  }
  c.object_store_url = "gs://x";
  EXPECT_EQ(BucketUrl(c, "oml-bodies").status().code(), Code::kInvalidArgument);
}

TEST_F(LocalObjectStoreTest, OpenBucketMakesTheSubdirectory) {
  Config c;
  c.object_store_url = "file://" + (root_ / "objects").string();
  auto q = OpenBucket(c, c.quarantine_bucket);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  ASSERT_TRUE((*q)->Put("t1/uploads/u/00000001", "part").ok());
  EXPECT_TRUE(fs::is_regular_file(root_ / "objects" / "oml-quarantine" / "t1" / "uploads" / "u" / "00000001"));
  EXPECT_FALSE(fs::exists(root_ / "objects" / "oml-bodies"));
}

}  // namespace
}  // namespace oml::blob
