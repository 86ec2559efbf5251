// libpq layer against a real PostgreSQL cluster (db/test_cluster.h).
#include "db/conn.h"

#include <gtest/gtest.h>

#include "db/test_cluster.h"

namespace oml::db {
namespace {

Conn Connect() {
  auto c = Conn::Connect(testing::SuperuserUrl());
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

TEST(ConnTest, PipelineReturnsOneRowsPerStatementAndSkipsPrepares) {
  Conn c = Connect();
  for (int round = 0; round < 2; ++round) {  // round 0 prepares "t_add", round 1 reuses it
    auto r = c.Pipeline({{"SELECT 1", {}},
                         {"SELECT $1::int + $2::int", {Int(2), Int(3)}, "t_add"},
                         {"SELECT $1::bytea", {Bytes(std::string("\x00\xff", 2))}},
                         {"SELECT $1::int + $2::int", {Int(4), Int(5)}, "t_add"}});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->size(), 4u);
    EXPECT_EQ((*r)[1].Get(0, 0), "5");
    EXPECT_EQ((*r)[2].GetBytes(0, 0), std::string("\x00\xff", 2));
    EXPECT_EQ((*r)[3].Get(0, 0), "9");
  }
}

TEST(ConnTest, BinaryResultsDecodeIntegersBytesAndText) {
  Conn c = Connect();
  for (int round = 0; round < 2; ++round) {  // unnamed, then prepared ("t_bin") twice
    Stmt s{"SELECT $1::int8, (-2)::int4, (-3)::int2, '\\x00ff0a'::bytea, 'h\u00e9'::text, NULL::bytea",
           {Int(-5000000000)}, round == 0 ? "" : "t_bin", true};
    auto r = c.Pipeline({s, s});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (const Rows& rows : *r) {
      EXPECT_EQ(rows.GetInt(0, 0), -5000000000);
      EXPECT_EQ(rows.GetInt(0, 1), -2);
      EXPECT_EQ(rows.GetInt(0, 2), -3);
      EXPECT_EQ(rows.GetBytes(0, 3), std::string("\x00\xff\n", 3));
      EXPECT_EQ(rows.Get(0, 4), "h\u00e9");
      EXPECT_TRUE(rows.IsNull(0, 5));
    }
  }
  // Binary values that are not integers are refused, not misread.
  auto bad = c.Pipeline({{"SELECT 1.5::numeric, NULL::int8, 7::oid", {}, "", true}});
  ASSERT_TRUE(bad.ok()) << bad.status().ToString();
  EXPECT_THROW((*bad)[0].GetInt(0, 0), std::invalid_argument);
  EXPECT_THROW((*bad)[0].GetInt(0, 1), std::invalid_argument);
  EXPECT_THROW((*bad)[0].GetInt(0, 2), std::invalid_argument);
  // The same columns in text format still decode the same way.
  auto t = c.Query("SELECT 42::int8, '\\x00ff0a'::bytea");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->GetInt(0, 0), 42);
  EXPECT_EQ(t->GetBytes(0, 1), std::string("\x00\xff\n", 3));
}

TEST(ConnTest, FirstErrorWinsAndLaterStatementsDoNotRun) {
  Conn c = Connect();
  ASSERT_TRUE(c.Exec("CREATE TEMP TABLE t (x int)").ok());
  auto r = c.Pipeline({{"BEGIN", {}},
                       {"INSERT INTO t VALUES (1)", {}},
                       {"SELECT 1/0", {}},
                       {"INSERT INTO t VALUES (2)", {}},
                       {"COMMIT", {}}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInternal);
  EXPECT_NE(r.status().message().find("[22012]"), std::string::npos);
  EXPECT_EQ(r.status().type(), kZeroRowsGuard);
  ASSERT_TRUE(c.Exec("ROLLBACK").ok());
  auto n = c.Query("SELECT count(*) FROM t");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->Get(0, 0), "0");
}

TEST(ConnTest, SqlStatesMapToCodes) {
  Conn c = Connect();
  auto unique = c.Exec("CREATE TEMP TABLE u (x int PRIMARY KEY); INSERT INTO u VALUES (1); INSERT INTO u VALUES (1)");
  EXPECT_EQ(unique.status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(unique.status().type(), "constraint");
  auto denied = c.Exec("SET ROLE oml_app; SELECT * FROM oml.schema_migrations; UPDATE oml.journal SET seq = 1");
  EXPECT_EQ(denied.status().code(), Code::kInternal);
  EXPECT_EQ(denied.status().type(), "database-permission-denied");
  auto serial = c.Exec("RESET ROLE; DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = 'serialization_failure'; END $$");
  EXPECT_EQ(serial.status().code(), Code::kAborted);
  auto bad = Conn::Connect("postgresql:///oml?host=/nonexistent&connect_timeout=1");
  EXPECT_EQ(bad.status().code(), Code::kUnavailable);
  EXPECT_EQ(bad.status().type(), "database-unavailable");
}

TEST(ConnTest, CommitOfAnAbortedTransactionAnswersRollback) {
  Conn c = Connect();
  auto r = c.Pipeline({{"BEGIN", {}}});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(c.Exec("SELECT 1/0").ok());
  auto commit = c.Exec("COMMIT");
  ASSERT_TRUE(commit.ok());
  EXPECT_EQ(commit->CommandTag(), "ROLLBACK");  // what Journal::Txn refuses to acknowledge
}

TEST(PoolTest, ReturnsIdleConnectionsAndDropsOnesLeftInATransaction) {
  Pool pool(testing::SuperuserUrl(), 1);
  std::string pid1, pid2, pid3;
  {
    auto h = pool.Acquire();
    ASSERT_TRUE(h.ok());
    pid1 = (*h)->Query("SELECT pg_backend_pid()")->Get(0, 0);
  }
  {
    auto h = pool.Acquire();
    pid2 = (*h)->Query("SELECT pg_backend_pid()")->Get(0, 0);
    ASSERT_TRUE((*h)->Exec("BEGIN").ok());  // returned mid-transaction: must not be reused
  }
  {
    auto h = pool.Acquire();
    ASSERT_TRUE(h.ok());
    pid3 = (*h)->Query("SELECT pg_backend_pid()")->Get(0, 0);
  }
  EXPECT_EQ(pid1, pid2);
  EXPECT_NE(pid2, pid3);
}

}  // namespace
}  // namespace oml::db
