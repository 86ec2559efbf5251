// ArrowBatch (lake/arrow_batch.h), AppendDeltaRow and the adapter's Arrow append: the rows
// that cross as Arrow land exactly as the same rows through the adapter's JSON decoder
// (arrow-json, an independent implementation) do, on real local Delta tables.
#include "lake/arrow_batch.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "common/temp_dir_testing.h"
#include "crypto/crypto.h"
#include "lake/delta_tables.h"
#include "lake/lakewriter.h"
#include "oml_storage.h"

namespace oml::lake {
namespace {

namespace fs = std::filesystem;

std::vector<ArrowColumnSpec> TwoColumns() {
  return {{"name", ArrowColumnType::kString, false}, {"n", ArrowColumnType::kLong, true}};
}

TEST(ArrowBatchTest, EndRowFillsNullableGapsAndRefusesMissingDoubledOrNullValues) {
  ArrowBatch b(TwoColumns());
  ASSERT_TRUE(b.AppendBytes(0, "x").ok());
  ASSERT_TRUE(b.EndRow().ok());  // n missing: null
  EXPECT_EQ(b.num_rows(), 1);

  b.AppendInt64(1, 5);
  Status missing = b.EndRow();
  EXPECT_EQ(missing.code(), Code::kInvalidArgument);
  EXPECT_EQ(missing.message(), "column name has no value (not nullable)");
  ASSERT_TRUE(b.AppendBytes(0, "a").ok());
  ASSERT_TRUE(b.AppendBytes(0, "b").ok());
  EXPECT_EQ(b.EndRow().message(), "column name has two values");
  b.AppendNull(0);
  EXPECT_EQ(b.EndRow().message(), "column name is null (not nullable)");
  EXPECT_EQ(b.num_rows(), 1);  // every refused row was rolled back

  ASSERT_TRUE(b.AppendBytes(0, "").ok());
  b.AppendInt64(1, -7);
  ASSERT_TRUE(b.EndRow().ok());
  ASSERT_TRUE(b.AppendBytes(0, "unfinished").ok());  // not ended: not exported

  ArrowArray array{};
  ArrowSchema schema{};
  b.Export(&array, &schema);
  EXPECT_EQ(b.num_rows(), 0);
  ASSERT_NE(array.release, nullptr);
  ASSERT_NE(schema.release, nullptr);
  EXPECT_STREQ(schema.format, "+s");
  ASSERT_EQ(schema.n_children, 2);
  EXPECT_STREQ(schema.children[0]->format, "u");
  EXPECT_STREQ(schema.children[0]->name, "name");
  EXPECT_EQ(schema.children[0]->flags, 0);
  EXPECT_STREQ(schema.children[1]->format, "l");
  EXPECT_EQ(schema.children[1]->flags, ARROW_FLAG_NULLABLE);
  EXPECT_EQ(array.length, 2);
  ASSERT_EQ(array.n_children, 2);
  const ArrowArray* name = array.children[0];
  EXPECT_EQ(name->null_count, 0);
  EXPECT_EQ(name->buffers[0], nullptr);  // no validity bitmap without nulls
  const auto* offsets = static_cast<const int32_t*>(name->buffers[1]);
  EXPECT_EQ(offsets[0], 0);
  EXPECT_EQ(offsets[1], 1);
  EXPECT_EQ(offsets[2], 1);
  EXPECT_EQ(std::string(static_cast<const char*>(name->buffers[2]), 1), "x");
  const ArrowArray* n = array.children[1];
  EXPECT_EQ(n->null_count, 1);
  const auto* validity = static_cast<const uint8_t*>(n->buffers[0]);
  EXPECT_EQ(validity[0] & 0x3, 0x2);  // row 0 null, row 1 valid
  EXPECT_EQ(static_cast<const int64_t*>(n->buffers[1])[1], -7);
  array.release(&array);
  schema.release(&schema);
  EXPECT_EQ(array.release, nullptr);
  EXPECT_EQ(schema.release, nullptr);
}

TEST(ArrowBatchTest, Rfc3339Times) {
  EXPECT_EQ(ParseRfc3339Micros("1970-01-01T00:00:00Z"), 0);
  EXPECT_EQ(ParseRfc3339Micros("1970-01-01T01:00:00+01:00"), 0);
  EXPECT_EQ(ParseRfc3339Micros("1969-12-31T23:00:00.5-01:00"), 500'000);
  EXPECT_EQ(ParseRfc3339Micros("1969-12-31T23:59:59.5Z"), -500'000);
  // 2026-11-30T15:37:13.123456Z: 20,787 days, then 56,233 s.
  EXPECT_EQ(ParseRfc3339Micros("2026-11-30T15:37:13.123456Z"), (20'787LL * 86'400 + 56'233) * 1'000'000 + 123'456);
  EXPECT_EQ(ParseRfc3339Micros("2026-11-30 15:37:13.123456789z"), (20'787LL * 86'400 + 56'233) * 1'000'000 + 123'456);
  EXPECT_EQ(ParseRfc3339Micros("2024-02-29T00:00:00Z"), 19'782LL * 86'400 * 1'000'000);
  for (const char* bad : {"2026-02-29T00:00:00Z", "2026-11-30T24:00:00Z", "2026-11-30T15:60:00Z",
                          "2026-11-30T15:37:60Z", "2026-11-30T15:37:13", "2026-11-30T15:37:13.Z",
                          "2026-11-30T15:37:13.1234567890Z", "2026-11-30T15:37:13+0100", "2026-13-01T00:00:00Z",
                          "2026-11-30T15:37:13Zx", "26-11-30T15:37:13Z", "2026-11-30"}) {
    EXPECT_EQ(ParseRfc3339Micros(bad), std::nullopt) << bad;
  }
}

class ArrowRowTest : public ::testing::Test {
 protected:
  static OutboxRow Row(int64_t seq, std::string data) {
    OutboxRow r;
    r.seq = seq;
    r.target_table = "bronze/events";
    r.row_data = std::move(data);
    return r;
  }

  DeltaTable Bronze(const std::string& lake) {
    EXPECT_TRUE(EnsureBronzeEvents((root_ / lake).string()).ok());
    auto t = DeltaTable::Open(TableUri((root_ / lake).string(), "bronze/events"));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) std::abort();
    return std::move(t).value();
  }

  static ArrowBatch NewBatch() {
    auto cols = LakeTableColumns("bronze/events");
    EXPECT_TRUE(cols.ok());
    return ArrowBatch(*cols);
  }

  static std::vector<nlohmann::json> Sorted(const DeltaTable& t) {
    auto text = t.ReadRowsJsonl();
    EXPECT_TRUE(text.ok()) << text.status().ToString();
    std::vector<nlohmann::json> rows;
    std::istringstream in(text.ok() ? *text : std::string());
    for (std::string l; std::getline(in, l);)
      if (!l.empty()) rows.push_back(nlohmann::json::parse(l));
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a["outbox_seq"].template get<int64_t>() < b["outbox_seq"].template get<int64_t>(); });
    return rows;
  }

  static TxnCommit Txn(int64_t v) { return TxnCommit{"oml-test", v, nlohmann::json::object()}; }

  oml::testing::ScopedTempDir tmp_{"oml-arrow-row"};
  const fs::path root_ = tmp_.path();
};

// A full bronze row as the journal writes it (jsonb's text form), with every optional column set.
std::string FullRow(const std::string& tenant, int64_t seq) {
  return R"({"seq": )" + std::to_string(seq) + R"(, "path": "/notes/a.md", "key_id": "k-1", "version": 3, "principal": "agent:x", "signature": ")" +
         crypto::Base64(std::string(64, '\x07')) + R"(", "tenant_id": ")" + tenant +
         R"(", "event_hash": "ab01", "prev_hash": "0000", "event_type": "claim.submitted", "provenance": "agent", "artifact_id": "art-1", "occurred_at": "2026-11-30T15:37:13.123456Z", "workarea_id": "wa-1", "signed_bytes": ")" +
         crypto::Base64("{\"signed\":true}") + R"(", "simulation_id": null, "plaintext_sha256": "aa", "ciphertext_sha256": "bb"})";
}

TEST_F(ArrowRowTest, ArrowBatchesAndJsonLinesGiveTheSameTable) {
  const std::string sig = crypto::Base64("sig"), sb = crypto::Base64(std::string("\x00\xff\x10", 3));
  const std::string base = R"("tenant_id": "t1", "prev_hash": "00", "event_hash": "01", "key_id": "k", "signature": ")" + sig +
                           R"(", "signed_bytes": ")" + sb + R"(")";
  const std::vector<OutboxRow> rows = {
      Row(1, FullRow("t1", 1)),
      // Only the non-nullable columns; the rest missing (null).
      Row(2, "{" + base + R"(, "seq": 2, "event_type": "tenant.created", "occurred_at": "2026-11-30T00:00:00Z"})"),
      // Escapes in values and in a key, non-ASCII text, an empty string, explicit nulls.
      Row(3, "{" + base + R"(, "seq": 3, "event_type": "x", "occurred_at": "2026-11-30T00:00:00Z", "path": "/a \"b\" \\ c\n\u00e9\u4e2d\ud83d\ude00", "pro\u0076enance": "", "principal": null, "version": null})"),
      // Integer microseconds, an offset, nine fraction digits, a space separator.
      Row(4, "{" + base + R"(, "seq": 4, "event_type": "x", "occurred_at": 1796083200000001})"),
      Row(5, "{" + base + R"(, "seq": 5, "event_type": "x", "occurred_at": "2026-11-30T23:30:00.25-02:30"})"),
      Row(6, "{" + base + R"(, "seq": 6, "event_type": "x", "occurred_at": "2026-11-30T00:00:00.123456789Z"})"),
      Row(7, "{" + base + R"(, "seq": 7, "event_type": "x", "occurred_at": "2026-11-30 00:00:00Z"})"),
      // Not on one line (the JSON-parse path); negative and extreme longs; an empty binary.
      Row(8, "{" + base + ",\n  \"seq\": -9223372036854775808, \"version\": 9223372036854775807,\n \"event_type\": \"x\", \"occurred_at\": \"2026-11-30T00:00:00Z\"}"),
      Row(9, R"({"tenant_id": "t1", "prev_hash": "00", "event_hash": "01", "key_id": "k", "signature": "", "signed_bytes": "AA==", "seq": 9, "event_type": "x", "occurred_at": "2026-11-30T00:00:00Z"})"),
      // An outbox_seq in row_data is not the row's: the outbox's seq is.
      Row(10, "{" + base + R"(, "seq": 10, "event_type": "x", "occurred_at": "2026-11-30T00:00:00Z", "outbox_seq": 999})"),
  };
  const TargetTable& bronze = TargetTables().front();
  ASSERT_EQ(bronze.name, "bronze/events");
  DeltaTable json = Bronze("json"), arrow = Bronze("arrow");
  std::string jsonl;
  ArrowBatch batch = NewBatch();
  for (const auto& r : rows) {
    auto line = ToDeltaRow(r, bronze);
    ASSERT_TRUE(line.ok()) << r.seq << ": " << line.status().ToString();
    jsonl += *line;
    Status st = AppendDeltaRow(r, &batch);
    ASSERT_TRUE(st.ok()) << r.seq << ": " << st.ToString();
  }
  EXPECT_EQ(batch.num_rows(), static_cast<int64_t>(rows.size()));
  auto vj = json.Append(jsonl, Txn(10));
  ASSERT_TRUE(vj.ok()) << vj.status().ToString();
  auto va = arrow.AppendBatch(&batch, Txn(10));
  ASSERT_TRUE(va.ok()) << va.status().ToString();
  EXPECT_EQ(*va, 1);
  EXPECT_EQ(batch.num_rows(), 0);  // moved out
  EXPECT_EQ(arrow.ReadLastTxn("oml-test")->version, 10);
  const auto a = Sorted(arrow), j = Sorted(json);
  ASSERT_EQ(a.size(), rows.size());
  EXPECT_EQ(a, j);
  EXPECT_EQ(a[2]["path"], "/a \"b\" \\ c\n\u00e9\u4e2d\U0001F600");
  EXPECT_EQ(a[2]["provenance"], "");
  EXPECT_TRUE(a[1]["artifact_id"].is_null());
  EXPECT_EQ(a[9]["outbox_seq"], 10);
}

TEST_F(ArrowRowTest, ARowThatDoesNotFitIsRefusedNamingSeqAndColumnAndLeavesTheBatchAsItWas) {
  const std::string ok = FullRow("t1", 1);
  struct Case {
    std::string data;
    std::string message;
  } cases[] = {
      {"[1]", "outbox seq 7: row_data is not a JSON object"},
      {"{\"seq\": 1,", "outbox seq 7: row_data is not a JSON object"},
      {ok.substr(0, ok.size() - 1) + R"(, "bogus": 1})", "outbox seq 7: no column bogus in the table"},
      {R"({"seq": "1"})", "outbox seq 7: seq is not a 64-bit integer"},
      {R"({"seq": 1.5})", "outbox seq 7: seq is not a 64-bit integer"},
      {R"({"seq": 9223372036854775808})", "outbox seq 7: seq is not a 64-bit integer"},
      {R"({"tenant_id": 5})", "outbox seq 7: tenant_id is not a string"},
      {R"({"signature": "not base64!"})",
       "outbox seq 7: signature is not valid base64 (base64: length is not a multiple of 4)"},
      {R"({"signature": "AB=="})", "outbox seq 7: signature is not valid base64 (base64: non-canonical padding bits)"},
      {R"({"signature": 5})", "outbox seq 7: signature is not a base64 string"},
      {R"({"occurred_at": "yesterday"})", "outbox seq 7: occurred_at is neither an RFC 3339 time nor integer microseconds"},
      {R"({"occurred_at": true})", "outbox seq 7: occurred_at is neither an RFC 3339 time nor integer microseconds"},
      {R"({"tenant_id": "t"})", "outbox seq 7: column seq has no value (not nullable)"},
      {ok.substr(0, ok.size() - 1) + R"(, "seq": 2})", "outbox seq 7: column seq has two values"},
      {ok.substr(0, ok.size() - 1) + R"(, "tenant_id": null})", "outbox seq 7: column tenant_id has two values"},
  };
  ArrowBatch batch = NewBatch();
  ASSERT_TRUE(AppendDeltaRow(Row(1, ok), &batch).ok());
  for (const auto& c : cases) {
    Status st = AppendDeltaRow(Row(7, c.data), &batch);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << c.data;
    EXPECT_EQ(st.type(), "invalid-outbox-row") << c.data;
    EXPECT_EQ(st.message(), c.message) << c.data;
    EXPECT_EQ(batch.num_rows(), 1) << c.data;
  }
  ASSERT_TRUE(AppendDeltaRow(Row(2, FullRow("t1", 2)), &batch).ok());
  // A null where the column is not nullable.
  std::string null_tenant = FullRow("t1", 3);
  null_tenant.replace(null_tenant.find("\"t1\""), 4, "null");
  EXPECT_EQ(AppendDeltaRow(Row(3, null_tenant), &batch).message(), "outbox seq 3: column tenant_id is null (not nullable)");

  DeltaTable t = Bronze("lake");
  ASSERT_EQ(*t.AppendBatch(&batch, Txn(2)), 1);
  const auto rows = Sorted(t);
  ASSERT_EQ(rows.size(), 2u);  // the refused rows left nothing behind
  EXPECT_EQ(rows[0]["outbox_seq"], 1);
  EXPECT_EQ(rows[1]["outbox_seq"], 2);
}

TEST_F(ArrowRowTest, TheAdapterRefusesABatchWhoseColumnsAreNotTheTablesAndCommitsNothing) {
  DeltaTable t = Bronze("lake");
  auto cols = *LakeTableColumns("bronze/events");
  // One column fewer; one column of another type; two columns swapped; no rows.
  std::vector<std::vector<ArrowColumnSpec>> shapes;
  shapes.push_back(std::vector<ArrowColumnSpec>(cols.begin(), cols.end() - 1));
  shapes.push_back(cols);
  shapes.back()[1].type = ArrowColumnType::kString;  // seq as a string
  shapes.push_back(cols);
  std::swap(shapes.back()[0], shapes.back()[2]);
  shapes.push_back(cols);
  for (size_t i = 0; i < shapes.size(); ++i) {
    ArrowBatch b(shapes[i]);
    if (i + 1 < shapes.size()) {  // the last shape is the table's, with no rows
      for (size_t c = 0; c < shapes[i].size(); ++c) {
        if (shapes[i][c].type == ArrowColumnType::kLong || shapes[i][c].type == ArrowColumnType::kTimestamp) {
          b.AppendInt64(static_cast<int>(c), 1);
        } else {
          ASSERT_TRUE(b.AppendBytes(static_cast<int>(c), "x").ok());
        }
      }
      ASSERT_TRUE(b.EndRow().ok());
    }
    auto v = t.AppendBatch(&b, Txn(1));
    EXPECT_EQ(v.status().code(), Code::kInvalidArgument) << i << ": " << v.status().ToString();
  }
  EXPECT_EQ(*TableVersion(t.uri()), 0);
  EXPECT_EQ(t.ReadLastTxn("oml-test")->version, -1);
}

}  // namespace
}  // namespace oml::lake
