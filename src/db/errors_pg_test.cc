// What a database error says, and to whom: a unique violation and a real deadlock (two
// connections stepped by hand) become Statuses whose message and type are oml's own, while
// PostgreSQL's full text (DETAIL, constraint name, the other backend's SQL) stays in
// log_detail() for the server log (db/conn.h, "Errors").
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "db/conn.h"
#include "db/test_cluster.h"

namespace oml::db {
namespace {

Conn Connect() {
  auto c = Conn::Connect(testing::SuperuserUrl());
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

// Nothing PostgreSQL wrote may be in what a client sees (message and type).
void ExpectNoDatabaseText(const Status& s, const std::vector<std::string>& secrets) {
  for (const std::string& shown : {s.message(), s.type()}) {
    for (const char* pg : {"DETAIL", "ERROR", "HINT", "CONTEXT", "deadlock detected", "duplicate key", "Process ",
                           "UPDATE", "INSERT", "SELECT", "violates", "on transaction", "blocked by"})
      EXPECT_EQ(shown.find(pg), std::string::npos) << "'" << pg << "' in: " << shown;
    for (const std::string& secret : secrets) EXPECT_EQ(shown.find(secret), std::string::npos) << secret << " in: " << shown;
  }
}

TEST(DbErrorsTest, UniqueViolationIsAConflictWithoutDatabaseText) {
  Conn c = Connect();
  ASSERT_TRUE(c.Exec("DROP TABLE IF EXISTS public.errors_unique; "
                     "CREATE TABLE public.errors_unique (id int, label text, "
                     "CONSTRAINT errors_unique_secret_label_key UNIQUE (label))")
                  .ok());
  ASSERT_TRUE(c.Query("INSERT INTO public.errors_unique VALUES (1, $1)", {Text("sekrit-label-42")}).ok());
  auto dup = c.Query("INSERT INTO public.errors_unique VALUES (2, $1)", {Text("sekrit-label-42")});
  ASSERT_FALSE(dup.ok());
  const Status& s = dup.status();
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_EQ(s.type(), "conflict");
  EXPECT_EQ(s.message(), "the request conflicts with existing data");
  ExpectNoDatabaseText(s, {"errors_unique", "sekrit-label-42", "23505", "label"});
  // The server log gets all of it, and callers can still tell which constraint it was.
  EXPECT_NE(s.log_detail().find("[23505]"), std::string::npos) << s.log_detail();
  EXPECT_NE(s.log_detail().find("DETAIL:  Key (label)=(sekrit-label-42) already exists."), std::string::npos)
      << s.log_detail();
  EXPECT_TRUE(IsViolationOf(s, "errors_unique_secret_label_key")) << s.log_detail();
  EXPECT_NE(s.ToString().find("errors_unique_secret_label_key"), std::string::npos);
  ASSERT_TRUE(c.Exec("DROP TABLE public.errors_unique").ok());
}

// Two transactions lock two rows in opposite orders. The first waits (seen in pg_locks from a
// third connection) before the second asks for its row, so exactly one of them is the deadlock
// victim, every time.
TEST(DbErrorsTest, DeadlockIsATransactionConflictWithoutTheOtherBackendsSql) {
  Conn setup = Connect();
  ASSERT_TRUE(setup.Exec("DROP TABLE IF EXISTS public.errors_deadlock; "
                         "CREATE TABLE public.errors_deadlock (id int PRIMARY KEY, v text); "
                         "INSERT INTO public.errors_deadlock VALUES (1, 'a'), (2, 'b')")
                  .ok());
  Conn a = Connect(), b = Connect();
  for (Conn* c : {&a, &b}) ASSERT_TRUE(c->Exec("SET deadlock_timeout = '50ms'").ok());
  const std::string a_pid = a.Query("SELECT pg_backend_pid()")->Get(0, 0);
  ASSERT_TRUE(a.Exec("BEGIN; UPDATE public.errors_deadlock SET v = 'secret-from-a' WHERE id = 1").ok());
  ASSERT_TRUE(b.Exec("BEGIN; UPDATE public.errors_deadlock SET v = 'secret-from-b' WHERE id = 2").ok());
  Result<Rows> a_second = Status(Code::kInternal, "unset");
  std::thread ta([&] { a_second = a.Exec("UPDATE public.errors_deadlock SET v = 'secret-a-waits' WHERE id = 2"); });
  // Step: a is blocked on b's row lock.
  bool waiting = false;
  for (int i = 0; i < 500 && !waiting; ++i) {
    auto w = setup.Query("SELECT count(*) FROM pg_locks WHERE pid = $1::int AND NOT granted", {Text(a_pid)});
    waiting = w.ok() && w->Get(0, 0) != "0";
    if (!waiting) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(waiting) << "the first transaction never waited for the second's row";
  auto b_second = b.Exec("UPDATE public.errors_deadlock SET v = 'secret-b-waits' WHERE id = 1");
  // The victim's error releases its locks, so the other statement completes; commit it.
  if (b_second.ok()) {
    ta.join();
  } else {
    (void)b.Exec("ROLLBACK");
    ta.join();
  }
  ASSERT_NE(a_second.ok(), b_second.ok()) << "exactly one transaction is the deadlock victim";
  const Status victim = a_second.ok() ? b_second.status() : a_second.status();
  (void)a.Exec(a_second.ok() ? "COMMIT" : "ROLLBACK");
  (void)b.Exec("ROLLBACK");

  EXPECT_EQ(victim.code(), Code::kAborted);
  EXPECT_EQ(victim.type(), "transaction-conflict");
  EXPECT_EQ(victim.message(), "the transaction conflicted with a concurrent one and was rolled back; retry");
  ExpectNoDatabaseText(victim, {"errors_deadlock", "secret-", "40P01", "ShareLock", a_pid});
  // PostgreSQL's report, with the other backend's statement, is only in the log detail.
  EXPECT_NE(victim.log_detail().find("[40P01] ERROR:  deadlock detected"), std::string::npos) << victim.log_detail();
  EXPECT_NE(victim.log_detail().find("errors_deadlock"), std::string::npos) << victim.log_detail();
  ASSERT_TRUE(setup.Exec("DROP TABLE public.errors_deadlock").ok());
}

}  // namespace
}  // namespace oml::db
