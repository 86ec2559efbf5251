// libpq layer against a real PostgreSQL cluster (db/test_cluster.h).
#include "db/conn.h"

#include <gtest/gtest.h>

#include <optional>
#include <thread>
#include <vector>

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
  EXPECT_EQ(r.status().message(), "a guarded statement matched no row");
  EXPECT_EQ(r.status().log_detail(), "[22012] ERROR:  division by zero");
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
  EXPECT_EQ(unique.status().type(), "conflict");
  EXPECT_TRUE(IsViolationOf(unique.status(), "u_pkey")) << unique.status().ToString();
  EXPECT_FALSE(IsViolationOf(unique.status(), "pkey"));
  auto check = c.Exec("CREATE TEMP TABLE ck (x int CHECK (x > 0)); INSERT INTO ck VALUES (0)");
  EXPECT_EQ(check.status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(check.status().type(), "constraint");
  EXPECT_TRUE(IsViolationOf(check.status(), "ck_x_check")) << check.status().ToString();
  auto denied = c.Exec("SET ROLE oml_app; SELECT * FROM oml.schema_migrations; UPDATE oml.journal SET seq = 1");
  EXPECT_EQ(denied.status().code(), Code::kInternal);
  EXPECT_EQ(denied.status().type(), "database-permission-denied");
  auto serial = c.Exec("RESET ROLE; DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = 'serialization_failure'; END $$");
  EXPECT_EQ(serial.status().code(), Code::kAborted);
  EXPECT_EQ(serial.status().type(), "transaction-conflict");
  ASSERT_TRUE(c.Exec("SET statement_timeout = '10ms'").ok());
  auto canceled = c.Exec("SELECT pg_sleep(5)");
  EXPECT_EQ(canceled.status().code(), Code::kUnavailable);
  EXPECT_EQ(canceled.status().type(), "query-canceled");
  ASSERT_TRUE(c.Exec("RESET statement_timeout").ok());
  auto busy = c.Exec("DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = 'too_many_connections'; END $$");
  EXPECT_EQ(busy.status().code(), Code::kUnavailable);
  EXPECT_EQ(busy.status().type(), "database-busy");
  auto gone = c.Exec("DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = 'connection_failure'; END $$");
  EXPECT_EQ(gone.status().code(), Code::kUnavailable);
  EXPECT_EQ(gone.status().type(), "database-unavailable");
  auto other = c.Exec("SELECT * FROM no_such_table_here");
  EXPECT_EQ(other.status().code(), Code::kInternal);
  EXPECT_EQ(other.status().message(), "unexpected database error (SQLSTATE 42P01)");
  EXPECT_NE(other.status().log_detail().find("no_such_table_here"), std::string::npos);
  auto bad = Conn::Connect("postgresql:///oml?host=/nonexistent&connect_timeout=1");
  EXPECT_EQ(bad.status().code(), Code::kUnavailable);
  EXPECT_EQ(bad.status().type(), "database-unavailable");
  EXPECT_EQ(bad.status().message(), "cannot connect to PostgreSQL");
  EXPECT_NE(bad.status().log_detail().find("/nonexistent"), std::string::npos) << bad.status().log_detail();
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

// Pool fairness and deadline (db/conn.h): a named share never holds more than its cap, an
// acquisition that cannot be served within the deadline fails with database-busy instead of
// waiting, and callers outside the full share still get connections.
namespace oml::db {
namespace {

TEST(PoolTest, AShareAtItsCapWaitsOnlyUntilTheDeadlineAndOthersStillGetConnections) {
  Pool::Options o;
  o.size = 4;
  o.acquire_timeout = std::chrono::milliseconds(300);
  Pool pool(testing::SuperuserUrl(), o);
  std::vector<Pool::Handle> held;
  {
    Pool::ScopedShare share("tenant-a");  // default cap: 4 - 4/4 = 3
    for (int i = 0; i < 3; ++i) {
      auto h = pool.Acquire();
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      held.push_back(std::move(h).value());
    }
    EXPECT_EQ(pool.InUse("tenant-a"), 3);
    const auto t0 = std::chrono::steady_clock::now();
    auto fourth = pool.Acquire();
    const auto waited = std::chrono::steady_clock::now() - t0;
    ASSERT_FALSE(fourth.ok());
    EXPECT_EQ(fourth.status().code(), Code::kUnavailable);
    EXPECT_EQ(fourth.status().type(), "database-busy");
    EXPECT_GE(waited, std::chrono::milliseconds(290));
    EXPECT_LT(waited, std::chrono::milliseconds(2000));
  }
  {
    Pool::ScopedShare share("tenant-b");  // the fourth connection is still there for B
    auto b = pool.Acquire();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(pool.InUse("tenant-b"), 1);
    // The pool is now full: anyone else waits the deadline, then database-busy.
    Pool::ScopedShare other("tenant-c");
    auto c = pool.Acquire();
    EXPECT_EQ(c.status().type(), "database-busy");
  }
  EXPECT_EQ(pool.InUse("tenant-b"), 0);
  held.clear();
  EXPECT_EQ(pool.InUse("tenant-a"), 0);
}

TEST(PoolTest, AnExplicitCapAndNestedScopes) {
  Pool::Options o;
  o.size = 4;
  o.acquire_timeout = std::chrono::milliseconds(200);
  Pool pool(testing::SuperuserUrl(), o);
  Pool::ScopedShare outer("tenant-a");
  {
    Pool::ScopedShare auth("auth", 1);
    auto a = pool.Acquire();
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(pool.Acquire().status().type(), "database-busy");  // cap 1 reached
    EXPECT_EQ(pool.InUse("auth"), 1);
  }
  // Back in the outer scope: tenant-a's share, not auth's.
  auto t = pool.Acquire();
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(pool.InUse("tenant-a"), 1);
  EXPECT_EQ(pool.InUse("auth"), 0);
}

TEST(PoolTest, AWaiterIsServedWhenAConnectionReturnsBeforeTheDeadline) {
  Pool::Options o;
  o.size = 1;
  o.acquire_timeout = std::chrono::milliseconds(5000);
  Pool pool(testing::SuperuserUrl(), o);
  auto first = pool.Acquire();
  ASSERT_TRUE(first.ok());
  std::optional<Pool::Handle> h(std::move(first).value());
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    h.reset();
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto second = pool.Acquire();
  releaser.join();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2000));
}

TEST(PoolTest, WithoutADeadlineAcquireWaits) {
  Pool pool(testing::SuperuserUrl(), 1);  // the CLI's pool: no deadline
  auto first = pool.Acquire();
  ASSERT_TRUE(first.ok());
  std::optional<Pool::Handle> h(std::move(first).value());
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    h.reset();
  });
  auto second = pool.Acquire();
  releaser.join();
  EXPECT_TRUE(second.ok()) << second.status().ToString();
}

}  // namespace
}  // namespace oml::db
