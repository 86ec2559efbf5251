//! oml-storage: a thin C ABI over `object_store` and `deltalake` (delta-rs).
//!
//! This crate moves bytes and creates/inspects Delta tables; it holds no business logic.
//! The C declarations live in `include/oml_storage.h` and must be kept in sync by hand.
//!
//! Conventions of every `extern "C"` function here:
//! * The return value is an `OML_STORAGE_*` code; 0 means success.
//! * `err` may be NULL. When it is not and the call fails, `err->code` is set to the returned
//!   code and `err->message` to a heap C string the caller frees with
//!   `oml_storage_free_string`. On success `err` is reset to `{0, NULL}`.
//! * No panic crosses the boundary: every body runs inside `std::panic::catch_unwind` and a
//!   panic becomes `OML_STORAGE_PANIC` (the release profile keeps `panic = "unwind"` for that).
//! * Blocking: each call blocks the calling thread on one shared, lazily created tokio
//!   multi-thread runtime (2 workers). Calls may come from any number of threads at once, but
//!   never from inside a tokio runtime.

use std::collections::HashMap;
use std::ffi::{c_char, CStr, CString};
use std::future::IntoFuture;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, Once, OnceLock};

use deltalake::arrow::array::{Array, Int64Array, RecordBatch, UInt32Array};
use deltalake::arrow::compute::{concat_batches, take};
use deltalake::arrow::array::{AsArray, BinaryBuilder, StructArray};
use deltalake::arrow::ffi::{from_ffi, FFI_ArrowArray, FFI_ArrowSchema};
use deltalake::arrow::datatypes::{
    DataType as ArrowDataType, Field as ArrowField, Schema as ArrowSchema, SchemaRef,
};
use deltalake::arrow::json::ReaderBuilder;
use deltalake::arrow::row::{RowConverter, SortField};
use deltalake::datafusion::common::Column;
use deltalake::datafusion::logical_expr::Expr;
use deltalake::datafusion::prelude::SessionContext;
use deltalake::kernel::transaction::{CommitBuilder, CommitConflictError, CommitProperties, TransactionError};
use deltalake::kernel::{Action, DataType, StructField, Transaction};
use deltalake::operations::create::CreateBuilder;
use deltalake::operations::vacuum::VacuumMode;
use deltalake::protocol::{DeltaOperation, SaveMode};
use deltalake::{DeltaTable, DeltaTableBuilder, DeltaTableError};
use base64::prelude::{Engine as _, BASE64_STANDARD};
use futures::TryStreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    MultipartUpload, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
};
use url::Url;

mod durable_local;
mod resumable;
mod rewrite_guard;
mod scan;
mod staging;
use rewrite_guard::RewriteGuard;

// ---------------------------------------------------------------------------------------------
// Error codes (mirrored in oml_storage.h).

pub const OML_STORAGE_OK: i32 = 0;
/// Malformed URL, key, schema JSON, unsupported scheme or type.
pub const OML_STORAGE_INVALID_ARGUMENT: i32 = 1;
/// No such object / no Delta table at the URI.
pub const OML_STORAGE_NOT_FOUND: i32 = 2;
/// A conditional write lost a race (object/commit already exists).
pub const OML_STORAGE_ALREADY_EXISTS: i32 = 3;
/// The storage backend rejected the credentials or the operation.
pub const OML_STORAGE_PERMISSION_DENIED: i32 = 4;
/// I/O or network failure; retrying later may help.
pub const OML_STORAGE_UNAVAILABLE: i32 = 5;
/// Any other library failure.
pub const OML_STORAGE_INTERNAL: i32 = 6;
/// A Rust panic was caught at the boundary (a bug in this crate or a dependency).
pub const OML_STORAGE_PANIC: i32 = 7;
/// A Delta commit lost to a concurrent commit: the table moved past the handle's snapshot.
pub const OML_STORAGE_CONFLICT: i32 = 8;
/// A rewrite (OPTIMIZE) refused to land over a commit that removed a file it read.
pub const OML_STORAGE_STALE_REWRITE: i32 = 9;
/// A commit file of the table's log is empty or not a Delta commit (an OS crash before it was
/// durable, an operator's edit): the table is not read as if the version were an empty commit.
pub const OML_STORAGE_DAMAGED_COMMIT: i32 = 10;
/// A data file a snapshot names cannot be read as Parquet of the table's columns (scan.rs).
pub const OML_STORAGE_DAMAGED_FILE: i32 = 11;

#[repr(C)]
pub struct OmlStorageError {
    pub code: i32,
    pub message: *mut c_char,
}

#[repr(C)]
pub struct OmlStorageBuffer {
    pub data: *mut u8,
    pub len: usize,
}

struct Failure {
    code: i32,
    message: String,
}

type FfiResult<T> = Result<T, Failure>;

fn fail<T>(code: i32, message: impl Into<String>) -> FfiResult<T> {
    Err(Failure {
        code,
        message: message.into(),
    })
}

fn to_c_string(s: &str) -> *mut c_char {
    let cleaned: String = s.chars().map(|c| if c == '\0' { ' ' } else { c }).collect();
    CString::new(cleaned)
        .map(CString::into_raw)
        .unwrap_or(ptr::null_mut())
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}

/// Runs `f` for an entry point that returns nothing; a panic is swallowed, never unwound into C.
fn no_unwind(f: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(f));
}

/// Runs `f`, converts its outcome (or a panic) into a code, and fills `err`.
fn ffi_call(err: *mut OmlStorageError, f: impl FnOnce() -> FfiResult<()>) -> i32 {
    let outcome = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => Err(Failure {
            code: OML_STORAGE_PANIC,
            message: format!("panic in oml-storage: {}", panic_message(payload.as_ref())),
        }),
    };
    // Filling `err` must not unwind either (allocation failure aborts anyway).
    no_unwind(|| {
        if !err.is_null() {
            // SAFETY: the caller passes a valid, writable OmlStorageError or NULL.
            unsafe {
                match &outcome {
                    Ok(()) => {
                        (*err).code = OML_STORAGE_OK;
                        (*err).message = ptr::null_mut();
                    }
                    Err(f) => {
                        (*err).code = f.code;
                        (*err).message = to_c_string(&f.message);
                    }
                }
            }
        }
    });
    match outcome {
        Ok(()) => OML_STORAGE_OK,
        Err(f) => f.code,
    }
}

fn cstr_arg<'a>(p: *const c_char, what: &str) -> FfiResult<&'a str> {
    if p.is_null() {
        return fail(OML_STORAGE_INVALID_ARGUMENT, format!("{what} is NULL"));
    }
    // SAFETY: the caller passes a NUL-terminated string that outlives the call.
    match unsafe { CStr::from_ptr(p) }.to_str() {
        Ok(s) => Ok(s),
        Err(_) => fail(
            OML_STORAGE_INVALID_ARGUMENT,
            format!("{what} is not valid UTF-8"),
        ),
    }
}

fn opt_cstr_arg<'a>(p: *const c_char, what: &str) -> FfiResult<Option<&'a str>> {
    if p.is_null() {
        Ok(None)
    } else {
        cstr_arg(p, what).map(Some)
    }
}

fn out_arg<'a, T>(p: *mut T, what: &str) -> FfiResult<&'a mut T> {
    if p.is_null() {
        return fail(OML_STORAGE_INVALID_ARGUMENT, format!("{what} is NULL"));
    }
    // SAFETY: non-null, and the caller passes a valid, writable location.
    Ok(unsafe { &mut *p })
}

// ---------------------------------------------------------------------------------------------
// Shared runtime.

/// A multi-thread runtime kept for the life of the process, made on first use; `nice`: the nice
/// value every thread of it (workers and blocking pool) sets for itself at start.
fn shared_runtime(
    cell: &'static OnceLock<Result<tokio::runtime::Runtime, String>>,
    name: &'static str,
    workers: usize,
    nice: Option<libc::c_int>,
) -> FfiResult<&'static tokio::runtime::Runtime> {
    let rt = cell.get_or_init(|| {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(workers).thread_name(name).enable_all();
        if let Some(n) = nice {
            b.on_thread_start(move || {
                // Linux: PRIO_PROCESS with who = 0 is the calling thread's nice value, which it
                // inherited from its creator (`oml lakewriter --nice`). Only ever lowered: a thread
                // already nicer than `n` keeps its value. A failure (a seccomp filter, say) leaves
                // the thread at the inherited priority.
                // SAFETY: plain syscall wrappers with no pointer arguments.
                unsafe {
                    let now = libc::getpriority(libc::PRIO_PROCESS, 0);
                    libc::setpriority(libc::PRIO_PROCESS, 0, n.max(now));
                }
            });
        }
        b.build().map_err(|e| format!("cannot start the {name} runtime: {e}"))
    });
    match rt {
        Ok(rt) => Ok(rt),
        Err(m) => fail(OML_STORAGE_INTERNAL, m.clone()),
    }
}

fn runtime() -> FfiResult<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    shared_runtime(&RT, "oml-storage", 2, None)
}

fn block_on<F: std::future::Future>(fut: F) -> FfiResult<F::Output> {
    Ok(runtime()?.block_on(fut))
}

/// Nice value of the compaction runtime's threads: OPTIMIZE yields the CPU to the commit path.
const COMPACTION_NICE: libc::c_int = 10;

/// A runtime of its own for OPTIMIZE (oml_storage_delta_optimize), one worker at nice
/// COMPACTION_NICE. OPTIMIZE rewrites files in tasks it spawns on the current runtime; on the
/// shared one they would compete with the writer's commits at the same priority
/// (docs/performance.md "Lake": a compaction beside the batches stretched them).
fn compaction_runtime() -> FfiResult<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    shared_runtime(&RT, "oml-compaction", 1, Some(COMPACTION_NICE))
}

// ---------------------------------------------------------------------------------------------
// Error mapping.

fn map_os_error(e: object_store::Error) -> Failure {
    Failure {
        code: os_error_code(&e),
        message: e.to_string(),
    }
}

fn map_delta_error(e: DeltaTableError) -> Failure {
    let message = e.to_string();
    let code = match &e {
        DeltaTableError::ObjectStore { source } => os_error_code(source),
        DeltaTableError::NotATable(_) => OML_STORAGE_NOT_FOUND,
        DeltaTableError::InvalidTableLocation(_) => OML_STORAGE_INVALID_ARGUMENT,
        DeltaTableError::VersionAlreadyExists(_) => OML_STORAGE_ALREADY_EXISTS,
        _ if refused_by_server(&message) => OML_STORAGE_PERMISSION_DENIED,
        DeltaTableError::Io { .. } => OML_STORAGE_UNAVAILABLE,
        _ => OML_STORAGE_INTERNAL,
    };
    Failure { code, message }
}

/// Whether an error's text carries an HTTP 401 or 403 answer of the object store. object_store
/// maps those to PermissionDenied / Unauthenticated only for some requests (GET, HEAD); a refused
/// LIST, or one wrapped by delta-rs's log reader, reaches us as a generic error whose text holds
/// the status line (reqwest's `403 Forbidden`). A refusal is not transient: callers must not
/// retry it as if the store were unavailable (`oml reconcile` with credentials that may not read
/// exits 4, not 5).
fn refused_by_server(text: &str) -> bool {
    text.contains("403 Forbidden") || text.contains("401 Unauthorized")
}

fn os_error_code(e: &object_store::Error) -> i32 {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => OML_STORAGE_NOT_FOUND,
        E::InvalidPath { .. } | E::UnknownConfigurationKey { .. } => OML_STORAGE_INVALID_ARGUMENT,
        E::AlreadyExists { .. } | E::Precondition { .. } => OML_STORAGE_ALREADY_EXISTS,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => OML_STORAGE_PERMISSION_DENIED,
        E::Generic { .. } if refused_by_server(&e.to_string()) => OML_STORAGE_PERMISSION_DENIED,
        E::NotSupported { .. } | E::NotImplemented { .. } => OML_STORAGE_INTERNAL,
        // Generic (HTTP/network/io), JoinError, NotModified, and future variants.
        _ => OML_STORAGE_UNAVAILABLE,
    }
}

// ---------------------------------------------------------------------------------------------
// Object store.

/// Opaque handle: a store plus the key prefix all keys are relative to.
pub struct OmlStorageStore {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    /// Where interrupted writes leave bytes (oml_storage_store_sweep_staging).
    leftovers: staging::Leftovers,
}

fn open_local(dir: &std::path::Path) -> FfiResult<OmlStorageStore> {
    if !dir.is_absolute() {
        return fail(
            OML_STORAGE_INVALID_ARGUMENT,
            format!("local store path must be absolute: {}", dir.display()),
        );
    }
    if let Err(e) = std::fs::create_dir_all(dir) {
        return fail(
            OML_STORAGE_UNAVAILABLE,
            format!("cannot create {}: {e}", dir.display()),
        );
    }
    let fs = LocalFileSystem::new_with_prefix(dir)
        .map_err(map_os_error)?
        // Remove directories left empty by Delete, so "directories" behave like S3 prefixes.
        .with_automatic_cleanup(true);
    // Every write fsynced (file and directories up to `dir`) before it returns (durable_local.rs):
    // an object the caller reported stored (an upload's chunk, a promoted body) survives an OS crash.
    // LocalFileSystem canonicalized its prefix: so is the directory the fsyncs stop at.
    let root = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let fs = durable_local::DurableLocal::new(fs, root.clone());
    Ok(OmlStorageStore {
        store: Arc::new(fs),
        prefix: Path::ROOT,
        leftovers: staging::Leftovers::Local(root),
    })
}

fn open_store(url_str: &str) -> FfiResult<OmlStorageStore> {
    if url_str.starts_with('/') {
        return open_local(std::path::Path::new(url_str));
    }
    let url = match Url::parse(url_str) {
        Ok(u) => u,
        Err(e) => {
            return fail(
                OML_STORAGE_INVALID_ARGUMENT,
                format!("bad store URL {url_str:?}: {e}"),
            )
        }
    };
    match url.scheme() {
        "file" => {
            if url
                .host_str()
                .is_some_and(|h| !h.is_empty() && h != "localhost")
            {
                return fail(
                    OML_STORAGE_INVALID_ARGUMENT,
                    format!("file URL with a host: {url_str}"),
                );
            }
            let dir = url.to_file_path().or_else(|_| {
                fail(
                    OML_STORAGE_INVALID_ARGUMENT,
                    format!("bad file URL: {url_str}"),
                )
            })?;
            open_local(&dir)
        }
        "s3" => {
            let bucket = url.host_str().unwrap_or("");
            if bucket.is_empty() {
                return fail(
                    OML_STORAGE_INVALID_ARGUMENT,
                    format!("s3 URL without a bucket: {url_str}"),
                );
            }
            // from_env reads every AWS_* variable object_store knows: AWS_ENDPOINT_URL,
            // AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION,
            // AWS_ALLOW_HTTP, ... Conditional puts (put_if_absent) use object_store's default
            // S3ConditionalPut::ETagMatch: a PUT with If-None-Match: *.
            let builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
            // For the staging sweep's own request (ListMultipartUploads): the bucket's URL as
            // object_store forms it (AWS_ENDPOINT_URL_S3 before AWS_ENDPOINT_URL; path style
            // unless AWS_VIRTUAL_HOSTED_STYLE_REQUEST), and the store's client settings.
            let cfg = |k: AmazonS3ConfigKey| builder.get_config_value(&k);
            let region = cfg(AmazonS3ConfigKey::Region).unwrap_or_else(|| "us-east-1".to_string());
            let virtual_hosted = cfg(AmazonS3ConfigKey::VirtualHostedStyleRequest)
                .is_some_and(|v| v.eq_ignore_ascii_case("true"));
            let endpoint = cfg(AmazonS3ConfigKey::S3Endpoint).or_else(|| cfg(AmazonS3ConfigKey::Endpoint));
            let bucket_url = match (endpoint, virtual_hosted) {
                (Some(e), true) => e,
                (Some(e), false) => format!("{}/{bucket}", e.trim_end_matches('/')),
                (None, true) => format!("https://{bucket}.s3.{region}.amazonaws.com"),
                (None, false) => format!("https://s3.{region}.amazonaws.com/{bucket}"),
            };
            let mut client_options = object_store::ClientOptions::new();
            {
                use object_store::ClientConfigKey as C;
                for key in [
                    C::AllowHttp, C::AllowInvalidCertificates, C::ConnectTimeout, C::Http1Only, C::Http2Only,
                    C::ProxyUrl, C::ProxyCaCertificate, C::ProxyExcludes, C::Timeout, C::UserAgent,
                ] {
                    if let Some(v) = cfg(AmazonS3ConfigKey::Client(key)) {
                        client_options = client_options.with_config(key, v);
                    }
                }
            }
            let s3 = builder
                .build()
                .map_err(|e| {
                    let mut f = map_os_error(e);
                    if f.code == OML_STORAGE_UNAVAILABLE {
                        f.code = OML_STORAGE_INVALID_ARGUMENT;
                    }
                    f
                })?;
            // The URL path, percent-decoded and parsed as an object_store path.
            let prefix = Path::from_url_path(url.path()).or_else(|e| {
                fail(
                    OML_STORAGE_INVALID_ARGUMENT,
                    format!("bad prefix in {url_str:?}: {e}"),
                )
            })?;
            let s3 = Arc::new(s3);
            Ok(OmlStorageStore {
                store: s3.clone(),
                prefix,
                leftovers: staging::Leftovers::S3(staging::S3Target {
                    s3,
                    bucket_url,
                    region,
                    client_options,
                }),
            })
        }
        other => fail(
            OML_STORAGE_INVALID_ARGUMENT,
            format!("unsupported store scheme {other:?} in {url_str:?} (want file:// or s3://)"),
        ),
    }
}

fn key_path(store: &OmlStorageStore, key: &str) -> FfiResult<Path> {
    if key.is_empty() || key.starts_with('/') || key.ends_with('/') {
        return fail(
            OML_STORAGE_INVALID_ARGUMENT,
            format!("bad object key {key:?}"),
        );
    }
    let rel = Path::parse(key).or_else(|e| {
        fail(
            OML_STORAGE_INVALID_ARGUMENT,
            format!("bad object key {key:?}: {e}"),
        )
    })?;
    Ok(store.prefix.parts().chain(rel.parts()).collect())
}

fn store_ref<'a>(store: *const OmlStorageStore) -> FfiResult<&'a OmlStorageStore> {
    if store.is_null() {
        return fail(OML_STORAGE_INVALID_ARGUMENT, "store is NULL");
    }
    // SAFETY: a handle from oml_storage_store_open that has not been closed.
    Ok(unsafe { &*store })
}

/// fsyncs made by local stores so far (files and directories). See oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_durable_syncs() -> u64 {
    durable_local::sync_count()
}

/// Whole listings of a local table's log so far. See oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_durable_log_lists() -> u64 {
    durable_local::log_list_count()
}

/// Opens a store. See oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_store_open(
    url: *const c_char,
    out_store: *mut *mut OmlStorageStore,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_store, "out_store")?;
        *out = ptr::null_mut();
        let url = cstr_arg(url, "url")?;
        let store = open_store(url)?;
        *out = Box::into_raw(Box::new(store));
        Ok(())
    })
}

/// Closes a store handle (NULL is a no-op).
#[no_mangle]
pub extern "C" fn oml_storage_store_close(store: *mut OmlStorageStore) {
    no_unwind(|| {
        if !store.is_null() {
            // SAFETY: a handle from oml_storage_store_open, closed once.
            drop(unsafe { Box::from_raw(store) });
        }
    });
}

#[no_mangle]
pub extern "C" fn oml_storage_store_put(
    store: *const OmlStorageStore,
    key: *const c_char,
    data: *const u8,
    len: usize,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let store = store_ref(store)?;
        let path = key_path(store, cstr_arg(key, "key")?)?;
        let bytes = bytes_arg(data, len)?;
        block_on(store.store.put(&path, PutPayload::from_bytes(bytes)))?.map_err(map_os_error)?;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn oml_storage_store_get(
    store: *const OmlStorageStore,
    key: *const c_char,
    out: *mut OmlStorageBuffer,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out, "out")?;
        out.data = ptr::null_mut();
        out.len = 0;
        let store = store_ref(store)?;
        let path = key_path(store, cstr_arg(key, "key")?)?;
        let bytes = block_on(async {
            let r = store.store.get(&path).await?;
            r.bytes().await
        })?
        .map_err(map_os_error)?;
        let boxed: Box<[u8]> = bytes.to_vec().into_boxed_slice();
        out.len = boxed.len();
        out.data = Box::into_raw(boxed) as *mut u8;
        Ok(())
    })
}

/// Every object under the string `prefix` (S3 ListObjectsV2 semantics: listed recursively below
/// the prefix's last '/', then filtered by the whole prefix), keyed relative to the store prefix,
/// byte-wise sorted, one entry per key.
fn list_objects(store: &OmlStorageStore, prefix: &str) -> FfiResult<Vec<(String, object_store::ObjectMeta)>> {
    let dir = match prefix.rfind('/') {
        Some(i) => &prefix[..i],
        None => "",
    };
    let dir_path: Path = if dir.is_empty() {
        store.prefix.clone()
    } else {
        let rel = Path::parse(dir).or_else(|e| {
            fail(
                OML_STORAGE_INVALID_ARGUMENT,
                format!("bad list prefix {prefix:?}: {e}"),
            )
        })?;
        store.prefix.parts().chain(rel.parts()).collect()
    };
    let list_arg = if dir_path.as_ref().is_empty() {
        None
    } else {
        Some(&dir_path)
    };
    let metas: Vec<object_store::ObjectMeta> =
        block_on(store.store.list(list_arg).try_collect())?.map_err(map_os_error)?;
    let mut out: Vec<(String, object_store::ObjectMeta)> = metas
        .into_iter()
        .filter_map(|m| {
            let parts: Vec<String> = m
                .location
                .prefix_match(&store.prefix)?
                .map(|p| p.as_ref().to_string())
                .collect();
            Some((parts.join("/"), m))
        })
        .filter(|(k, _)| !k.is_empty() && k.starts_with(prefix))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out.dedup_by(|a, b| a.0 == b.0);
    Ok(out)
}

#[no_mangle]
pub extern "C" fn oml_storage_store_list(
    store: *const OmlStorageStore,
    prefix: *const c_char,
    out_json: *mut *mut c_char,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_json, "out_json")?;
        *out = ptr::null_mut();
        let store = store_ref(store)?;
        let prefix = opt_cstr_arg(prefix, "prefix")?.unwrap_or("");
        let keys: Vec<String> = list_objects(store, prefix)?.into_iter().map(|(k, _)| k).collect();
        let json = serde_json::to_string(&keys)
            .or_else(|e| fail(OML_STORAGE_INTERNAL, format!("cannot encode key list: {e}")))?;
        *out = to_c_string(&json);
        Ok(())
    })
}

/// As oml_storage_store_list, with each object's size and last modification. See oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_store_list_meta(
    store: *const OmlStorageStore,
    prefix: *const c_char,
    out_json: *mut *mut c_char,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_json, "out_json")?;
        *out = ptr::null_mut();
        let store = store_ref(store)?;
        let prefix = opt_cstr_arg(prefix, "prefix")?.unwrap_or("");
        let entries: Vec<serde_json::Value> = list_objects(store, prefix)?
            .into_iter()
            .map(|(k, m)| {
                serde_json::json!({
                    "key": k,
                    "size": m.size,
                    "modified_ms": m.last_modified.timestamp_millis(),
                })
            })
            .collect();
        *out = to_c_string(&serde_json::Value::from(entries).to_string());
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn oml_storage_store_delete(
    store: *const OmlStorageStore,
    key: *const c_char,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let store = store_ref(store)?;
        let path = key_path(store, cstr_arg(key, "key")?)?;
        match block_on(store.store.delete(&path))? {
            Ok(()) => Ok(()),
            // Deleting a missing object succeeds (S3 semantics, also for local directories).
            Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(map_os_error(e)),
        }
    })
}

/// Removes what interrupted writes left in the store (staging.rs): local staging files not
/// modified for `grace_secs`, or S3 multipart uploads under the prefix initiated that long ago.
/// *removed: how many.
#[no_mangle]
pub extern "C" fn oml_storage_store_sweep_staging(
    store: *const OmlStorageStore,
    grace_secs: u64,
    removed: *mut u64,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let store = store_ref(store)?;
        let grace = std::time::Duration::from_secs(grace_secs);
        let n = match &store.leftovers {
            staging::Leftovers::Local(root) => staging::sweep_local(root, grace).or_else(|e| {
                fail(OML_STORAGE_UNAVAILABLE, format!("staging sweep of {}: {e}", root.display()))
            })?,
            staging::Leftovers::S3(t) => block_on(staging::sweep_s3(t, &store.prefix, grace))?
                .or_else(|e| fail(OML_STORAGE_UNAVAILABLE, format!("staging sweep: {e}")))?,
        };
        if !removed.is_null() {
            // SAFETY: the caller passes a writable u64 or NULL.
            unsafe { *removed = n };
        }
        Ok(())
    })
}

/// `len` bytes at `data` (NULL allowed only with len 0), copied.
fn bytes_arg(data: *const u8, len: usize) -> FfiResult<bytes::Bytes> {
    if data.is_null() && len != 0 {
        return fail(OML_STORAGE_INVALID_ARGUMENT, "data is NULL but len > 0");
    }
    if len == 0 {
        return Ok(bytes::Bytes::new());
    }
    // SAFETY: the caller passes `len` readable bytes at `data`.
    Ok(bytes::Bytes::copy_from_slice(unsafe {
        std::slice::from_raw_parts(data, len)
    }))
}

/// Moves `bytes` into a buffer the caller frees with oml_storage_free_buffer.
fn fill_buffer(out: &mut OmlStorageBuffer, bytes: bytes::Bytes) {
    let boxed: Box<[u8]> = Vec::from(bytes).into_boxed_slice();
    out.len = boxed.len();
    out.data = Box::into_raw(boxed) as *mut u8;
}

/// Creates the object only if the key is free (local: hard link of a staged file; S3: PUT with
/// If-None-Match: *). OML_STORAGE_ALREADY_EXISTS, with nothing written, if an object is there.
#[no_mangle]
pub extern "C" fn oml_storage_store_put_if_absent(
    store: *const OmlStorageStore,
    key: *const c_char,
    data: *const u8,
    len: usize,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let store = store_ref(store)?;
        let path = key_path(store, cstr_arg(key, "key")?)?;
        let payload = PutPayload::from_bytes(bytes_arg(data, len)?);
        let opts = PutOptions::from(PutMode::Create);
        match block_on(store.store.put_opts(&path, payload, opts))? {
            Ok(_) => Ok(()),
            // Local: AlreadyExists; S3: object_store turns 412/304 into AlreadyExists.
            Err(e @ (object_store::Error::AlreadyExists { .. }
            | object_store::Error::Precondition { .. })) => fail(
                OML_STORAGE_ALREADY_EXISTS,
                format!("object {path} already exists: {e}"),
            ),
            Err(e) => Err(map_os_error(e)),
        }
    })
}

/// Bytes [offset, min(offset + length, size)) of the object; empty when length is 0 or offset
/// is at or past the end. OML_STORAGE_NOT_FOUND if the object does not exist.
#[no_mangle]
pub extern "C" fn oml_storage_store_get_range(
    store: *const OmlStorageStore,
    key: *const c_char,
    offset: u64,
    length: u64,
    out: *mut OmlStorageBuffer,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out, "out")?;
        out.data = ptr::null_mut();
        out.len = 0;
        let store = store_ref(store)?;
        let path = key_path(store, cstr_arg(key, "key")?)?;
        let bytes = block_on(async {
            if length == 0 {
                // Still answers NOT_FOUND for a missing object.
                store.store.head(&path).await?;
                return Ok(bytes::Bytes::new());
            }
            let end = offset.saturating_add(length);
            match store.store.get_range(&path, offset..end).await {
                Ok(b) => Ok(b),
                Err(e @ object_store::Error::NotFound { .. }) => Err(e),
                // A start at or past the end is an error to object_store (local: InvalidRange;
                // S3: 416), and so is any range of an empty object: HEAD tells that case from
                // a real failure.
                Err(e) => match store.store.head(&path).await {
                    Ok(meta) if meta.size <= offset => Ok(bytes::Bytes::new()),
                    Ok(_) => Err(e),
                    Err(h) => Err(h),
                },
            }
        })?
        .map_err(map_os_error)?;
        fill_buffer(out, bytes);
        Ok(())
    })
}

/// As oml_storage_store_get_range, into the caller's `length` bytes at `dst` (*out_len: how many
/// were read, fewer only at the object's end). On a local directory the file is read straight
/// into `dst` (no buffer of the adapter's, no copy) when the key holds only characters that
/// object_store stores unencoded; otherwise, and on S3, through get_range and one copy.
#[no_mangle]
pub extern "C" fn oml_storage_store_read_range(
    store: *const OmlStorageStore,
    key: *const c_char,
    offset: u64,
    length: u64,
    dst: *mut u8,
    out_len: *mut u64,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out_len = out_arg(out_len, "out_len")?;
        *out_len = 0;
        if dst.is_null() && length != 0 {
            return fail(OML_STORAGE_INVALID_ARGUMENT, "dst is NULL but length > 0");
        }
        let len = usize::try_from(length).or_else(|_| fail(OML_STORAGE_INVALID_ARGUMENT, "length too large"))?;
        // SAFETY: the caller passes `length` writable bytes at `dst`.
        let dst: &mut [u8] = if len == 0 { &mut [] } else { unsafe { std::slice::from_raw_parts_mut(dst, len) } };
        let store_r = store_ref(store)?;
        let key_str = cstr_arg(key, "key")?;
        let plain = key_str.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b));
        if let (staging::Leftovers::Local(root), true) = (&store_r.leftovers, plain) {
            let path = key_path(store_r, key_str)?;
            let file = resumable::local_file(root, &path);
            let f = match std::fs::File::open(&file) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return fail(OML_STORAGE_NOT_FOUND, format!("object {key_str} not found"))
                }
                Err(e) => return fail(OML_STORAGE_UNAVAILABLE, format!("open {}: {e}", file.display())),
            };
            // A directory is no object (object_store answers NotFound for one too).
            if f.metadata().map(|m| m.is_dir()).unwrap_or(false) {
                return fail(OML_STORAGE_NOT_FOUND, format!("object {key_str} not found"));
            }
            if offset > i64::MAX as u64 {
                return Ok(()); // past any file's end: no bytes (pread would refuse the offset)
            }
            let mut got = 0usize;
            while got < len {
                match std::os::unix::fs::FileExt::read_at(&f, &mut dst[got..], offset.saturating_add(got as u64)) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return fail(OML_STORAGE_UNAVAILABLE, format!("read {}: {e}", file.display())),
                }
            }
            *out_len = got as u64;
            return Ok(());
        }
        let mut buf = OmlStorageBuffer { data: ptr::null_mut(), len: 0 };
        let mut inner = OmlStorageError { code: 0, message: ptr::null_mut() };
        let rc = oml_storage_store_get_range(store, key, offset, length, &mut buf, &mut inner);
        if rc != OML_STORAGE_OK {
            // SAFETY: the message, if any, was allocated by to_c_string for this call.
            let msg = if inner.message.is_null() {
                String::new()
            } else {
                let m = unsafe { CStr::from_ptr(inner.message) }.to_string_lossy().into_owned();
                oml_storage_free_string(inner.message);
                m
            };
            return fail(rc, msg);
        }
        let n = buf.len.min(len);
        if n > 0 {
            // SAFETY: get_range filled `buf.len` bytes at `buf.data`.
            dst[..n].copy_from_slice(unsafe { std::slice::from_raw_parts(buf.data, n) });
        }
        oml_storage_free_buffer(&mut buf);
        *out_len = n as u64;
        Ok(())
    })
}

/// The object's size in bytes (HEAD). OML_STORAGE_NOT_FOUND if it does not exist.
#[no_mangle]
pub extern "C" fn oml_storage_store_head(
    store: *const OmlStorageStore,
    key: *const c_char,
    out_size: *mut u64,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_size, "out_size")?;
        *out = 0;
        let store = store_ref(store)?;
        let path = key_path(store, cstr_arg(key, "key")?)?;
        let meta = block_on(store.store.head(&path))?.map_err(map_os_error)?;
        *out = meta.size;
        Ok(())
    })
}

/// Server-side copy within the store, replacing any object at to_key (local: hard link staged
/// and renamed into place; S3: CopyObject). OML_STORAGE_NOT_FOUND if from_key does not exist.
#[no_mangle]
pub extern "C" fn oml_storage_store_copy(
    store: *const OmlStorageStore,
    from_key: *const c_char,
    to_key: *const c_char,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let store = store_ref(store)?;
        let from = key_path(store, cstr_arg(from_key, "from_key")?)?;
        let to = key_path(store, cstr_arg(to_key, "to_key")?)?;
        block_on(store.store.copy(&from, &to))?.map_err(map_os_error)?;
        Ok(())
    })
}

/// Part size of a streaming writer: what it buffers before uploading a part. S3 wants parts of
/// at least 5 MiB except the last, and at most 10,000 parts (so objects up to 80 GiB).
pub const OML_STORAGE_WRITER_PART_BYTES: usize = 8 << 20;

#[derive(PartialEq)]
enum WriterState {
    Open,
    Finished,
    Aborted,
    Failed,
}

/// Opaque handle: one streaming (multipart) upload of one object.
/// Invariant: `buffer.len() < OML_STORAGE_WRITER_PART_BYTES` between calls, and `upload` is
/// Some exactly while the upload may still hold parts (Open, or Failed before its abort).
pub struct OmlStorageWriter {
    upload: Option<Box<dyn MultipartUpload>>,
    buffer: Vec<u8>,
    state: WriterState,
    location: Path,
}

impl OmlStorageWriter {
    fn check_open(&self, op: &str) -> FfiResult<()> {
        let what = match self.state {
            WriterState::Open => return Ok(()),
            WriterState::Finished => "finished",
            WriterState::Aborted => "aborted",
            WriterState::Failed => "failed",
        };
        fail(
            OML_STORAGE_INVALID_ARGUMENT,
            format!("{op} on a {what} writer for {}", self.location),
        )
    }

    /// Uploads the buffer as the next part and waits for it (so at most one part is in memory).
    /// On failure the writer is Failed and its upload aborted.
    fn flush_part(&mut self) -> FfiResult<()> {
        let part = std::mem::replace(
            &mut self.buffer,
            Vec::with_capacity(OML_STORAGE_WRITER_PART_BYTES),
        );
        let Some(upload) = self.upload.as_mut() else {
            return fail(OML_STORAGE_INTERNAL, "writer without an upload");
        };
        let sent = block_on(upload.put_part(PutPayload::from(part)))?;
        if let Err(e) = sent {
            self.fail_and_abort();
            return Err(map_os_error(e));
        }
        Ok(())
    }

    /// Best effort: a failed writer removes its parts (S3) or staging file (local).
    fn fail_and_abort(&mut self) {
        self.state = WriterState::Failed;
        self.buffer = Vec::new();
        if let Some(mut upload) = self.upload.take() {
            let _ = block_on(upload.abort());
        }
    }
}

fn writer_ref<'a>(writer: *mut OmlStorageWriter) -> FfiResult<&'a mut OmlStorageWriter> {
    if writer.is_null() {
        return fail(OML_STORAGE_INVALID_ARGUMENT, "writer is NULL");
    }
    // SAFETY: a handle from oml_storage_writer_open that has not been closed, used by one
    // thread at a time (the header's contract).
    Ok(unsafe { &mut *writer })
}

/// Starts a streaming write of `key`. See oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_writer_open(
    store: *const OmlStorageStore,
    key: *const c_char,
    out_writer: *mut *mut OmlStorageWriter,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_writer, "out_writer")?;
        *out = ptr::null_mut();
        let store = store_ref(store)?;
        let location = key_path(store, cstr_arg(key, "key")?)?;
        let upload = block_on(store.store.put_multipart(&location))?.map_err(map_os_error)?;
        *out = Box::into_raw(Box::new(OmlStorageWriter {
            upload: Some(upload),
            buffer: Vec::with_capacity(OML_STORAGE_WRITER_PART_BYTES),
            state: WriterState::Open,
            location,
        }));
        Ok(())
    })
}

/// Appends bytes; every full part is uploaded before the call returns.
#[no_mangle]
pub extern "C" fn oml_storage_writer_write(
    writer: *mut OmlStorageWriter,
    data: *const u8,
    len: usize,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let w = writer_ref(writer)?;
        w.check_open("write")?;
        if data.is_null() && len != 0 {
            return fail(OML_STORAGE_INVALID_ARGUMENT, "data is NULL but len > 0");
        }
        let mut rest: &[u8] = if len == 0 {
            &[]
        } else {
            // SAFETY: the caller passes `len` readable bytes at `data`.
            unsafe { std::slice::from_raw_parts(data, len) }
        };
        while !rest.is_empty() {
            let room = OML_STORAGE_WRITER_PART_BYTES - w.buffer.len();
            let take = room.min(rest.len());
            w.buffer.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if w.buffer.len() == OML_STORAGE_WRITER_PART_BYTES {
                w.flush_part()?;
            }
        }
        Ok(())
    })
}

/// Uploads the buffered rest and completes the upload: the object appears atomically.
#[no_mangle]
pub extern "C" fn oml_storage_writer_finish(
    writer: *mut OmlStorageWriter,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let w = writer_ref(writer)?;
        w.check_open("finish")?;
        if !w.buffer.is_empty() {
            w.flush_part()?;
        }
        // With no part at all, S3 completes with one empty part and local renames an empty
        // file: an empty object.
        let Some(upload) = w.upload.as_mut() else {
            return fail(OML_STORAGE_INTERNAL, "writer without an upload");
        };
        match block_on(upload.complete())? {
            Ok(_) => {
                w.upload = None;
                w.state = WriterState::Finished;
                Ok(())
            }
            Err(e) => {
                w.fail_and_abort();
                Err(map_os_error(e))
            }
        }
    })
}

/// Discards the upload; the key is left as it was. See oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_writer_abort(
    writer: *mut OmlStorageWriter,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let w = writer_ref(writer)?;
        match w.state {
            WriterState::Finished => {
                return fail(
                    OML_STORAGE_INVALID_ARGUMENT,
                    format!("abort on a finished writer for {}", w.location),
                )
            }
            WriterState::Aborted => return Ok(()),
            WriterState::Open | WriterState::Failed => {}
        }
        w.buffer = Vec::new();
        let outcome = match w.upload.take() {
            Some(mut upload) => block_on(upload.abort())?,
            None => Ok(()),
        };
        w.state = WriterState::Aborted;
        outcome.map_err(map_os_error)
    })
}

/// Frees a writer; an open one is aborted first (best effort). NULL is a no-op.
#[no_mangle]
pub extern "C" fn oml_storage_writer_close(writer: *mut OmlStorageWriter) {
    no_unwind(|| {
        if writer.is_null() {
            return;
        }
        // SAFETY: a handle from oml_storage_writer_open, closed once.
        let mut w = unsafe { Box::from_raw(writer) };
        if let Some(mut upload) = w.upload.take() {
            let _ = block_on(upload.abort());
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Delta tables.

fn register_delta_handlers() {
    static ONCE: Once = Once::new();
    // The deltalake crate also registers these from a #[ctor], but a constructor in a static
    // archive member that nothing references can be dropped by the linker; register explicitly.
    ONCE.call_once(|| deltalake::aws::register_handlers(None));
}

fn is_s3(uri: &str) -> bool {
    uri.starts_with("s3://") || uri.starts_with("s3a://")
}

/// Storage options for s3:// table URIs, from the same AWS_* environment variables the object
/// store uses (deltalake-aws would also read them itself; passing them keeps it explicit).
///
/// Commit safety on S3 (decided by reading deltalake-core 1.1.3 / deltalake-aws 1.0.0 /
/// object_store 0.13.2):
/// * delta-rs 1.x dropped the DynamoDB locking provider; every S3 table uses `DefaultLogStore`,
///   which writes `_delta_log/<version>.json` with `PutMode::Create`.
/// * object_store implements `PutMode::Create` on S3 as a PUT with `If-None-Match: *` when
///   `aws_conditional_put = etag` (its default in 0.13; `disabled` makes every commit fail
///   with NotImplemented). AWS S3 (since 2024), MinIO, R2 and recent moto honour it.
/// * `AWS_S3_ALLOW_UNSAFE_RENAME` only wraps the store in `S3StorageBackend`, which forwards
///   `put_opts` unchanged; it neither helps nor is needed, so it is not set.
///
/// Hence we pin `aws_conditional_put = etag` explicitly (unless AWS_CONDITIONAL_PUT is set),
/// so a loser of a concurrent commit race gets VersionAlreadyExists instead of silently
/// overwriting a commit. Caveat: a loopback S3 server that ignores If-None-Match cannot
/// detect concurrent writers; oml has a single lake writer per table, so it stays correct.
fn delta_storage_options(uri: &str) -> HashMap<String, String> {
    let mut opts = HashMap::new();
    if !is_s3(uri) {
        return opts;
    }
    for key in [
        "AWS_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_ALLOW_HTTP",
    ] {
        if let Ok(v) = std::env::var(key) {
            opts.insert(key.to_string(), v);
        }
    }
    let cp = std::env::var("AWS_CONDITIONAL_PUT").unwrap_or_else(|_| "etag".to_string());
    opts.insert("aws_conditional_put".to_string(), cp);
    opts
}

fn parse_type(t: &str) -> FfiResult<DataType> {
    Ok(match t {
        "string" => DataType::STRING,
        "long" => DataType::LONG,
        "integer" => DataType::INTEGER,
        "binary" => DataType::BINARY,
        // Delta `timestamp`: microseconds since the epoch, adjusted to UTC.
        "timestamp" => DataType::TIMESTAMP,
        "boolean" => DataType::BOOLEAN,
        // Delta `date`: days since the epoch (Arrow Date32); JSON rows give "YYYY-MM-DD".
        "date" => DataType::DATE,
        other => {
            return fail(
                OML_STORAGE_INVALID_ARGUMENT,
                format!(
                    "unsupported column type {other:?} \
                     (want string, long, integer, binary, timestamp, boolean, date)"
                ),
            )
        }
    })
}

fn parse_schema(json: &str) -> FfiResult<Vec<StructField>> {
    let v: serde_json::Value = serde_json::from_str(json).or_else(|e| {
        fail(
            OML_STORAGE_INVALID_ARGUMENT,
            format!("schema is not JSON: {e}"),
        )
    })?;
    let arr = match v.as_array() {
        Some(a) if !a.is_empty() => a,
        _ => {
            return fail(
                OML_STORAGE_INVALID_ARGUMENT,
                "schema must be a non-empty JSON array",
            )
        }
    };
    let mut fields = Vec::with_capacity(arr.len());
    let mut seen = std::collections::HashSet::new();
    for (i, col) in arr.iter().enumerate() {
        let name = col.get("name").and_then(|x| x.as_str()).unwrap_or("");
        let ty = col.get("type").and_then(|x| x.as_str()).unwrap_or("");
        let nullable = match col.get("nullable") {
            None => true,
            Some(serde_json::Value::Bool(b)) => *b,
            Some(_) => {
                return fail(
                    OML_STORAGE_INVALID_ARGUMENT,
                    format!("column {i}: nullable must be a boolean"),
                )
            }
        };
        if name.is_empty() {
            return fail(
                OML_STORAGE_INVALID_ARGUMENT,
                format!("column {i}: missing name"),
            );
        }
        if !seen.insert(name.to_string()) {
            return fail(
                OML_STORAGE_INVALID_ARGUMENT,
                format!("duplicate column {name:?}"),
            );
        }
        fields.push(StructField::new(name, parse_type(ty)?, nullable));
    }
    Ok(fields)
}

fn parse_partition_columns(json: Option<&str>, fields: &[StructField]) -> FfiResult<Vec<String>> {
    let Some(json) = json else {
        return Ok(Vec::new());
    };
    if json.trim().is_empty() {
        return Ok(Vec::new());
    }
    let cols: Vec<String> = serde_json::from_str(json).or_else(|e| {
        fail(
            OML_STORAGE_INVALID_ARGUMENT,
            format!("partition columns must be a JSON array of strings: {e}"),
        )
    })?;
    for c in &cols {
        if !fields.iter().any(|f| f.name() == c) {
            return fail(
                OML_STORAGE_INVALID_ARGUMENT,
                format!("partition column {c:?} is not in the schema"),
            );
        }
    }
    Ok(cols)
}

/// Table URL for `uri` (local path, file:// or s3://); `create_dir` creates local directories.
fn table_url(uri: &str, create_dir: bool) -> FfiResult<Url> {
    if uri.is_empty() {
        return fail(OML_STORAGE_INVALID_ARGUMENT, "empty table URI");
    }
    let local: Option<std::path::PathBuf> = if uri.starts_with('/') {
        Some(std::path::PathBuf::from(uri))
    } else if uri.starts_with("file:") {
        let u = Url::parse(uri).or_else(|e| {
            fail(
                OML_STORAGE_INVALID_ARGUMENT,
                format!("bad table URI {uri:?}: {e}"),
            )
        })?;
        Some(u.to_file_path().or_else(|_| {
            fail(
                OML_STORAGE_INVALID_ARGUMENT,
                format!("bad file URL {uri:?}"),
            )
        })?)
    } else if is_s3(uri) {
        None
    } else {
        return fail(
            OML_STORAGE_INVALID_ARGUMENT,
            format!("unsupported table URI {uri:?} (want an absolute path, file:// or s3://)"),
        );
    };
    if let Some(p) = &local {
        if !create_dir && !p.is_dir() {
            return fail(
                OML_STORAGE_NOT_FOUND,
                format!("no Delta table at {uri}: directory does not exist"),
            );
        }
    }
    let target = match &local {
        Some(p) => p.to_string_lossy().into_owned(),
        None => uri.to_string(),
    };
    deltalake::ensure_table_uri(&target).map_err(map_delta_error)
}

/// The builder of a table handle at `url`. A local table's writes go through DurableLocal (each
/// data file and commit file fsynced, with the directories up to the table's parent, before the
/// write returns): object_store's LocalFileSystem never fsyncs, and the frontier in PostgreSQL,
/// which is durable, must never pass a commit an OS crash can still lose (durable_local.rs).
fn table_builder(
    url: &Url,
    opts: &HashMap<String, String>,
) -> Result<DeltaTableBuilder, DeltaTableError> {
    let builder = DeltaTableBuilder::from_url(url.clone())?.with_storage_options(opts.clone());
    if url.scheme() != "file" {
        return Ok(builder);
    }
    let dir = url
        .to_file_path()
        .map_err(|_| DeltaTableError::InvalidTableLocation(url.to_string()))?;
    let stop = dir.parent().map(|p| p.to_path_buf()).unwrap_or(dir);
    let store = durable_local::DurableLocal::new(LocalFileSystem::new(), stop);
    Ok(builder.with_storage_backend(Arc::new(store), url.clone()))
}

/// Loads the table at `url`, or Ok(None) if there is no Delta table there.
async fn load_table(
    url: &Url,
    opts: &HashMap<String, String>,
) -> Result<Option<DeltaTable>, DeltaTableError> {
    let mut table = table_builder(url, opts)?.build()?;
    if !table.verify_deltatable_existence().await? {
        return Ok(None);
    }
    match table.load().await {
        Ok(()) => Ok(Some(table)),
        Err(DeltaTableError::NotATable(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

fn table_version(t: &DeltaTable) -> FfiResult<i64> {
    match t.version() {
        Some(v) => Ok(v as i64),
        None => fail(OML_STORAGE_INTERNAL, "table loaded without a version"),
    }
}

fn schema_matches(
    t: &DeltaTable,
    fields: &[StructField],
    partitions: &[String],
) -> FfiResult<bool> {
    let snap = t.snapshot().map_err(map_delta_error)?;
    let schema = snap.schema();
    let existing: Vec<&StructField> = schema.fields().collect();
    if existing.len() != fields.len() {
        return Ok(false);
    }
    for (a, b) in existing.iter().zip(fields) {
        if a.name() != b.name()
            || a.data_type() != b.data_type()
            || a.is_nullable() != b.is_nullable()
        {
            return Ok(false);
        }
    }
    Ok(snap.metadata().partition_columns() == partitions)
}

/// Creates a Delta table or reports the existing one. See oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_delta_create_table(
    table_uri: *const c_char,
    schema_json: *const c_char,
    partition_columns_json: *const c_char,
    table_name: *const c_char,
    out_version: *mut i64,
    out_created: *mut i32,
    out_schema_matches: *mut i32,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out_version = out_arg(out_version, "out_version")?;
        let out_created = out_arg(out_created, "out_created")?;
        let out_matches = out_arg(out_schema_matches, "out_schema_matches")?;
        *out_version = -1;
        *out_created = 0;
        *out_matches = 0;
        let uri = cstr_arg(table_uri, "table_uri")?;
        let fields = parse_schema(cstr_arg(schema_json, "schema_json")?)?;
        let partitions = parse_partition_columns(
            opt_cstr_arg(partition_columns_json, "partition_columns_json")?,
            &fields,
        )?;
        let name = opt_cstr_arg(table_name, "table_name")?.filter(|s| !s.is_empty());
        register_delta_handlers();
        let url = table_url(uri, true)?;
        let opts = delta_storage_options(uri);

        if let Some(t) = block_on(load_table(&url, &opts))?.map_err(map_delta_error)? {
            *out_version = table_version(&t)?;
            *out_matches = schema_matches(&t, &fields, &partitions)? as i32;
            return Ok(());
        }

        // A checkpoint every CHECKPOINT_INTERVAL commits: delta-rs replays the log since the last
        // checkpoint after every commit, so a commit's cost grows with that distance (measured
        // at steady state: 70 ms right after a checkpoint, 267 ms 90 commits later at the
        // default of 100; docs/performance.md "Lake").
        let handle = table_builder(&url, &opts)
            .and_then(|b| b.build())
            .map_err(map_delta_error)?;
        let mut builder = CreateBuilder::new()
            .with_log_store(handle.log_store())
            .with_storage_options(opts.clone())
            .with_columns(fields.clone())
            .with_configuration_property(
                deltalake::TableProperty::CheckpointInterval,
                Some(CHECKPOINT_INTERVAL),
            )
            .with_save_mode(SaveMode::ErrorIfExists);
        if !partitions.is_empty() {
            builder = builder.with_partition_columns(partitions.clone());
        }
        if let Some(n) = name {
            builder = builder.with_table_name(n);
        }
        match block_on(builder.into_future())? {
            Ok(t) => {
                *out_version = table_version(&t)?;
                *out_created = 1;
                *out_matches = 1;
                Ok(())
            }
            Err(create_err) => {
                // Lost a race with a concurrent creator? Then report the table it made.
                match block_on(load_table(&url, &opts))? {
                    Ok(Some(t)) => {
                        *out_version = table_version(&t)?;
                        *out_matches = schema_matches(&t, &fields, &partitions)? as i32;
                        Ok(())
                    }
                    _ => Err(map_delta_error(create_err)),
                }
            }
        }
    })
}

/// Latest version of the Delta table at `table_uri`. See oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_delta_table_version(
    table_uri: *const c_char,
    out_version: *mut i64,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out_version = out_arg(out_version, "out_version")?;
        *out_version = -1;
        let uri = cstr_arg(table_uri, "table_uri")?;
        register_delta_handlers();
        let url = table_url(uri, false)?;
        let opts = delta_storage_options(uri);
        match block_on(load_table(&url, &opts))?.map_err(map_delta_error)? {
            Some(t) => {
                *out_version = table_version(&t)?;
                Ok(())
            }
            None => fail(OML_STORAGE_NOT_FOUND, format!("no Delta table at {uri}")),
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Delta table handles: what the lake writer protocol needs and nothing more. Append or MERGE a
// batch with a txn action and commit metadata in ONE conditional commit, read a table's last
// txn version (and the metadata of the commit that set it), checkpoint, vacuum. The protocol
// itself (cut, per-table idempotence check, frontier) lives in C++ (src/lake/).

/// Opaque handle: one table and the snapshot every read and commit through it is based on.
/// Invariant: `table` only ever changes to a state this handle committed or refreshed to; a
/// failed commit leaves it untouched (operations run on a clone).
pub struct OmlStorageDeltaTable {
    uri: String,
    table: Mutex<DeltaTable>,
}

fn delta_ref<'a>(t: *const OmlStorageDeltaTable) -> FfiResult<&'a OmlStorageDeltaTable> {
    if t.is_null() {
        return fail(OML_STORAGE_INVALID_ARGUMENT, "table is NULL");
    }
    // SAFETY: a handle from oml_storage_delta_open that has not been closed.
    Ok(unsafe { &*t })
}

/// Locks the handle. A poisoned lock is recovered: the table is only ever replaced whole, after
/// an operation succeeded, so a panic cannot leave it half updated.
fn lock_table(h: &OmlStorageDeltaTable) -> MutexGuard<'_, DeltaTable> {
    h.table.lock().unwrap_or_else(|p| p.into_inner())
}

/// Commit errors: losing to a concurrent commit (the table moved past our snapshot) is
/// OML_STORAGE_CONFLICT; everything else as map_delta_error.
/// Whether delta-rs refused a commit because a concurrent one removed (with dataChange = true) a
/// file this operation read or removes.
fn removed_what_it_read(e: &DeltaTableError) -> bool {
    matches!(
        e,
        DeltaTableError::Transaction {
            source: TransactionError::CommitConflict(
                CommitConflictError::ConcurrentDeleteRead | CommitConflictError::ConcurrentDeleteDelete
            )
        }
    )
}

fn map_commit_error(e: DeltaTableError) -> Failure {
    let conflict = matches!(
        &e,
        DeltaTableError::VersionAlreadyExists(_)
            | DeltaTableError::Transaction {
                source: TransactionError::MaxCommitAttempts(_)
                    | TransactionError::CommitConflict(_)
                    | TransactionError::VersionAlreadyExists(_)
            }
    );
    if conflict {
        Failure {
            code: OML_STORAGE_CONFLICT,
            message: format!(
                "commit conflict: the table has a commit newer than this handle's snapshot ({e})"
            ),
        }
    } else {
        map_delta_error(e)
    }
}

fn invalid_rows(e: impl std::fmt::Display) -> Failure {
    Failure {
        code: OML_STORAGE_INVALID_ARGUMENT,
        message: format!("rows do not match the table schema: {e}"),
    }
}

/// Decodes JSON lines (one object per row) against the table's Arrow schema. Strict: an unknown
/// field, a wrong type or a null in a non-nullable column is OML_STORAGE_INVALID_ARGUMENT.
/// Encodings: binary (top-level columns) as a standard, padded base64 string (RFC 4648 §4: the
/// form the outbox's row_data already carries, so the writer passes it through untouched);
/// otherwise arrow-json's: timestamp as RFC 3339 text or integer microseconds since the epoch.
fn decode_rows(schema: SchemaRef, data: &[u8]) -> FfiResult<Vec<RecordBatch>> {
    // arrow-json reads binary only from hex; base64 columns are decoded as text and converted.
    let binary: Vec<usize> = schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| f.data_type() == &ArrowDataType::Binary)
        .map(|(i, _)| i)
        .collect();
    let wire: SchemaRef = if binary.is_empty() {
        schema.clone()
    } else {
        let fields: Vec<ArrowField> = schema
            .fields()
            .iter()
            .map(|f| {
                if f.data_type() == &ArrowDataType::Binary {
                    f.as_ref().clone().with_data_type(ArrowDataType::Utf8)
                } else {
                    f.as_ref().clone()
                }
            })
            .collect();
        Arc::new(ArrowSchema::new_with_metadata(fields, schema.metadata().clone()))
    };
    let batches = decode_json_lines(wire, data)?;
    if binary.is_empty() {
        return Ok(batches);
    }
    let mut out = Vec::with_capacity(batches.len());
    for b in batches {
        let mut columns = b.columns().to_vec();
        for &i in &binary {
            let text = columns[i].as_string::<i32>();
            let mut bin = BinaryBuilder::with_capacity(text.len(), text.value_data().len() * 3 / 4);
            for r in 0..text.len() {
                if text.is_null(r) {
                    bin.append_null();
                    continue;
                }
                let raw = BASE64_STANDARD.decode(text.value(r)).map_err(|e| {
                    invalid_rows(format!(
                        "column {:?} is not standard base64: {e}",
                        schema.field(i).name()
                    ))
                })?;
                bin.append_value(raw);
            }
            columns[i] = Arc::new(bin.finish());
        }
        out.push(RecordBatch::try_new(schema.clone(), columns).map_err(invalid_rows)?);
    }
    Ok(out)
}

fn decode_json_lines(schema: SchemaRef, data: &[u8]) -> FfiResult<Vec<RecordBatch>> {
    const BATCH_ROWS: usize = 8192;
    let mut decoder = ReaderBuilder::new(schema)
        .with_strict_mode(true)
        .with_batch_size(BATCH_ROWS)
        .build_decoder()
        .map_err(invalid_rows)?;
    let mut batches = Vec::new();
    let mut buf = data;
    loop {
        let n = decoder.decode(buf).map_err(invalid_rows)?;
        buf = &buf[n..];
        let flushed = decoder.flush().map_err(invalid_rows)?;
        let progressed = n > 0 || flushed.is_some();
        if let Some(b) = flushed {
            if b.num_rows() > 0 {
                batches.push(b);
            }
        }
        if buf.is_empty() {
            break;
        }
        if !progressed {
            return Err(invalid_rows("the JSON decoder made no progress"));
        }
    }
    if batches.is_empty() {
        return fail(OML_STORAGE_INVALID_ARGUMENT, "no rows");
    }
    Ok(batches)
}

/// The caller's commit metadata: NULL/"" or a JSON object whose keys all start with "oml."
/// (so they can never collide with the commitInfo fields Delta itself defines).
fn parse_commit_metadata(
    json: Option<&str>,
) -> FfiResult<serde_json::Map<String, serde_json::Value>> {
    let Some(json) = json.filter(|s| !s.trim().is_empty()) else {
        return Ok(serde_json::Map::new());
    };
    let v: serde_json::Value = serde_json::from_str(json).or_else(|e| {
        fail(
            OML_STORAGE_INVALID_ARGUMENT,
            format!("commit metadata is not JSON: {e}"),
        )
    })?;
    let serde_json::Value::Object(map) = v else {
        return fail(
            OML_STORAGE_INVALID_ARGUMENT,
            "commit metadata must be a JSON object",
        );
    };
    if let Some(k) = map.keys().find(|k| !k.starts_with(OML_METADATA_PREFIX)) {
        return fail(
            OML_STORAGE_INVALID_ARGUMENT,
            format!("commit metadata key {k:?} does not start with {OML_METADATA_PREFIX:?}"),
        );
    }
    Ok(map)
}

const OML_METADATA_PREFIX: &str = "oml.";

/// One commit: the txn action (app_id, txn_version) and the metadata, and no retry: delta-rs
/// would otherwise rebase onto a newer table version after its own conflict check, which would
/// let a second writer commit on top of the first instead of being fenced.
///
/// And no expired-log cleanup: delta-rs 1.1 runs it after *every* commit when the table's
/// delta.enableExpiredLogCleanup is on (the default), not only after a checkpoint, and it lists
/// the whole `_delta_log` (every commit and checkpoint of the last delta.logRetentionDuration,
/// 30 days: at a batch every 150 ms, over half a million files a day; on S3 one LIST request per
/// 1,000 of them), so a batch's cost grew with the log's length. The batch path's appends,
/// MERGEs and commits skip it; each VACUUM round cleans the log instead (upkeep, every
/// `vacuum_every`: delta-rs after VACUUM's commits, or oml_storage_delta_vacuum when VACUUM
/// deleted nothing and so committed nothing), and OPTIMIZE's commit still cleans it too
/// (delta-rs 1.1 takes only the app metadata from OPTIMIZE's commit properties): once per
/// compaction.
fn commit_properties(
    app_id: &str,
    txn_version: i64,
    metadata: serde_json::Map<String, serde_json::Value>,
) -> CommitProperties {
    // lastUpdated stays unset: with it absent no txn retention policy can ever expire the txn.
    CommitProperties::default()
        .with_application_transaction(Transaction::new(app_id, txn_version))
        .with_metadata(metadata)
        .with_max_retries(0)
        .with_cleanup_expired_logs(Some(false))
}

/// Commits `actions` (none: the txn and metadata alone) with `props`, conditional on `t`'s
/// snapshot (max_retries 0: a commit that landed since is a conflict), and moves `t` to the new
/// version.
fn commit_on_snapshot(
    t: &mut DeltaTable,
    actions: Vec<Action>,
    props: CommitProperties,
    operation: DeltaOperation,
) -> FfiResult<()> {
    let snap = t.snapshot().map_err(map_delta_error)?;
    let committed = block_on(
        CommitBuilder::from(props)
            .with_actions(actions)
            .build(Some(snap), t.log_store(), operation)
            .into_future(),
    )?
    .map_err(map_commit_error)?;
    let version = committed.version();
    let mut moved = t.clone();
    block_on(moved.update_incremental(Some(version)))?.map_err(map_delta_error)?;
    *t = moved;
    Ok(())
}

fn txn_args<'a>(app_id: *const c_char, txn_version: i64) -> FfiResult<&'a str> {
    let app_id = cstr_arg(app_id, "app_id")?;
    if app_id.is_empty() {
        return fail(OML_STORAGE_INVALID_ARGUMENT, "app_id is empty");
    }
    if txn_version < 0 {
        return fail(
            OML_STORAGE_INVALID_ARGUMENT,
            format!("txn_version must be >= 0, got {txn_version}"),
        );
    }
    Ok(app_id)
}

fn rows_arg<'a>(rows: *const c_char, len: usize) -> FfiResult<&'a [u8]> {
    if rows.is_null() || len == 0 {
        return fail(OML_STORAGE_INVALID_ARGUMENT, "no rows");
    }
    // SAFETY: the caller passes `len` readable bytes at `rows`.
    Ok(unsafe { std::slice::from_raw_parts(rows as *const u8, len) })
}

fn column_list(json: &str, what: &str, schema: &SchemaRef) -> FfiResult<Vec<String>> {
    let cols: Vec<String> = serde_json::from_str(json).or_else(|e| {
        fail(
            OML_STORAGE_INVALID_ARGUMENT,
            format!("{what} must be a JSON array of column names: {e}"),
        )
    })?;
    let mut seen = std::collections::HashSet::new();
    for c in &cols {
        if schema.index_of(c).is_err() {
            return fail(
                OML_STORAGE_INVALID_ARGUMENT,
                format!("{what}: {c:?} is not a column of the table"),
            );
        }
        if !seen.insert(c) {
            return fail(
                OML_STORAGE_INVALID_ARGUMENT,
                format!("{what}: {c:?} is listed twice"),
            );
        }
    }
    Ok(cols)
}

/// Folds rows with equal keys so that one MERGE gives the same result as applying the rows one
/// at a time in their given order: per key, the key and update columns come from the LAST row
/// (each later matched update overwrites them) and every other column from the FIRST row (the
/// one an insert would have written). Output keeps first-occurrence order. delta-rs itself
/// would fail a MERGE whose source has two rows matching one target row, and would insert both
/// when none matches.
fn fold_duplicate_keys(
    batch: &RecordBatch,
    key_idx: &[usize],
    update_idx: &[usize],
    newer_idx: Option<usize>,
) -> FfiResult<RecordBatch> {
    let internal = |e: deltalake::arrow::error::ArrowError| Failure {
        code: OML_STORAGE_INTERNAL,
        message: format!("folding duplicate keys: {e}"),
    };
    // With a newer column, the row that wins a key is the one with the greatest value (the last
    // of equals), not merely the last.
    let newer: Option<&Int64Array> = match newer_idx {
        None => None,
        Some(i) => Some(batch.column(i).as_any().downcast_ref::<Int64Array>().ok_or_else(|| {
            Failure {
                code: OML_STORAGE_INVALID_ARGUMENT,
                message: "newer column is not a long column".to_string(),
            }
        })?),
    };
    let fields: Vec<SortField> = key_idx
        .iter()
        .map(|&i| SortField::new(batch.schema().field(i).data_type().clone()))
        .collect();
    let converter = RowConverter::new(fields).map_err(internal)?;
    let key_cols: Vec<_> = key_idx.iter().map(|&i| batch.column(i).clone()).collect();
    let rows = converter.convert_columns(&key_cols).map_err(internal)?;
    let mut slot: HashMap<&[u8], usize> = HashMap::with_capacity(batch.num_rows());
    let mut first: Vec<u32> = Vec::new();
    let mut last: Vec<u32> = Vec::new();
    for i in 0..batch.num_rows() {
        let k = rows.row(i).data();
        match slot.get(k) {
            Some(&s) => {
                let wins = match newer {
                    None => true,
                    Some(a) => a.value(i) >= a.value(last[s] as usize),
                };
                if wins {
                    last[s] = i as u32;
                }
            }
            None => {
                slot.insert(k, first.len());
                first.push(i as u32);
                last.push(i as u32);
            }
        }
    }
    if first.len() == batch.num_rows() {
        return Ok(batch.clone());
    }
    let first = UInt32Array::from(first);
    let last = UInt32Array::from(last);
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (i, c) in batch.columns().iter().enumerate() {
        let from_last = key_idx.contains(&i) || update_idx.contains(&i);
        let idx = if from_last { &last } else { &first };
        columns.push(take(c.as_ref(), idx, None).map_err(internal)?);
    }
    RecordBatch::try_new(batch.schema(), columns).map_err(internal)
}

fn qualified(relation: &str, name: &str) -> Expr {
    Expr::Column(Column::new(Some(relation), name))
}

/// Finds the commit (at or below `from_version`) whose txn action set (app_id, txn_version) and
/// returns its version and the "oml."-prefixed keys of its commitInfo. Ok(None) when that
/// commit's log file is gone (expired-log cleanup after a checkpoint) or was not found.
async fn find_txn_commit(
    t: &DeltaTable,
    from_version: i64,
    app_id: &str,
    txn_version: i64,
) -> Result<Option<(i64, serde_json::Map<String, serde_json::Value>)>, DeltaTableError> {
    let log_store = t.log_store();
    let mut v = from_version;
    while v >= 0 {
        let Some(bytes) = log_store.read_commit_entry(v as u64).await? else {
            return Ok(None);
        };
        let mut info = serde_json::Map::new();
        let mut txn: Option<i64> = None;
        for line in bytes.split(|b| *b == b'\n') {
            if line.iter().all(|b| b.is_ascii_whitespace()) {
                continue;
            }
            let Ok(serde_json::Value::Object(mut action)) = serde_json::from_slice(line) else {
                continue;
            };
            if let Some(serde_json::Value::Object(ci)) = action.remove("commitInfo") {
                info = ci
                    .into_iter()
                    .filter(|(k, _)| k.starts_with(OML_METADATA_PREFIX))
                    .collect();
            } else if let Some(serde_json::Value::Object(x)) = action.remove("txn") {
                if x.get("appId").and_then(|a| a.as_str()) == Some(app_id) {
                    txn = x.get("version").and_then(|n| n.as_i64());
                }
            }
        }
        match txn {
            Some(found) if found == txn_version => return Ok(Some((v, info))),
            // An older txn of the same app: the one we look for is not in the remaining log.
            Some(_) => return Ok(None),
            None => v -= 1,
        }
    }
    Ok(None)
}

/// Commit files read at most by one check_commits call (a refresh after a long absence checks
/// the newest ones; a damaged commit deeper in the log is older than any crash of this writer).
const MAX_COMMITS_CHECKED: i64 = 100;

/// Fails with OML_STORAGE_DAMAGED_COMMIT if a commit file of `t` in (from_exclusive, to] is empty
/// or is not JSON lines of Delta actions. deltalake-core reads an empty commit file as a version
/// with no actions, so a commit an OS crash left at 0 bytes (written, renamed, not yet fsynced)
/// would silently become an empty version, and the next commit would land above the hole.
fn check_commits(t: &DeltaTable, uri: &str, from_exclusive: i64, to: i64) -> FfiResult<()> {
    let store = t.log_store().object_store(None);
    let from = std::cmp::max(from_exclusive + 1, std::cmp::max(to - MAX_COMMITS_CHECKED + 1, 0));
    for v in from..=to {
        if let Some(why) = commit_damage(store.as_ref(), v)? {
            return fail(
                OML_STORAGE_DAMAGED_COMMIT,
                format!("lake-commit-damaged: commit {v} of {uri} {why}"),
            );
        }
    }
    Ok(())
}

fn commit_path(v: i64) -> Path {
    Path::from(format!("_delta_log/{v:020}.json"))
}

/// Why commit `v` (in a store rooted at the table) is damaged; None if it is a commit or absent.
fn commit_damage(store: &dyn ObjectStore, v: i64) -> FfiResult<Option<String>> {
    let path = commit_path(v);
    match block_on(async { store.get(&path).await?.bytes().await })? {
        Ok(b) => Ok(damaged_commit(&b)),
        Err(object_store::Error::NotFound { .. }) => Ok(None), // below a checkpoint, cleaned up
        Err(e) => Err(map_os_error(e)),
    }
}

/// The table's log: the newest commit version, and whether a checkpoint exists at each version
/// (listed, not loaded: a table whose newest commit is not JSON does not load).
fn list_log(store: &dyn ObjectStore) -> FfiResult<(i64, std::collections::HashSet<i64>)> {
    let metas: Vec<object_store::ObjectMeta> =
        block_on(store.list(Some(&Path::from("_delta_log"))).try_collect())?
            .map_err(map_os_error)?;
    let mut newest = -1;
    let mut checkpoints = std::collections::HashSet::new();
    for m in metas {
        let name = m.location.filename().unwrap_or("");
        let digits: String = name.chars().take_while(|c| c.is_ascii_digit()).collect();
        let Ok(v) = digits.parse::<i64>() else { continue };
        if digits.len() != 20 {
            continue;
        }
        let rest = &name[20..];
        if rest == ".json" {
            newest = newest.max(v);
        } else if rest.starts_with(".checkpoint") {
            checkpoints.insert(v);
        }
    }
    Ok((newest, checkpoints))
}

/// On a load failure: DAMAGED_COMMIT if one of the newest commits is not JSON (deltalake-core
/// then fails with a parse error that does not name the file); else the load's own error.
fn load_failure(url: &Url, opts: &HashMap<String, String>, uri: &str, e: DeltaTableError) -> Failure {
    let scan = || -> FfiResult<Option<Failure>> {
        let t = table_builder(url, opts).and_then(|b| b.build()).map_err(map_delta_error)?;
        let store = t.log_store().object_store(None);
        let (newest, _) = list_log(store.as_ref())?;
        for v in std::cmp::max(newest - MAX_COMMITS_CHECKED + 1, 0)..=newest {
            if let Some(why) = commit_damage(store.as_ref(), v)? {
                return Ok(Some(Failure {
                    code: OML_STORAGE_DAMAGED_COMMIT,
                    message: format!("lake-commit-damaged: commit {v} of {uri} {why}"),
                }));
            }
        }
        Ok(None)
    };
    match scan() {
        Ok(Some(f)) => f,
        _ => map_delta_error(e),
    }
}

/// Sets aside the damaged commits at the head of the log. See oml_storage.h.
fn set_aside_damaged_head(uri: &str, out_count: &mut i64, out_lowest: &mut i64) -> FfiResult<()> {
    register_delta_handlers();
    let url = table_url(uri, false)?;
    let opts = delta_storage_options(uri);
    let t = table_builder(&url, &opts).and_then(|b| b.build()).map_err(map_delta_error)?;
    let store = t.log_store().object_store(None);
    loop {
        let (newest, checkpoints) = list_log(store.as_ref())?;
        if newest < 1 {
            break; // version 0 creates the table: never set aside
        }
        let Some(why) = commit_damage(store.as_ref(), newest)? else { break };
        if checkpoints.contains(&newest) {
            return fail(
                OML_STORAGE_DAMAGED_COMMIT,
                format!("lake-commit-damaged: commit {newest} of {uri} {why}, and a checkpoint exists at it"),
            );
        }
        let path = commit_path(newest);
        let bytes = block_on(async { store.get(&path).await?.bytes().await })?.map_err(map_os_error)?;
        let millis = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let aside = Path::from(format!("_oml_damaged/{newest:020}.json.{millis}"));
        block_on(store.put(&aside, bytes.into()))?.map_err(map_os_error)?;
        block_on(store.delete(&path))?.map_err(map_os_error)?;
        *out_count += 1;
        *out_lowest = newest;
    }
    // A damaged commit below an intact one cannot be set aside (a commit above it built on it).
    let (newest, _) = list_log(store.as_ref())?;
    for v in std::cmp::max(newest - MAX_COMMITS_CHECKED + 1, 0)..=newest {
        if let Some(why) = commit_damage(store.as_ref(), v)? {
            return fail(
                OML_STORAGE_DAMAGED_COMMIT,
                format!("lake-commit-damaged: commit {v} of {uri} {why}, below commit {newest}: rebuild the table"),
            );
        }
    }
    Ok(())
}

/// Sets aside the damaged commits at the head of a table's log. See oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_delta_set_aside_damaged_head(
    table_uri: *const c_char,
    out_count: *mut i64,
    out_lowest_version: *mut i64,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let count = out_arg(out_count, "out_count")?;
        *count = 0;
        let lowest = out_arg(out_lowest_version, "out_lowest_version")?;
        *lowest = -1;
        let uri = cstr_arg(table_uri, "table_uri")?;
        set_aside_damaged_head(uri, count, lowest)
    })
}

/// Why `bytes` is not a Delta commit (None if it is one): empty, or a line that is not a JSON
/// object with exactly one action.
fn damaged_commit(bytes: &[u8]) -> Option<String> {
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Some(format!("is empty ({} bytes)", bytes.len()));
    }
    for (i, line) in bytes.split(|b| *b == b'\n').enumerate() {
        if line.iter().all(|b| b.is_ascii_whitespace()) {
            continue;
        }
        match serde_json::from_slice::<serde_json::Value>(line) {
            Ok(serde_json::Value::Object(m)) if m.len() == 1 => {}
            Ok(_) => return Some(format!("line {} is not one Delta action", i + 1)),
            Err(e) => return Some(format!("line {} is not JSON: {e}", i + 1)),
        }
    }
    None
}

/// Opens the Delta table at table_uri. See oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_delta_open(
    table_uri: *const c_char,
    out_table: *mut *mut OmlStorageDeltaTable,
    err: *mut OmlStorageError,
) -> i32 {
    delta_open(table_uri, out_table, err, true)
}

/// Opens the Delta table at table_uri without refusing damaged commits. See oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_delta_open_unchecked(
    table_uri: *const c_char,
    out_table: *mut *mut OmlStorageDeltaTable,
    err: *mut OmlStorageError,
) -> i32 {
    delta_open(table_uri, out_table, err, false)
}

fn delta_open(
    table_uri: *const c_char,
    out_table: *mut *mut OmlStorageDeltaTable,
    err: *mut OmlStorageError,
    checked: bool,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_table, "out_table")?;
        *out = ptr::null_mut();
        let uri = cstr_arg(table_uri, "table_uri")?;
        register_delta_handlers();
        let url = table_url(uri, false)?;
        let opts = delta_storage_options(uri);
        let Some(t) = block_on(load_table(&url, &opts))?.map_err(|e| load_failure(&url, &opts, uri, e))? else {
            return fail(OML_STORAGE_NOT_FOUND, format!("no Delta table at {uri}"));
        };
        if checked {
            // The commits delta-rs replayed on top of the newest checkpoint (at most its interval).
            let v = table_version(&t)?;
            let (_, checkpoints) = list_log(t.log_store().object_store(None).as_ref())?;
            let base = checkpoints.into_iter().filter(|c| *c <= v).max().unwrap_or(-1);
            check_commits(&t, uri, base, v)?;
        }
        *out = Box::into_raw(Box::new(OmlStorageDeltaTable {
            uri: uri.to_string(),
            table: Mutex::new(t),
        }));
        Ok(())
    })
}

/// Closes a table handle (NULL is a no-op).
#[no_mangle]
pub extern "C" fn oml_storage_delta_close(table: *mut OmlStorageDeltaTable) {
    no_unwind(|| {
        if !table.is_null() {
            // SAFETY: a handle from oml_storage_delta_open, closed once.
            drop(unsafe { Box::from_raw(table) });
        }
    });
}

#[no_mangle]
pub extern "C" fn oml_storage_delta_snapshot_version(
    table: *const OmlStorageDeltaTable,
    out_version: *mut i64,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_version, "out_version")?;
        *out = -1;
        let h = delta_ref(table)?;
        *out = table_version(&lock_table(h))?;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn oml_storage_delta_refresh(
    table: *mut OmlStorageDeltaTable,
    out_version: *mut i64,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_version, "out_version")?;
        *out = -1;
        let h = delta_ref(table)?;
        let mut t = lock_table(h);
        let before = table_version(&t)?;
        let mut fresh = t.clone();
        if let Err(e) = block_on(fresh.update_state())? {
            let url = table_url(&h.uri, false)?;
            return Err(load_failure(&url, &delta_storage_options(&h.uri), &h.uri, e));
        }
        let after = table_version(&fresh)?;
        check_commits(&fresh, &h.uri, before, after)?;
        *t = fresh;
        *out = after;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn oml_storage_delta_last_txn(
    table: *const OmlStorageDeltaTable,
    app_id: *const c_char,
    out_txn_version: *mut i64,
    out_commit_version: *mut i64,
    out_metadata_json: *mut *mut c_char,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out_txn = out_arg(out_txn_version, "out_txn_version")?;
        let out_commit = out_arg(out_commit_version, "out_commit_version")?;
        let out_meta = out_arg(out_metadata_json, "out_metadata_json")?;
        *out_txn = -1;
        *out_commit = -1;
        *out_meta = ptr::null_mut();
        let app_id = cstr_arg(app_id, "app_id")?;
        if app_id.is_empty() {
            return fail(OML_STORAGE_INVALID_ARGUMENT, "app_id is empty");
        }
        let h = delta_ref(table)?;
        let t = lock_table(h);
        let snapshot_version = table_version(&t)?;
        let log_store = t.log_store();
        let snap = t.snapshot().map_err(map_delta_error)?;
        let txn = block_on(snap.transaction_version(log_store.as_ref(), app_id))?
            .map_err(map_delta_error)?;
        let Some(txn) = txn else {
            return Ok(());
        };
        *out_txn = txn;
        if let Some((v, meta)) = block_on(find_txn_commit(&t, snapshot_version, app_id, txn))?
            .map_err(map_delta_error)?
        {
            let json = serde_json::to_string(&meta)
                .or_else(|e| fail(OML_STORAGE_INTERNAL, format!("cannot encode metadata: {e}")))?;
            *out_commit = v;
            *out_meta = to_c_string(&json);
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn oml_storage_delta_append(
    table: *mut OmlStorageDeltaTable,
    rows_jsonl: *const c_char,
    rows_len: usize,
    app_id: *const c_char,
    txn_version: i64,
    metadata_json: *const c_char,
    out_version: *mut i64,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_version, "out_version")?;
        *out = -1;
        let h = delta_ref(table)?;
        let rows = rows_arg(rows_jsonl, rows_len)?;
        let app_id = txn_args(app_id, txn_version)?;
        let metadata = parse_commit_metadata(opt_cstr_arg(metadata_json, "metadata_json")?)?;
        let mut t = lock_table(h);
        let batches = decode_rows(snapshot_arrow_schema(&t)?, rows)?;
        *out = append_commit(&mut t, batches, app_id, txn_version, metadata)?;
        Ok(())
    })
}

/// The snapshot's schema as Arrow.
fn snapshot_arrow_schema(t: &DeltaTable) -> FfiResult<SchemaRef> {
    Ok(t.snapshot().map_err(map_delta_error)?.snapshot().arrow_schema())
}

/// One append commit of `batches` with the txn action and metadata, conditional on the handle's
/// snapshot; the handle moves to the version written, which is returned.
fn append_commit(
    t: &mut DeltaTable,
    batches: Vec<RecordBatch>,
    app_id: &str,
    txn_version: i64,
    metadata: serde_json::Map<String, serde_json::Value>,
) -> FfiResult<i64> {
    let written = block_on(
        t.clone()
            .write(batches)
            .with_save_mode(SaveMode::Append)
            .with_commit_properties(commit_properties(app_id, txn_version, metadata))
            .into_future(),
    )?
    .map_err(map_commit_error)?;
    *t = written;
    table_version(t)
}

/// Moves the caller's C data interface structs into Rust (their release is NULL afterwards, as
/// the interface's move semantics say), whatever the call does next.
///
/// # Safety
/// Each pointer is NULL or points to a struct of the interface (released or not).
unsafe fn take_arrow(
    array: *mut FFI_ArrowArray,
    schema: *mut FFI_ArrowSchema,
) -> FfiResult<(FFI_ArrowArray, FFI_ArrowSchema)> {
    let a = (!array.is_null()).then(|| unsafe { FFI_ArrowArray::from_raw(array) });
    let s = (!schema.is_null()).then(|| unsafe { FFI_ArrowSchema::from_raw(schema) });
    match (a, s) {
        (Some(a), Some(s)) => Ok((a, s)),
        _ => fail(OML_STORAGE_INVALID_ARGUMENT, "array and schema are required"),
    }
}

/// One imported struct array as a record batch of `table_schema`: the same column names and
/// types in the same order, no null in a non-nullable column, offsets and UTF-8 valid
/// (validate_full: the producer is trusted with nothing).
fn import_batch(
    table_schema: SchemaRef,
    array: FFI_ArrowArray,
    schema: &FFI_ArrowSchema,
) -> FfiResult<RecordBatch> {
    let data = unsafe { from_ffi(array, schema) }.map_err(invalid_rows)?;
    data.validate_full().map_err(invalid_rows)?;
    let ArrowDataType::Struct(fields) = data.data_type() else {
        return Err(invalid_rows("the array is not a struct of columns"));
    };
    if data.offset() != 0 || data.null_count() != 0 {
        return Err(invalid_rows("the struct array has an offset or null rows"));
    }
    if data.len() == 0 {
        return fail(OML_STORAGE_INVALID_ARGUMENT, "no rows");
    }
    if fields.len() != table_schema.fields().len() {
        return Err(invalid_rows(format!(
            "{} columns where the table has {}",
            fields.len(),
            table_schema.fields().len()
        )));
    }
    for (i, (f, t)) in fields.iter().zip(table_schema.fields().iter()).enumerate() {
        if f.name() != t.name() || f.data_type() != t.data_type() {
            return Err(invalid_rows(format!(
                "column {i} is {:?} {} where the table has {:?} {}",
                f.name(),
                f.data_type(),
                t.name(),
                t.data_type()
            )));
        }
    }
    let (_, columns, _) = StructArray::from(data).into_parts();
    RecordBatch::try_new(table_schema, columns).map_err(invalid_rows)
}

/// Appends one Arrow record batch (C data interface) in one commit. See oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_delta_append_arrow(
    table: *mut OmlStorageDeltaTable,
    array: *mut FFI_ArrowArray,
    schema: *mut FFI_ArrowSchema,
    app_id: *const c_char,
    txn_version: i64,
    metadata_json: *const c_char,
    out_version: *mut i64,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        // First, so that the caller's structs are moved on every path.
        let imported = unsafe { take_arrow(array, schema) };
        let out = out_arg(out_version, "out_version")?;
        *out = -1;
        let h = delta_ref(table)?;
        let (array, schema) = imported?;
        let app_id = txn_args(app_id, txn_version)?;
        let metadata = parse_commit_metadata(opt_cstr_arg(metadata_json, "metadata_json")?)?;
        let mut t = lock_table(h);
        let batch = import_batch(snapshot_arrow_schema(&t)?, array, &schema)?;
        *out = append_commit(&mut t, vec![batch], app_id, txn_version, metadata)?;
        Ok(())
    })
}

/// Checks rows against the handle's snapshot schema without writing anything. See oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_delta_check_rows(
    table: *const OmlStorageDeltaTable,
    rows_jsonl: *const c_char,
    rows_len: usize,
    out_bad_line: *mut i64,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_bad_line, "out_bad_line")?;
        *out = -1;
        let h = delta_ref(table)?;
        let rows = rows_arg(rows_jsonl, rows_len)?;
        let schema = lock_table(h)
            .snapshot()
            .map_err(map_delta_error)?
            .snapshot()
            .arrow_schema();
        if decode_rows(schema.clone(), rows).is_ok() {
            return Ok(());
        }
        // Slow path, only on failure: find the first line that does not decode alone.
        for (i, line) in rows.split(|&b| b == b'\n').enumerate() {
            if line.iter().all(|b| b.is_ascii_whitespace()) {
                continue;
            }
            if let Err(e) = decode_rows(schema.clone(), line) {
                *out = i as i64;
                return Err(e);
            }
        }
        fail(OML_STORAGE_INVALID_ARGUMENT, "rows do not decode together but each line does")
    })
}

/// Empties the table in one commit (every file of the snapshot removed) that records the txn
/// (app_id, txn_version) and the metadata. See oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_delta_truncate(
    table: *mut OmlStorageDeltaTable,
    app_id: *const c_char,
    txn_version: i64,
    metadata_json: *const c_char,
    out_version: *mut i64,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_version, "out_version")?;
        *out = -1;
        let h = delta_ref(table)?;
        let app_id = txn_args(app_id, txn_version)?;
        let metadata = parse_commit_metadata(opt_cstr_arg(metadata_json, "metadata_json")?)?;
        let mut t = lock_table(h);
        // One commit of the snapshot's files as removes (dataChange true: rows go away), the txn
        // and the metadata. Not DeltaOps' DELETE: that commits nothing on a snapshot without
        // files (the txn would not move back). max_retries 0 (commit_properties): a commit that
        // landed since the snapshot makes it a conflict, never a rebase that would keep files it
        // did not see under the reset txn.
        let snap = t.snapshot().map_err(map_delta_error)?;
        let removes: Vec<Action> = snap
            .log_data()
            .into_iter()
            .map(|f| Action::Remove(f.remove_action(true)))
            .collect();
        commit_on_snapshot(
            &mut t,
            removes,
            commit_properties(app_id, txn_version, metadata),
            DeltaOperation::Delete { predicate: None },
        )?;
        *out = table_version(&t)?;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn oml_storage_delta_merge(
    table: *mut OmlStorageDeltaTable,
    rows_jsonl: *const c_char,
    rows_len: usize,
    key_columns_json: *const c_char,
    update_columns_json: *const c_char,
    add_columns_json: *const c_char,
    newer_column: *const c_char,
    app_id: *const c_char,
    txn_version: i64,
    metadata_json: *const c_char,
    out_version: *mut i64,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_version, "out_version")?;
        *out = -1;
        let h = delta_ref(table)?;
        let rows = rows_arg(rows_jsonl, rows_len)?;
        let app_id = txn_args(app_id, txn_version)?;
        let metadata = parse_commit_metadata(opt_cstr_arg(metadata_json, "metadata_json")?)?;
        let key_json = cstr_arg(key_columns_json, "key_columns_json")?;
        let update_json = opt_cstr_arg(update_columns_json, "update_columns_json")?;
        let add_json = opt_cstr_arg(add_columns_json, "add_columns_json")?;
        let newer_name = opt_cstr_arg(newer_column, "newer_column")?.filter(|n| !n.is_empty());
        let mut t = lock_table(h);
        let schema = t
            .snapshot()
            .map_err(map_delta_error)?
            .snapshot()
            .arrow_schema();

        let keys = column_list(key_json, "key columns", &schema)?;
        if keys.is_empty() {
            return fail(OML_STORAGE_INVALID_ARGUMENT, "key columns are empty");
        }
        let adds: Vec<String> = match add_json {
            None | Some("") => Vec::new(),
            Some(j) => column_list(j, "add columns", &schema)?,
        };
        let updates: Vec<String> = match update_json {
            None => schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .filter(|n| !keys.contains(n) && !adds.contains(n))
                .collect(),
            Some(j) => column_list(j, "update columns", &schema)?,
        };
        if let Some(k) = updates.iter().chain(adds.iter()).find(|c| keys.contains(c)) {
            return fail(
                OML_STORAGE_INVALID_ARGUMENT,
                format!("update/add columns: {k:?} is a key column"),
            );
        }
        if let Some(k) = adds.iter().find(|c| updates.contains(c)) {
            return fail(
                OML_STORAGE_INVALID_ARGUMENT,
                format!("add columns: {k:?} is also an update column"),
            );
        }
        for a in &adds {
            let f = schema.field_with_name(a).map_err(invalid_rows)?;
            if !matches!(
                f.data_type(),
                deltalake::arrow::datatypes::DataType::Int64
                    | deltalake::arrow::datatypes::DataType::Int32
            ) || f.is_nullable()
            {
                return fail(
                    OML_STORAGE_INVALID_ARGUMENT,
                    format!("add columns: {a:?} is not a non-nullable long or integer column"),
                );
            }
        }
        let newer_idx = match newer_name {
            None => None,
            Some(n) => {
                let f = schema.field_with_name(n).map_err(invalid_rows)?;
                if keys.iter().chain(adds.iter()).any(|c| c == n)
                    || f.data_type() != &deltalake::arrow::datatypes::DataType::Int64
                    || f.is_nullable()
                {
                    return fail(
                        OML_STORAGE_INVALID_ARGUMENT,
                        format!("newer column: {n:?} is not a non-nullable long column outside the keys and add columns"),
                    );
                }
                Some(schema.index_of(n).map_err(invalid_rows)?)
            }
        };
        let key_idx: Vec<usize> = keys
            .iter()
            .map(|k| schema.index_of(k).unwrap_or(0))
            .collect();
        let update_idx: Vec<usize> = updates
            .iter()
            .map(|k| schema.index_of(k).unwrap_or(0))
            .collect();

        let batches = decode_rows(schema.clone(), rows)?;
        let batch = concat_batches(&schema, &batches).map_err(invalid_rows)?;
        for (k, &i) in keys.iter().zip(&key_idx) {
            if batch.column(i).null_count() > 0 {
                return fail(
                    OML_STORAGE_INVALID_ARGUMENT,
                    format!("key column {k:?} is null in some row"),
                );
            }
        }
        let folded = fold_duplicate_keys(&batch, &key_idx, &update_idx, newer_idx)?;
        if !adds.is_empty() && folded.num_rows() != batch.num_rows() {
            // Summing duplicates is the caller's aggregation; folding would drop increments.
            return fail(
                OML_STORAGE_INVALID_ARGUMENT,
                "rows with equal keys in a MERGE with add columns (aggregate them first)",
            );
        }
        let batch = folded;

        let source = SessionContext::new()
            .read_batch(batch)
            .map_err(|e| Failure {
                code: OML_STORAGE_INTERNAL,
                message: format!("merge source: {e}"),
            })?;
        let predicate = keys
            .iter()
            .map(|k| qualified("target", k).eq(qualified("source", k)))
            .reduce(Expr::and)
            .unwrap_or_else(|| qualified("target", &keys[0]));
        let all: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let mut builder = t
            .clone()
            .merge(source, predicate)
            .with_source_alias("source")
            .with_target_alias("target")
            .with_commit_properties(commit_properties(app_id, txn_version, metadata.clone()));
        let merge_metadata = metadata;
        if !updates.is_empty() || !adds.is_empty() {
            let newer_pred = newer_name.map(|n| qualified("source", n).gt(qualified("target", n)));
            builder = builder
                .when_matched_update(|u| {
                    let u = match newer_pred {
                        Some(p) => u.predicate(p),
                        None => u,
                    };
                    let u = updates.iter().fold(u, |u, c| {
                        u.update(Column::new_unqualified(c.as_str()), qualified("source", c))
                    });
                    adds.iter().fold(u, |u, c| {
                        u.update(
                            Column::new_unqualified(c.as_str()),
                            qualified("target", c) + qualified("source", c),
                        )
                    })
                })
                .map_err(map_delta_error)?;
        }
        builder = builder
            .when_not_matched_insert(|i| {
                all.iter().fold(i, |i, c| {
                    i.set(Column::new_unqualified(c.as_str()), qualified("source", c))
                })
            })
            .map_err(map_delta_error)?;
        let before = table_version(&t)?;
        let (merged, _metrics) = block_on(builder.into_future())?.map_err(map_commit_error)?;
        *t = merged;
        if table_version(&t)? == before {
            // delta-rs commits nothing for a MERGE that changes no row (no source row newer
            // than its target, say), so the txn would not move: commit it alone, conditional on
            // the same snapshot (a commit that landed since makes it a conflict). Otherwise the
            // table's txn would stay below the batch its caller recorded it holds.
            commit_on_snapshot(
                &mut t,
                Vec::new(),
                commit_properties(app_id, txn_version, merge_metadata),
                DeltaOperation::Merge {
                    predicate: None,
                    merge_predicate: None,
                    matched_predicates: Vec::new(),
                    not_matched_predicates: Vec::new(),
                    not_matched_by_source_predicates: Vec::new(),
                },
            )?;
        }
        *out = table_version(&t)?;
        Ok(())
    })
}

/// The type names parse_type accepts, back from a Delta type (other types by their Delta name).
fn type_name(t: &DataType) -> String {
    match t {
        t if *t == DataType::STRING => "string".to_string(),
        t if *t == DataType::LONG => "long".to_string(),
        t if *t == DataType::INTEGER => "integer".to_string(),
        t if *t == DataType::BINARY => "binary".to_string(),
        t if *t == DataType::TIMESTAMP => "timestamp".to_string(),
        t if *t == DataType::BOOLEAN => "boolean".to_string(),
        t if *t == DataType::DATE => "date".to_string(),
        other => format!("{other}"),
    }
}

/// The handle's snapshot schema and partition columns. See oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_delta_schema(
    table: *const OmlStorageDeltaTable,
    out_json: *mut *mut c_char,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_json, "out_json")?;
        *out = ptr::null_mut();
        let h = delta_ref(table)?;
        let t = lock_table(h);
        let snap = t.snapshot().map_err(map_delta_error)?;
        let columns: Vec<serde_json::Value> = snap
            .schema()
            .fields()
            .map(|f| {
                serde_json::json!({
                    "name": f.name(),
                    "type": type_name(f.data_type()),
                    "nullable": f.is_nullable(),
                })
            })
            .collect();
        let doc = serde_json::json!({
            "columns": columns,
            "partition_columns": snap.metadata().partition_columns(),
        });
        *out = to_c_string(&doc.to_string());
        Ok(())
    })
}

/// Every row of the handle's snapshot as JSON lines. See oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_delta_read_rows(
    table: *const OmlStorageDeltaTable,
    out_jsonl: *mut *mut c_char,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_jsonl, "out_jsonl")?;
        *out = ptr::null_mut();
        let h = delta_ref(table)?;
        let t = lock_table(h).clone();
        let batches: Vec<RecordBatch> = block_on(async move {
            let (_, stream) = t.scan_table().await?;
            stream
                .try_collect::<Vec<_>>()
                .await
                .map_err(DeltaTableError::from)
        })?
        .map_err(map_delta_error)?;
        let mut writer = deltalake::arrow::json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, deltalake::arrow::json::writer::LineDelimited>(Vec::new());
        let refs: Vec<&RecordBatch> = batches.iter().collect();
        let encode = |e: deltalake::arrow::error::ArrowError| Failure {
            code: OML_STORAGE_INTERNAL,
            message: format!("cannot encode rows as JSON: {e}"),
        };
        writer.write_batches(&refs).map_err(encode)?;
        writer.finish().map_err(encode)?;
        let text = String::from_utf8(writer.into_inner())
            .or_else(|e| fail(OML_STORAGE_INTERNAL, format!("rows are not UTF-8: {e}")))?;
        *out = to_c_string(&text);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn oml_storage_delta_checkpoint(
    table: *const OmlStorageDeltaTable,
    out_version: *mut i64,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_version, "out_version")?;
        *out = -1;
        let h = delta_ref(table)?;
        let t = lock_table(h);
        block_on(deltalake::checkpoints::create_checkpoint(&t, None))?.map_err(map_delta_error)?;
        *out = table_version(&t)?;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn oml_storage_delta_vacuum(
    table: *mut OmlStorageDeltaTable,
    retention_hours: i64,
    out_files_deleted: *mut i64,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_files_deleted, "out_files_deleted")?;
        *out = 0;
        let h = delta_ref(table)?;
        if retention_hours < 0 {
            return fail(
                OML_STORAGE_INVALID_ARGUMENT,
                format!("retention_hours must be >= 0, got {retention_hours}"),
            );
        }
        let retention = chrono::Duration::try_hours(retention_hours).ok_or_else(|| Failure {
            code: OML_STORAGE_INVALID_ARGUMENT,
            message: format!("retention_hours out of range: {retention_hours}"),
        })?;
        let mut t = lock_table(h);
        // Full mode treats every file the snapshot does not reference as an orphan, so plan from
        // the latest version: a stale snapshot would see newer commits' files as orphans.
        let mut fresh = t.clone();
        block_on(fresh.update_state())?.map_err(map_delta_error)?;
        *t = fresh;
        let (vacuumed, metrics) = block_on(
            t.clone()
                .vacuum()
                .with_retention_period(retention)
                .with_enforce_retention_duration(false)
                .with_mode(VacuumMode::Full)
                .into_future(),
        )?
        .map_err(|e| {
            let mut f = map_commit_error(e);
            f.message = format!("vacuum {}: {}", h.uri, f.message);
            f
        })?;
        *t = vacuumed;
        *out = metrics.files_deleted.len() as i64;
        // Expired log files (see commit_properties). A VACUUM that deleted files committed, and
        // delta-rs cleaned the log after those commits. One that deleted none committed nothing
        // (an append-only table, bronze with compaction off, never gives it a file), so the log
        // is cleaned here, as delta.enableExpiredLogCleanup says. A file another cleanup (the
        // compactor's OPTIMIZE, on its own thread) removed first is what this one wanted gone:
        // on a local store its NotFound is not a failure; the next round finishes the rest.
        use deltalake::table::config::TablePropertiesExt as _;
        if metrics.files_deleted.is_empty()
            && t.snapshot().map_err(map_delta_error)?.table_config().enable_expired_log_cleanup()
        {
            match block_on(deltalake::checkpoints::cleanup_metadata(&t, None))? {
                Ok(_)
                | Err(DeltaTableError::ObjectStore {
                    source: object_store::Error::NotFound { .. },
                }) => {}
                Err(e) => {
                    let mut f = map_delta_error(e);
                    f.message = format!("expired log cleanup: {}", f.message); // the caller names the table
                    return Err(f);
                }
            }
        }
        Ok(())
    })
}

/// The Parquet settings of the files a compaction writes: zstd at level 1. delta-rs's OPTIMIZE
/// defaults to level 4: a small-tier run of bronze under steady load took 2.6 s at level 4 and
/// 0.5-0.6 s at level 1 (docs/performance.md "Compaction at zstd level 1"). Every Parquet
/// reader decodes any zstd level. created_by follows the "<app> version <v> (build <b>)" form
/// that parquet-java parses: it ignores the string columns' statistics of a file whose
/// created_by it cannot parse.
fn compaction_writer_properties() -> deltalake::parquet::file::properties::WriterProperties {
    use deltalake::parquet::basic::{Compression, ZstdLevel};
    let level = ZstdLevel::try_new(1).expect("zstd level 1 is valid");
    deltalake::parquet::file::properties::WriterProperties::builder()
        .set_created_by(format!("oml-storage version {} (build compaction)", env!("CARGO_PKG_VERSION")))
        .set_compression(Compression::ZSTD(level))
        .build()
}

/// delta.checkpointInterval of the tables this adapter creates (Delta's default is 100).
const CHECKPOINT_INTERVAL: &str = "10";

/// OPTIMIZE (bin-packing compaction) of the handle's table. See oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_delta_optimize(
    table: *mut OmlStorageDeltaTable,
    target_size_bytes: u64,
    out_files_removed: *mut i64,
    out_files_added: *mut i64,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let removed = out_arg(out_files_removed, "out_files_removed")?;
        *removed = 0;
        let added = out_arg(out_files_added, "out_files_added")?;
        *added = 0;
        let h = delta_ref(table)?;
        let target = std::num::NonZeroU64::new(target_size_bytes).ok_or_else(|| Failure {
            code: OML_STORAGE_INVALID_ARGUMENT,
            message: "target_size_bytes must be > 0".to_string(),
        })?;
        let mut t = lock_table(h);
        // Unlike the adapter's other commits, OPTIMIZE rebases: it carries no txn action and
        // writes its files with dataChange = false, so committing it after appends that landed
        // since its snapshot loses nothing and doubles nothing. delta-rs's conflict checker
        // refuses the rebase (OML_STORAGE_CONFLICT) over a commit that changed the metadata or
        // protocol or removed one of its files with dataChange = true (a MERGE), but not over one
        // that removed them with dataChange = false (another OPTIMIZE or Z-order, delta-rs PR
        // 3982): both rewrites would then hold the same rows. RewriteGuard refuses that one
        // (OML_STORAGE_STALE_REWRITE).
        let read_version = table_version(&t)?;
        let guard = Arc::new(RewriteGuard::new(t.log_store(), read_version));
        let mut guarded = DeltaTable::new(guard.clone());
        guarded.state = t.state.clone();
        // delta-rs 1.1's OPTIMIZE ignores the commit properties' retry count (it retries a lost
        // put up to 15 times, rebasing over everything that landed each time): the guard sees
        // every one of those attempts.
        let outcome = compaction_runtime()?.block_on(
            guarded
                .optimize()
                .with_target_size(target)
                .with_max_concurrent_tasks(1)
                .with_writer_properties(compaction_writer_properties())
                .into_future(),
        );
        let (optimized, metrics) = match outcome {
            Ok(done) => done,
            Err(e) => {
                if let Some(why) = guard.refusal() {
                    return fail(
                        OML_STORAGE_STALE_REWRITE,
                        format!("refused, nothing committed: {why}"),
                    );
                }
                // Another rewrite that marked its removes as a data change (ours do,
                // mark_data_change): delta-rs's own checker refuses first, before the guard.
                if removed_what_it_read(&e) {
                    if let Some(why) = compaction_runtime()?.block_on(guard.rewrite_since()) {
                        return fail(
                            OML_STORAGE_STALE_REWRITE,
                            format!("refused, nothing committed: {why}"),
                        );
                    }
                }
                return Err(map_commit_error(e));
            }
        };
        // The handle keeps its own log store; only the state moves to the version written.
        t.state = optimized.state;
        *removed = metrics.num_files_removed as i64;
        *added = metrics.num_files_added as i64;
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Memory.

/// Frees a string returned by this library (error messages, list JSON). NULL is a no-op.
#[no_mangle]
pub extern "C" fn oml_storage_free_string(s: *mut c_char) {
    no_unwind(|| {
        if !s.is_null() {
            // SAFETY: produced by CString::into_raw in this library, freed once.
            drop(unsafe { CString::from_raw(s) });
        }
    });
}

/// Frees a buffer filled by oml_storage_store_get or _get_range and resets it to {NULL, 0}.
#[no_mangle]
pub extern "C" fn oml_storage_free_buffer(buf: *mut OmlStorageBuffer) {
    no_unwind(|| {
        if buf.is_null() {
            return;
        }
        // SAFETY: the caller passes a buffer filled by this library.
        unsafe {
            let b = &mut *buf;
            if !b.data.is_null() {
                drop(Box::from_raw(ptr::slice_from_raw_parts_mut(b.data, b.len)));
            }
            b.data = ptr::null_mut();
            b.len = 0;
        }
    });
}

/// Version string of this adapter and the pinned delta-rs core, for diagnostics.
#[no_mangle]
pub extern "C" fn oml_storage_version() -> *const c_char {
    static V: OnceLock<CString> = OnceLock::new();
    catch_unwind(|| {
        V.get_or_init(|| {
            CString::new(format!(
                "oml-storage {} (deltalake-core {})",
                env!("CARGO_PKG_VERSION"),
                deltalake::crate_version()
            ))
            .unwrap_or_default()
        })
        .as_ptr()
    })
    .unwrap_or(c"oml-storage (version unavailable)".as_ptr())
}
