// Test-only: a Journal over the test cluster's application role (db/test_cluster.h), with a
// fresh signing key and the provider chain initialized. Link oml_db_testing.
#pragma once

#include <gtest/gtest.h>

#include "crypto/crypto.h"
#include "db/conn.h"
#include "db/test_cluster.h"
#include "journal/journal.h"
#include "journal/provider.h"

namespace oml::journal::testing {

struct TestJournal {
  explicit TestJournal(int pool_size)
      : pool(db::testing::AppUrl(), pool_size),
        key(std::move(crypto::SigningKey::Generate()).value()),
        journal(&pool, &key) {
    auto init = InitProvider(journal);
    EXPECT_TRUE(init.ok()) << init.status().ToString();
  }
  db::Pool pool;
  crypto::SigningKey key;
  Journal journal;
};

}  // namespace oml::journal::testing
