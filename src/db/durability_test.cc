// The durability requirement check (db/durability.h) and the structural COMMIT-warning rule
// (db/conn.h, CommitNoticeRefusesAck), the latter also against a real cluster.
#include "db/durability.h"

#include <gtest/gtest.h>

#include "db/conn.h"
#include "db/test_cluster.h"

namespace oml::db {
namespace {

using Method = SyncStandbys::Method;

struct ParseCase {
  const char* value;
  Method method;
  int num_sync;
  std::vector<std::string> names;
};

TEST(SyncStandbyNamesTest, ParsesEveryFormOfThePostgresGrammar) {
  const ParseCase cases[] = {
      {"", Method::kNone, 0, {}},
      {"  \t", Method::kNone, 0, {}},
      {"s1", Method::kPriority, 1, {"s1"}},                       // a plain list is FIRST 1
      {"s1, s2,s3", Method::kPriority, 1, {"s1", "s2", "s3"}},
      {"*", Method::kPriority, 1, {"*"}},
      {"1, 2", Method::kPriority, 1, {"1", "2"}},                 // numbers are names in a list
      {"2 (s1, s2)", Method::kPriority, 2, {"s1", "s2"}},         // pre-9.6 spelling of FIRST 2
      {"FIRST 1 (s1)", Method::kPriority, 1, {"s1"}},
      {"first 2 (a, b, c)", Method::kPriority, 2, {"a", "b", "c"}},
      {"ANY 1 (s1)", Method::kQuorum, 1, {"s1"}},
      {"any 2 (s1, \"S 2\", *)", Method::kQuorum, 2, {"s1", "S 2", "*"}},
      {"AnY 1(\"a\"\"b\")", Method::kQuorum, 1, {"a\"b"}},
      {"anyone", Method::kPriority, 1, {"anyone"}},               // a keyword only as a whole word
      {"\"ANY\"", Method::kPriority, 1, {"ANY"}},
      {"ANY 1 (first$1, _x)", Method::kQuorum, 1, {"first$1", "_x"}},
  };
  for (const auto& c : cases) {
    auto p = ParseSyncStandbyNames(c.value);
    ASSERT_TRUE(p.ok()) << c.value << ": " << p.status().ToString();
    EXPECT_EQ(p->method, c.method) << c.value;
    EXPECT_EQ(p->num_sync, c.num_sync) << c.value;
    EXPECT_EQ(p->names, c.names) << c.value;
    EXPECT_EQ(p->IsQuorum(), c.method == Method::kQuorum) << c.value;
  }
}

TEST(SyncStandbyNamesTest, RejectsWhatPostgresRejects) {
  for (const char* bad : {"ANY 0 (s1)", "FIRST 0 (s1)", "0 (s1)", "ANY (s1)", "ANY 1 s1", "ANY 1 (s1", "ANY 1 ()",
                          "ANY 1 (s1) s2", "s1 s2", "s1,", ",s1", "\"open", "s1;", "ANY", "ANY 1", "(s1)",
                          "ANY 99999999999 (s1)", "any 1 (any)", "s1 (s2)"}) {
    auto p = ParseSyncStandbyNames(bad);
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_EQ(p.status().type(), "invalid-sync-standby-names") << bad;
  }
}

TEST(SyncStandbyNamesTest, DescribeNeverNamesTheStandbys) {
  EXPECT_EQ(ParseSyncStandbyNames("")->Describe(), "none");
  EXPECT_EQ(ParseSyncStandbyNames("ANY 2 (alpha, beta, gamma)")->Describe(), "ANY 2 of 3 standbys");
  EXPECT_EQ(ParseSyncStandbyNames("alpha")->Describe(), "FIRST 1 of 1 standby");
  EXPECT_EQ(ParseSyncStandbyNames("ANY 1 (*)")->Describe(), "ANY 1 of any standby (*)");
}

TEST(EvaluateDurabilityTest, QuorumNeedsAnyKAndACommitThatWaits) {
  struct Case {
    const char* sc;
    const char* names;
    bool quorum;
    const char* detail;
  };
  const Case cases[] = {
      {"remote_apply", "ANY 1 (s1)", true,
       "synchronous_commit=remote_apply; synchronous_standby_names is a quorum (ANY 1 of 1 standby)"},
      {"remote_write", "ANY 2 (s1, s2, s3)", true,
       "synchronous_commit=remote_write; synchronous_standby_names is a quorum (ANY 2 of 3 standbys)"},
      {"on", "any 1 (*)", true,
       "synchronous_commit=on; synchronous_standby_names is a quorum (ANY 1 of any standby (*))"},
      {"on", "", false, "synchronous_commit=on; synchronous_standby_names is empty: no synchronous standbys"},
      {"on", "FIRST 1 (s1)", false,
       "synchronous_commit=on; synchronous_standby_names is priority-based (FIRST 1 of 1 standby), not a quorum "
       "(ANY k)"},
      {"remote_apply", "s1, s2", false,
       "synchronous_commit=remote_apply; synchronous_standby_names is priority-based (FIRST 1 of 2 standbys), not a "
       "quorum (ANY k)"},
      {"local", "ANY 1 (s1)", false,
       "synchronous_commit=local does not wait for standbys (needs remote_write, remote_apply or on); "
       "synchronous_standby_names is a quorum (ANY 1 of 1 standby)"},
      {"off", "ANY 1 (s1)", false,
       "synchronous_commit=off does not wait for standbys (needs remote_write, remote_apply or on); "
       "synchronous_standby_names is a quorum (ANY 1 of 1 standby)"},
      {"on", "ANY 1 (s1", false,
       "synchronous_commit=on; synchronous_standby_names cannot be parsed (synchronous_standby_names: expected ')')"},
  };
  for (const auto& c : cases) {
    DurabilityVerdict v = EvaluateDurability({c.sc, c.names});
    EXPECT_EQ(v.quorum, c.quorum) << c.sc << " / " << c.names;
    EXPECT_EQ(v.detail, c.detail) << c.sc << " / " << c.names;
  }
}

// The structural rule alone: severity decides, the text never does.
// The /v1/health and doctor wording of the standby count (issue 21): below the quorum only
// when a quorum is configured and the count is known; never a standby name.
TEST(StandbyCountTest, BelowQuorumOnlyWhenKnownAndConfigured) {
  StandbyCount c;
  EXPECT_EQ(c.HealthValue(), "unknown");
  EXPECT_FALSE(c.BelowQuorum());
  c.known = true;
  EXPECT_EQ(c.HealthValue(), "none");  // no synchronous standbys configured
  EXPECT_EQ(c.Describe(), "0 of 0 streaming standbys synchronous");
  c.required = 1;
  EXPECT_TRUE(c.BelowQuorum());
  EXPECT_EQ(c.HealthValue(), "below-quorum");
  EXPECT_EQ(c.Describe(), "0 of 0 streaming standbys synchronous; 1 needed");
  c.streaming = 1;
  EXPECT_EQ(c.Describe(), "0 of 1 streaming standby synchronous; 1 needed");
  c.sync_streaming = 1;
  EXPECT_FALSE(c.BelowQuorum());
  EXPECT_EQ(c.HealthValue(), "ok");
  c.required = 2;
  c.streaming = 3;
  EXPECT_EQ(c.Describe(), "1 of 3 streaming standbys synchronous; 2 needed");
  EXPECT_EQ(c.HealthValue(), "below-quorum");
}

TEST(CommitNoticeRuleTest, EveryWarningDuringCommitRefusesNothingElseDoes) {
  EXPECT_TRUE(CommitNoticeRefusesAck("WARNING", "01000"));  // the cancelled sync-rep wait
  EXPECT_TRUE(CommitNoticeRefusesAck("WARNING", "57P01"));  // ... while being terminated
  EXPECT_TRUE(CommitNoticeRefusesAck("WARNING", "25P01"));  // unexpected: refuse rather than risk
  EXPECT_TRUE(CommitNoticeRefusesAck("WARNING", nullptr));
  EXPECT_TRUE(CommitNoticeRefusesAck(nullptr, "01000"));    // no non-localized severity: be safe
  for (const char* benign : {"NOTICE", "INFO", "LOG", "DEBUG"}) EXPECT_FALSE(CommitNoticeRefusesAck(benign, "00000"));
}

// On a real cluster: a deferred trigger raises its notice while COMMIT is processed, like a
// cancelled synchronous-replication wait does. Its text is arbitrary (no "synchronous
// replication" anywhere): only when it arrives and its severity count.
class CommitNoticeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto c = Conn::Connect(testing::SuperuserUrl());
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c->Exec("CREATE TABLE IF NOT EXISTS public.commit_notice (level text NOT NULL); "
                        "CREATE OR REPLACE FUNCTION public.commit_notice_raise() RETURNS trigger "
                        "LANGUAGE plpgsql AS $$ "
                        "BEGIN IF NEW.level = 'warning' THEN RAISE WARNING 'nicht repliziert'; "
                        "ELSE RAISE NOTICE 'nur zur Info'; END IF; RETURN NULL; END $$; "
                        "CREATE OR REPLACE FUNCTION public.warn_now() RETURNS int LANGUAGE plpgsql AS $$ "
                        "BEGIN RAISE WARNING 'before the commit'; RETURN 1; END $$; "
                        "DROP TRIGGER IF EXISTS commit_notice_at_commit ON public.commit_notice; "
                        "CREATE CONSTRAINT TRIGGER commit_notice_at_commit AFTER INSERT ON public.commit_notice "
                        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.commit_notice_raise();")
                    .ok());
  }
  static Conn Connect() {
    auto c = Conn::Connect(testing::SuperuserUrl());
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return std::move(c).value();
  }
  // BEGIN; INSERT (its trigger fires at COMMIT); COMMIT, in one pipeline like the journal's.
  static bool PipelinedCommit(Conn& c, const std::string& level, bool warn_before = false) {
    std::vector<Stmt> s = {{"BEGIN", {}}};
    if (warn_before) s.push_back({"SELECT public.warn_now()", {}});
    s.push_back({"INSERT INTO public.commit_notice VALUES ($1)", {Text(level)}});
    s.push_back({"COMMIT", {}});
    auto r = c.Pipeline(s);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->back().CommandTag(), "COMMIT");
    return c.TakeSyncRepWarning();
  }
};

TEST_F(CommitNoticeTest, AWarningWhileCommitIsProcessedRefusesTheAcknowledgement) {
  Conn c = Connect();
  EXPECT_TRUE(PipelinedCommit(c, "warning"));
  EXPECT_FALSE(c.TakeSyncRepWarning());  // taken
  // The same through Exec("COMMIT"), the journal's other commit path.
  ASSERT_TRUE(c.Exec("BEGIN").ok());
  ASSERT_TRUE(c.Query("INSERT INTO public.commit_notice VALUES ('warning')").ok());
  EXPECT_FALSE(c.TakeSyncRepWarning());  // nothing yet: the trigger is deferred to COMMIT
  auto r = c.Exec("COMMIT");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->CommandTag(), "COMMIT");
  EXPECT_TRUE(c.TakeSyncRepWarning());
}

TEST_F(CommitNoticeTest, NoticesDuringCommitAndWarningsBeforeItDoNotCount) {
  Conn c = Connect();
  EXPECT_FALSE(PipelinedCommit(c, "notice"));
  EXPECT_FALSE(PipelinedCommit(c, "notice", /*warn_before=*/true));  // a WARNING, but not during COMMIT
  ASSERT_TRUE(c.Exec("SELECT public.warn_now()").ok());               // outside any COMMIT
  EXPECT_FALSE(c.TakeSyncRepWarning());
}

TEST_F(CommitNoticeTest, AnUntakenWarningDoesNotLeakIntoTheNextCommit) {
  Conn c = Connect();
  ASSERT_TRUE(c.Exec("BEGIN; INSERT INTO public.commit_notice VALUES ('warning'); COMMIT").ok());
  // Not taken. The next COMMIT is clean, and the flag describes it alone.
  EXPECT_FALSE(PipelinedCommit(c, "notice"));
}

}  // namespace
}  // namespace oml::db
