//! What interrupted writes leave behind, and its removal (issue 19, "Leftovers").
//!
//! A write that dies mid-way (kill -9, a lost connection) leaves bytes no listing shows:
//! * local stores: a staging file `<name>#<digits>` beside the object (LocalFileSystem's
//!   multipart staging files and durable_local's own, `#9<pid><n>`). `list` hides them, so no
//!   erasure or sweep of keys ever reaches them.
//! * S3: an incomplete multipart upload, whose parts are stored (and billed) until aborted.
//!
//! `sweep` removes those older than a grace period: a staging file not modified for that long,
//! or a multipart upload initiated that long ago. The grace must exceed the longest write in
//! progress (a staging file is modified by every part; a multipart upload lives as long as the
//! whole write), or a live write would lose its staging file and fail.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use object_store::aws::{AmazonS3, AwsAuthorizer};
use object_store::client::{ClientOptions, HttpConnector, HttpRequest, HttpRequestBody, ReqwestConnector};
use object_store::multipart::MultipartStore;
use object_store::path::Path;
use serde::Deserialize;

/// Where a store keeps its leftovers.
pub enum Leftovers {
    /// A local directory: staging files anywhere below it.
    Local(PathBuf),
    /// An S3 bucket: incomplete multipart uploads under the store's prefix.
    S3(S3Target),
}

pub struct S3Target {
    pub s3: Arc<AmazonS3>,
    /// `https://host[:port]/bucket` (path style) or `https://bucket.host` (virtual hosted).
    pub bucket_url: String,
    pub region: String,
    /// The store's client settings (TLS, proxy, timeouts, plain HTTP).
    pub client_options: ClientOptions,
}

/// True for a staging file's name, as LocalFileSystem tells them from objects
/// (object_store's `is_valid_file_path`): after the name's first '#' come only digits, at least
/// one. `a#12` is one; `a#x#12` and `a#` are objects.
pub fn is_staging_name(name: &str) -> bool {
    match name.split_once('#') {
        Some((_, suffix)) => !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit()),
        None => false,
    }
}

/// True for a key oml writes in a bucket: `<tenant uuid>/...` (objects, upload parts, bodies).
/// Only such multipart uploads are aborted where the store has no prefix of its own, so that
/// another tool's uploads in a shared bucket are never touched.
pub fn is_oml_bucket_key(key: &str) -> bool {
    let first = key.split('/').next().unwrap_or("");
    let b = first.as_bytes();
    key.len() > first.len() + 1
        && b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(c),
        })
}

/// True for an upload session's resumable write, `<tenant uuid>/uploads/<upload uuid>/object`
/// (src/uploads/uploads.h "Storage"): recorded in its session before any part is put, and aborted
/// by the session's end, so the age-based sweep leaves it alone however long the session lives.
pub fn is_upload_session_write(key: &str) -> bool {
    let parts: Vec<&str> = key.split('/').collect();
    parts.len() == 4
        && is_oml_bucket_key(key)
        && parts[1] == "uploads"
        && is_oml_bucket_key(&format!("{}/x", parts[2]))
        && parts[3] == "object"
}

/// Removes staging files below `root` not modified within `grace`; returns how many. A
/// directory or entry it cannot read (e.g. a mount's root-only lost+found) is skipped, not an
/// error; only an unreadable `root` is.
pub fn sweep_local(root: &FsPath, grace: Duration) -> std::io::Result<u64> {
    let now = SystemTime::now();
    let mut removed = 0u64;
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            // Removed meanwhile (LocalFileSystem prunes empty directories).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) if dir.as_path() == root => return Err(e),
            Err(_) => continue,
        };
        for entry in entries {
            let Ok(entry) = entry else { continue };
            let ft = match entry.file_type() {
                Ok(t) => t,
                Err(_) => continue,
            };
            if ft.is_dir() {
                dirs.push(entry.path());
                continue;
            }
            if !ft.is_file() || !is_staging_name(&entry.file_name().to_string_lossy()) {
                continue;
            }
            let modified = match entry.metadata().and_then(|m| m.modified()) {
                Ok(m) => m,
                Err(_) => continue, // gone meanwhile
            };
            if now.duration_since(modified).unwrap_or_default() < grace {
                continue;
            }
            // Gone meanwhile, or not ours to remove: skipped (the next round tries again).
            if std::fs::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        }
    }
    Ok(removed)
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListResult {
    #[serde(default)]
    is_truncated: bool,
    #[serde(default)]
    next_key_marker: Option<String>,
    #[serde(default)]
    next_upload_id_marker: Option<String>,
    #[serde(default, rename = "Upload")]
    uploads: Vec<UploadEntry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct UploadEntry {
    key: String,
    upload_id: String,
    initiated: String,
}

/// Aborts the incomplete multipart uploads under `prefix` initiated more than `grace` ago;
/// returns how many. Without a prefix (a whole bucket), only oml's keys (is_oml_bucket_key).
/// ListMultipartUploads (which object_store does not offer) is signed with object_store's own
/// SigV4 authorizer and the store's credentials. An entry that cannot be aborted (an odd key,
/// an unreadable date, a refused abort) is skipped, and the sweep goes on; only a failed listing
/// is an error.
pub async fn sweep_s3(t: &S3Target, prefix: &Path, grace: Duration) -> Result<u64, String> {
    let client = ReqwestConnector::default()
        .connect(&t.client_options)
        .map_err(|e| format!("S3 client: {e}"))?;
    let cutoff = chrono::Utc::now()
        - chrono::Duration::from_std(grace).map_err(|e| format!("grace out of range: {e}"))?;
    let prefix = if prefix.as_ref().is_empty() { String::new() } else { format!("{}/", prefix.as_ref()) };
    let mut removed = 0u64;
    let (mut key_marker, mut id_marker) = (None::<String>, None::<String>);
    loop {
        let mut url = url::Url::parse(&format!("{}/", t.bucket_url.trim_end_matches('/')))
            .map_err(|e| format!("bucket URL {}: {e}", t.bucket_url))?;
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("uploads", "");
            if !prefix.is_empty() {
                q.append_pair("prefix", &prefix);
            }
            if let Some(k) = &key_marker {
                q.append_pair("key-marker", k);
            }
            if let Some(u) = &id_marker {
                q.append_pair("upload-id-marker", u);
            }
        }
        let credential = t.s3.credentials().get_credential().await.map_err(|e| format!("S3 credentials: {e}"))?;
        let mut req: HttpRequest = http::Request::builder()
            .method("GET")
            .uri(url.as_str())
            .body(HttpRequestBody::empty())
            .map_err(|e| format!("request: {e}"))?;
        AwsAuthorizer::new(&credential, "s3", &t.region).authorize(&mut req, None);
        let resp = client.execute(req).await.map_err(|e| format!("ListMultipartUploads: {e}"))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .bytes()
            .await
            .map_err(|e| format!("ListMultipartUploads body: {e}"))?;
        if !status.is_success() {
            return Err(format!(
                "ListMultipartUploads: HTTP {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(512)])
            ));
        }
        let list: ListResult = quick_xml::de::from_reader(body.as_ref())
            .map_err(|e| format!("ListMultipartUploads: unreadable answer: {e}"))?;
        for u in &list.uploads {
            if !u.key.starts_with(&prefix) || (prefix.is_empty() && !is_oml_bucket_key(&u.key)) {
                continue;
            }
            // An upload session's own write: it lives as long as its session, whose end aborts it.
            // (Matched below the store's own prefix.)
            if is_upload_session_write(u.key[prefix.len()..].trim_start_matches('/')) {
                continue;
            }
            let Ok(initiated) = chrono::DateTime::parse_from_rfc3339(&u.initiated) else { continue };
            if initiated > cutoff {
                continue;
            }
            // The path must name the same key: oml's keys parse unchanged.
            let Ok(path) = Path::parse(&u.key) else { continue };
            if path.as_ref() != u.key {
                continue;
            }
            // NotFound: completed or aborted meanwhile; another failure: the next round retries.
            if t.s3.abort_multipart(&path, &u.upload_id).await.is_ok() {
                removed += 1;
            }
        }
        if !list.is_truncated {
            return Ok(removed);
        }
        key_marker = list.next_key_marker;
        id_marker = list.next_upload_id_marker;
        if key_marker.is_none() && id_marker.is_none() {
            return Err("ListMultipartUploads: truncated without a next marker".to_string());
        }
    }
}
