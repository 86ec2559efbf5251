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
use std::sync::{Arc, Once, OnceLock};

use deltalake::kernel::{DataType, StructField};
use deltalake::operations::create::CreateBuilder;
use deltalake::protocol::SaveMode;
use deltalake::{DeltaTable, DeltaTableBuilder, DeltaTableError};
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use url::Url;

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

fn runtime() -> FfiResult<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    let rt = RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("oml-storage")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the tokio runtime: {e}"))
    });
    match rt {
        Ok(rt) => Ok(rt),
        Err(m) => fail(OML_STORAGE_INTERNAL, m.clone()),
    }
}

fn block_on<F: std::future::Future>(fut: F) -> FfiResult<F::Output> {
    Ok(runtime()?.block_on(fut))
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
    let code = match &e {
        DeltaTableError::ObjectStore { source } => os_error_code(source),
        DeltaTableError::NotATable(_) => OML_STORAGE_NOT_FOUND,
        DeltaTableError::InvalidTableLocation(_) => OML_STORAGE_INVALID_ARGUMENT,
        DeltaTableError::VersionAlreadyExists(_) => OML_STORAGE_ALREADY_EXISTS,
        DeltaTableError::Io { .. } => OML_STORAGE_UNAVAILABLE,
        _ => OML_STORAGE_INTERNAL,
    };
    Failure {
        code,
        message: e.to_string(),
    }
}

fn os_error_code(e: &object_store::Error) -> i32 {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => OML_STORAGE_NOT_FOUND,
        E::InvalidPath { .. } | E::UnknownConfigurationKey { .. } => OML_STORAGE_INVALID_ARGUMENT,
        E::AlreadyExists { .. } | E::Precondition { .. } => OML_STORAGE_ALREADY_EXISTS,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => OML_STORAGE_PERMISSION_DENIED,
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
    Ok(OmlStorageStore {
        store: Arc::new(fs),
        prefix: Path::ROOT,
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
            // AWS_ALLOW_HTTP, ... Plain PUTs overwrite; no conditional put is needed here.
            let s3 = AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
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
            Ok(OmlStorageStore {
                store: Arc::new(s3),
                prefix,
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
        if data.is_null() && len != 0 {
            return fail(OML_STORAGE_INVALID_ARGUMENT, "data is NULL but len > 0");
        }
        let bytes = if len == 0 {
            bytes::Bytes::new()
        } else {
            // SAFETY: the caller passes `len` readable bytes at `data`.
            bytes::Bytes::copy_from_slice(unsafe { std::slice::from_raw_parts(data, len) })
        };
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
        // String-prefix semantics (like S3 ListObjectsV2): list recursively below the last '/'
        // of the prefix, then keep keys that start with the whole prefix.
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
        let mut keys: Vec<String> = metas
            .into_iter()
            .filter_map(|m| {
                let parts: Vec<String> = m
                    .location
                    .prefix_match(&store.prefix)?
                    .map(|p| p.as_ref().to_string())
                    .collect();
                Some(parts.join("/"))
            })
            .filter(|k| !k.is_empty() && k.starts_with(prefix))
            .collect();
        keys.sort();
        keys.dedup();
        let json = serde_json::to_string(&keys)
            .or_else(|e| fail(OML_STORAGE_INTERNAL, format!("cannot encode key list: {e}")))?;
        *out = to_c_string(&json);
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
        other => {
            return fail(
                OML_STORAGE_INVALID_ARGUMENT,
                format!(
                    "unsupported column type {other:?} \
                     (want string, long, integer, binary, timestamp, boolean)"
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

/// Loads the table at `url`, or Ok(None) if there is no Delta table there.
async fn load_table(
    url: &Url,
    opts: &HashMap<String, String>,
) -> Result<Option<DeltaTable>, DeltaTableError> {
    let mut table = DeltaTableBuilder::from_url(url.clone())?
        .with_storage_options(opts.clone())
        .build()?;
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

        let mut builder = CreateBuilder::new()
            .with_location(url.to_string())
            .with_storage_options(opts.clone())
            .with_columns(fields.clone())
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

/// Frees a buffer filled by oml_storage_store_get and resets it to {NULL, 0}.
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
