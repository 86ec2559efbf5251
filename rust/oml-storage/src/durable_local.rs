//! DurableLocal: object_store's LocalFileSystem with every write made durable before it is
//! reported done (issue 18, "Lost or damaged commits"). LocalFileSystem writes a staging file and
//! renames (or links) it into place, but never fsyncs: after an OS crash a Delta commit file could
//! be gone, or present with a data file it names lost, while the frontier in PostgreSQL (which is
//! durable) already passed it. Here a put writes and fsyncs its staging file before linking or
//! renaming it into place (a file is never visible before its bytes are durable, so no commit can
//! land above one a crash could still empty), then fsyncs the file's directory, and the parent of
//! every directory the put created (up to the store's root); a completed multipart upload, a copy and a rename return only after the
//! file and those directories were fsynced. So a Delta commit file, written after the data files
//! it names, is durable only after they are; and the lake writer advances the frontier only after
//! the commit call returned.
//!
//! Reads, lists and deletes pass through unchanged (a delete that an OS crash undoes leaves a file
//! the log no longer names, which vacuum removes again).

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
    UploadPart,
};

/// Files and directories fsynced by every DurableLocal of the process (tests read it through
/// oml_storage_durable_syncs, to prove a commit was synced).
static SYNCS: AtomicU64 = AtomicU64::new(0);

pub(crate) fn sync_count() -> u64 {
    SYNCS.load(Ordering::Relaxed)
}

/// Whole listings of a Delta log (`list` of a prefix ending in `_delta_log`, no offset) by every
/// DurableLocal of the process (tests read it through oml_storage_durable_log_lists, to prove a
/// commit does not list the whole log: its cost would grow with the log's length).
static LOG_LISTS: AtomicU64 = AtomicU64::new(0);

pub(crate) fn log_list_count() -> u64 {
    LOG_LISTS.load(Ordering::Relaxed)
}

#[derive(Debug)]
pub(crate) struct DurableLocal {
    inner: Arc<LocalFileSystem>,
    root: PathBuf, // the store's root directory (the last directory fsynced)
}

impl DurableLocal {
    /// `root` is the directory LocalFileSystem was made with (new_with_prefix), or "/" for new().
    pub(crate) fn new(inner: LocalFileSystem, root: PathBuf) -> Self {
        Self {
            inner: Arc::new(inner),
            root,
        }
    }

    async fn sync(&self, location: &Path) -> Result<()> {
        let file = self.inner.path_to_filesystem(location)?;
        sync_path(file, self.root.clone()).await
    }
}

/// fsyncs `file`, then every directory from its parent up to `root` (inclusive), off the async
/// threads.
async fn sync_path(file: PathBuf, root: PathBuf) -> Result<()> {
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        std::fs::File::open(&file)?.sync_all()?;
        SYNCS.fetch_add(1, Ordering::Relaxed);
        sync_dirs(&file, &root)
    })
    .await
    .map_err(|e| generic(Box::new(e)))?
    .map_err(|e| generic(Box::new(e)))
}

fn generic(source: Box<dyn std::error::Error + Send + Sync + 'static>) -> object_store::Error {
    object_store::Error::Generic {
        store: "DurableLocal",
        source,
    }
}

/// Staging files are named `<file>#<digits>` like LocalFileSystem's own multipart staging files,
/// the only names its listing hides ('#' and digits only): `9`, the pid and a per-process count,
/// far above the small numbers LocalFileSystem counts up from; a name taken is skipped.
static STAGING: AtomicU64 = AtomicU64::new(0);

/// put_opts, synchronously: staging file written and fsynced, then linked (Create: fails with
/// AlreadyExists if `path` exists) or renamed (Overwrite) into place, then the directories up to
/// `root` fsynced. The staging file is removed on every path.
fn durable_put(
    path: &std::path::Path,
    root: &std::path::Path,
    payload: PutPayload,
    create: bool,
    shown: &str,
) -> Result<PutResult> {
    use std::io::Write;
    // The directories this put creates: their entries must be made durable too (in their own
    // parents); an existing directory only needs the new file's entry (its own fsync).
    let mut top_created: Option<PathBuf> = None;
    if let Some(parent) = path.parent() {
        let mut d = Some(parent);
        while let Some(dir) = d {
            if dir.exists() || !dir.starts_with(root) || dir == root {
                break;
            }
            top_created = Some(dir.to_path_buf());
            d = dir.parent();
        }
        std::fs::create_dir_all(parent).map_err(|e| generic(Box::new(e)))?;
    }
    let (mut f, staging) = loop {
        let mut name = path.as_os_str().to_owned();
        name.push(format!(
            "#9{:010}{:010}",
            std::process::id(),
            STAGING.fetch_add(1, Ordering::Relaxed)
        ));
        let name = PathBuf::from(name);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&name)
        {
            Ok(f) => break (f, name),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(generic(Box::new(e))),
        }
    };
    let written = (|| -> std::io::Result<std::fs::Metadata> {
        for chunk in payload.iter() {
            f.write_all(chunk)?;
        }
        f.sync_all()?;
        SYNCS.fetch_add(1, Ordering::Relaxed);
        f.metadata()
    })();
    let metadata = match written {
        Ok(m) => m,
        Err(e) => {
            let _ = std::fs::remove_file(&staging);
            return Err(generic(Box::new(e)));
        }
    };
    let placed = if create {
        let linked = std::fs::hard_link(&staging, path);
        let _ = std::fs::remove_file(&staging);
        linked
    } else {
        let renamed = std::fs::rename(&staging, path);
        if renamed.is_err() {
            let _ = std::fs::remove_file(&staging);
        }
        renamed
    };
    if let Err(e) = placed {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            return Err(object_store::Error::AlreadyExists {
                path: shown.to_string(),
                source: Box::new(e),
            });
        }
        return Err(generic(Box::new(e)));
    }
    // The file's directory; up to the parent of the topmost directory this put created.
    let stop = top_created
        .as_deref()
        .and_then(|t| t.parent())
        .or_else(|| path.parent())
        .unwrap_or(root)
        .to_path_buf();
    sync_dirs(path, &stop).map_err(|e| generic(Box::new(e)))?;
    let mtime = metadata
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default()
        .as_micros();
    // LocalFileSystem's ETag scheme (inode-mtime-size), so a head() after this put agrees.
    let e_tag = format!(
        "{:x}-{:x}-{:x}",
        std::os::unix::fs::MetadataExt::ino(&metadata),
        mtime,
        metadata.len()
    );
    Ok(PutResult {
        e_tag: Some(e_tag),
        version: None,
    })
}

/// fsyncs every directory from `file`'s parent up to `root` (inclusive).
pub(crate) fn sync_dirs(file: &std::path::Path, root: &std::path::Path) -> std::io::Result<()> {
    let mut dir = file.parent();
    while let Some(d) = dir {
        std::fs::File::open(d)?.sync_all()?;
        SYNCS.fetch_add(1, Ordering::Relaxed);
        if d == root || !d.starts_with(root) {
            break;
        }
        dir = d.parent();
    }
    Ok(())
}

impl fmt::Display for DurableLocal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DurableLocal({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for DurableLocal {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        // Written here, not by LocalFileSystem: its put links the staging file into place before
        // anything is synced, so a Delta commit would be visible (and another commit could land
        // above it) before it is durable. Here the staging file is fsynced first, then linked or
        // renamed, then the directories are fsynced: a file is visible only once its bytes are
        // on disk. Update (a conditional overwrite) and attributes: LocalFileSystem refuses them.
        if matches!(opts.mode, PutMode::Update(_)) || !opts.attributes.is_empty() {
            return self.inner.put_opts(location, payload, opts).await;
        }
        let path = self.inner.path_to_filesystem(location)?;
        let root = self.root.clone();
        let create = matches!(opts.mode, PutMode::Create);
        let shown = location.to_string();
        tokio::task::spawn_blocking(move || durable_put(&path, &root, payload, create, &shown))
            .await
            .map_err(|e| generic(Box::new(e)))?
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        let upload = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(DurableUpload {
            inner: upload,
            file: self.inner.path_to_filesystem(location)?,
            root: self.root.clone(),
        }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        if prefix.is_some_and(|p| p.as_ref().ends_with("_delta_log")) {
            LOG_LISTS.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await?;
        self.sync(to).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.inner.rename_opts(from, to, options).await?;
        self.sync(to).await?;
        // The source's directory lost an entry: make that durable too.
        if let Some(parent) = self.inner.path_to_filesystem(from)?.parent() {
            let dir = parent.to_path_buf();
            if dir.exists() {
                sync_dir(dir).await?;
            }
        }
        Ok(())
    }
}

async fn sync_dir(dir: PathBuf) -> Result<()> {
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        std::fs::File::open(&dir)?.sync_all()?;
        SYNCS.fetch_add(1, Ordering::Relaxed);
        Ok(())
    })
    .await
    .map_err(|e| generic(Box::new(e)))?
    .map_err(|e| generic(Box::new(e)))
}

/// A multipart upload whose completion returns after the file and its directories are durable.
#[derive(Debug)]
struct DurableUpload {
    inner: Box<dyn MultipartUpload>,
    file: PathBuf,
    root: PathBuf,
}

#[async_trait]
impl MultipartUpload for DurableUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        self.inner.put_part(data)
    }

    async fn complete(&mut self) -> Result<PutResult> {
        let r = self.inner.complete().await?;
        sync_path(self.file.clone(), self.root.clone()).await?;
        Ok(r)
    }

    async fn abort(&mut self) -> Result<()> {
        self.inner.abort().await
    }
}
