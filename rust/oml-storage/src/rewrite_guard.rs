//! RewriteGuard: the adapter's own check that a rewrite (OPTIMIZE) never lands over a commit that
//! removed a file it read (issue 18; oml_storage.h, oml_storage_delta_optimize). deltalake-core
//! 1.1's conflict checker lets such a rebase through when the winner's removes carry
//! dataChange = false (delta-rs PR 3982), and both rewrites then hold the same rows.

use std::sync::{Arc, Mutex};

use deltalake::kernel::transaction::TransactionError;
use deltalake::kernel::Version;
use deltalake::logstore::{CommitOrBytes, LogStore, LogStoreConfig, LogStoreRef};
use deltalake::{DeltaResult, DeltaTableError};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use uuid::Uuid;

/// A log store that lets a rewrite (OPTIMIZE) land only if no commit between the version it read
/// and the version it lands on removed a file it read, whatever that commit's dataChange says.
/// It wraps the table's own log store for one call and checks in write_commit_entry, which
/// delta-rs calls once per attempt with the version that attempt would write: the commits below
/// that version and above read_version are exactly the ones the rewrite would rebase over. The
/// files a rewrite read are the files its commit removes (bin-packing and Z-order read exactly
/// the files they replace). Paths are compared percent-decoded.
pub(crate) struct RewriteGuard {
    inner: LogStoreRef,
    read_version: i64,
    refusal: Mutex<Option<String>>, // why an attempt was refused (set once, then the call fails)
}

impl RewriteGuard {
    pub(crate) fn new(inner: LogStoreRef, read_version: i64) -> Self {
        Self {
            inner,
            read_version,
            refusal: Mutex::new(None),
        }
    }

    /// Why an attempt was refused, once one was (the call then failed).
    pub(crate) fn refusal(&self) -> Option<String> {
        self.refusal.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The commit text an attempt would write (bytes, or the temporary commit file of a store that
    /// commits by copy).
    async fn commit_text(
        &self,
        commit: &CommitOrBytes,
        operation_id: Uuid,
    ) -> Result<bytes::Bytes, TransactionError> {
        match commit {
            CommitOrBytes::LogBytes(b) => Ok(b.clone()),
            CommitOrBytes::TmpCommit(path) => Ok(self
                .inner
                .object_store(Some(operation_id))
                .get(path)
                .await?
                .bytes()
                .await?),
        }
    }

    /// Why landing at `version` would put a second copy of rows in the table, or None.
    async fn check(
        &self,
        version: i64,
        ours: &std::collections::HashSet<String>,
    ) -> Result<Option<String>, DeltaTableError> {
        for v in (self.read_version + 1)..version {
            let Some(text) = self.inner.read_commit_entry(v as u64).await? else {
                return Ok(Some(format!(
                    "commit {v}, between the version it read ({}) and the one it would write \
                     ({version}), cannot be read to check it",
                    self.read_version
                )));
            };
            let mut operation = String::new();
            let mut hit: Option<String> = None;
            for a in commit_actions(&text) {
                if let Some(p) = a.get("remove").and_then(|r| r.get("path")).and_then(|p| p.as_str()) {
                    if hit.is_none() && ours.contains(&decoded_path(p)) {
                        hit = Some(p.to_string());
                    }
                } else if let Some(op) = a
                    .get("commitInfo")
                    .and_then(|c| c.get("operation"))
                    .and_then(|o| o.as_str())
                {
                    operation = op.to_string();
                }
            }
            if let Some(path) = hit {
                return Ok(Some(format!(
                    "commit {v} ({operation}) removed {path}, a file this rewrite read at version {} \
                     and would remove again: landing at version {version} would keep both copies \
                     of its rows. The files it wrote are orphans for VACUUM; retry on a fresh snapshot",
                    self.read_version
                )));
            }
        }
        Ok(None)
    }
}

impl RewriteGuard {
    /// After delta-rs refused the rewrite because a concurrent commit removed data it read (a
    /// rewrite marked as a data change, mark_data_change): the first OPTIMIZE among the commits
    /// since read_version, as a refusal text. None if none is one (a MERGE or a DELETE won: an
    /// ordinary commit conflict), or the log cannot be read.
    pub(crate) async fn rewrite_since(&self) -> Option<String> {
        let latest = self.inner.get_latest_version(self.read_version.max(0) as Version).await.ok()?;
        for v in (self.read_version + 1)..=(latest as i64) {
            let text = self.inner.read_commit_entry(v as Version).await.ok()??;
            let rewrite = commit_actions(&text).any(|a| {
                a.get("commitInfo").and_then(|c| c.get("operation")).and_then(|o| o.as_str()) == Some("OPTIMIZE")
            });
            if rewrite {
                return Some(format!(
                    "commit {v} (OPTIMIZE) removed a file this rewrite read at version {}: landing over it \
                     would keep both copies of its rows. The files it wrote are orphans for VACUUM; retry on \
                     a fresh snapshot",
                    self.read_version
                ));
            }
        }
        None
    }
}

/// The JSON actions of one commit file (lines that are not JSON objects are skipped).
fn commit_actions(text: &[u8]) -> impl Iterator<Item = serde_json::Value> + '_ {
    text.split(|b| *b == b'\n')
        .filter(|l| !l.iter().all(|b| b.is_ascii_whitespace()))
        .filter_map(|l| serde_json::from_slice::<serde_json::Value>(l).ok())
        .filter(|v| v.is_object())
}

/// The commit text with every add and remove action marked dataChange = true (other lines kept
/// byte for byte). delta-rs writes a rewrite's actions with dataChange = false, and its conflict
/// checker (PR 3982) then lets another rewrite of the same files land over it (the deltalake
/// package's OPTIMIZE, an operator's Z-order): both copies of the rows would stay. Marked as a
/// data change, the rewrite is a conflict to every later rewrite or MERGE planned on a snapshot
/// that still holds the files it removed (ConcurrentDeleteDelete / ConcurrentDeleteRead). The
/// cost: a streaming reader sees the rewrite as deletes and re-inserts of the same rows
/// (docs/data/delta-tables.md, "Compaction by another tool").
fn mark_data_change(text: &[u8]) -> bytes::Bytes {
    let mut out = Vec::with_capacity(text.len() + 64);
    for (i, line) in text.split(|b| *b == b'\n').enumerate() {
        if i > 0 {
            out.push(b'\n');
        }
        let parsed = serde_json::from_slice::<serde_json::Value>(line).ok();
        let marked = parsed.and_then(|mut v| {
            let key = ["add", "remove"].into_iter().find(|k| v.get(*k).is_some_and(|a| a.is_object()))?;
            v.get_mut(key)?
                .as_object_mut()?
                .insert("dataChange".to_string(), serde_json::Value::Bool(true));
            serde_json::to_vec(&v).ok()
        });
        match marked {
            Some(m) => out.extend_from_slice(&m),
            None => out.extend_from_slice(line),
        }
    }
    bytes::Bytes::from(out)
}

/// A data file's path as the log names it (percent-encoded, relative), decoded: two writers may
/// encode one file differently.
fn decoded_path(p: &str) -> String {
    Path::from_url_path(p)
        .map(|x| x.to_string())
        .unwrap_or_else(|_| p.to_string())
}

#[async_trait::async_trait]
impl LogStore for RewriteGuard {
    fn name(&self) -> String {
        // The name selects how delta-rs hands a commit over (bytes for "DefaultLogStore").
        self.inner.name()
    }

    async fn refresh(&self) -> DeltaResult<()> {
        self.inner.refresh().await
    }

    async fn read_commit_entry(
        &self,
        version: Version,
    ) -> DeltaResult<Option<bytes::Bytes>> {
        self.inner.read_commit_entry(version).await
    }

    async fn write_commit_entry(
        &self,
        version: Version,
        commit_or_bytes: CommitOrBytes,
        operation_id: Uuid,
    ) -> Result<(), TransactionError> {
        let text = self.commit_text(&commit_or_bytes, operation_id).await?;
        let ours: std::collections::HashSet<String> = commit_actions(&text)
            .filter_map(|a| {
                a.get("remove")
                    .and_then(|r| r.get("path"))
                    .and_then(|p| p.as_str())
                    .map(decoded_path)
            })
            .collect();
        if !ours.is_empty() {
            let why = self
                .check(version as i64, &ours)
                .await
                .map_err(|e| TransactionError::LogStoreError {
                    msg: format!("cannot check the commits a rewrite would land over: {e}"),
                    source: Box::new(e),
                })?;
            if let Some(why) = why {
                *self.refusal.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.clone());
                return Err(TransactionError::LogStoreError {
                    msg: why.clone(),
                    source: why.into(),
                });
            }
        }
        // A rewrite commits its files as a data change (see mark_data_change): the first
        // writer's rewrite then wins the race in both directions, since every other delta-rs
        // based writer refuses to land over removes that carry dataChange = true.
        let commit_or_bytes = if ours.is_empty() {
            commit_or_bytes
        } else {
            let marked = mark_data_change(&text);
            match commit_or_bytes {
                CommitOrBytes::LogBytes(_) => CommitOrBytes::LogBytes(marked),
                CommitOrBytes::TmpCommit(path) => {
                    self.inner
                        .object_store(Some(operation_id))
                        .put(&path, marked.into())
                        .await?;
                    CommitOrBytes::TmpCommit(path)
                }
            }
        };
        self.inner
            .write_commit_entry(version, commit_or_bytes, operation_id)
            .await
    }

    async fn abort_commit_entry(
        &self,
        version: Version,
        commit_or_bytes: CommitOrBytes,
        operation_id: Uuid,
    ) -> Result<(), TransactionError> {
        self.inner
            .abort_commit_entry(version, commit_or_bytes, operation_id)
            .await
    }

    async fn get_latest_version(
        &self,
        start_version: Version,
    ) -> DeltaResult<Version> {
        self.inner.get_latest_version(start_version).await
    }

    fn object_store(&self, operation_id: Option<Uuid>) -> Arc<dyn ObjectStore> {
        self.inner.object_store(operation_id)
    }

    fn root_object_store(&self, operation_id: Option<Uuid>) -> Arc<dyn ObjectStore> {
        self.inner.root_object_store(operation_id)
    }

    fn config(&self) -> &LogStoreConfig {
        self.inner.config()
    }
}
