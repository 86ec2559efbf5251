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

// What someone holding the database superuser (and a key) does: appends a signed event that no
// writer made, with the guard trigger off, and moves the chain head to it. Returns its receipt.
inline Receipt PlantEvent(const Envelope& e, const crypto::SigningKey& key) {
  Receipt r = *SignEnvelope(e, key);
  auto su = db::Conn::Connect(db::testing::SuperuserUrl());
  EXPECT_TRUE(su.ok());
  EXPECT_TRUE(su->Exec("ALTER TABLE oml.journal DISABLE TRIGGER USER").ok());
  auto ins = su->Query("INSERT INTO oml.journal (tenant_id, seq, prev_hash, event_hash, event_type, key_id, signed_bytes, "
                       "signature) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                       {db::Text(e.tenant), db::Int(e.seq), db::Bytes(e.prev_hash), db::Bytes(r.event_hash),
                        db::Text(e.type), db::Text(e.key_id), db::Bytes(r.signed_bytes), db::Bytes(r.signature)});
  EXPECT_TRUE(ins.ok()) << ins.status().ToString();
  auto head = su->Query("UPDATE oml.chain_heads SET seq = $2, event_hash = $3 WHERE tenant_id = $1",
                        {db::Text(e.tenant), db::Int(e.seq), db::Bytes(r.event_hash)});
  EXPECT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_TRUE(su->Exec("ALTER TABLE oml.journal ENABLE TRIGGER USER").ok());
  return r;
}

}  // namespace oml::journal::testing
