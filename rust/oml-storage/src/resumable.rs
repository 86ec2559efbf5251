//! Resumable writes of one object whose progress the caller keeps (issue 22, "Uploads"): an
//! upload session puts each chunk's ciphertext straight into its object as it arrives, and may be
//! killed and resumed (by another process) between any two calls.
//!
//! * S3: one multipart upload at the staging key (`start` answers its UploadId); `put` uploads
//!   part `part_no` and answers its ETag, which the caller records with the session; `finish`
//!   completes the upload from the recorded ETags, then server-side copies the staging object to
//!   the final key (CopyObject) and deletes the staging object. Parts but the last must hold at
//!   least `OML_STORAGE_RESUMABLE_S3_MIN_PART` bytes (the caller carries smaller pieces).
//! * Local directory: one append-only staging file at the staging key (`start` creates it empty;
//!   its handle is "local"); `put` truncates it to `offset` (a part written by a request whose
//!   commit never came is cut off) and writes the part there, fsynced; a file shorter than
//!   `offset` is refused (NOT_FOUND), never padded. `finish` fsyncs it and renames it into the
//!   final key (DurableLocal's rename: the directories are fsynced too). No minimum part size.
//!
//! A local staging file's writes bypass the page cache where the file system allows it
//! (`O_DIRECT`, [`write_staging`]): each ciphertext byte is written once by the device's DMA
//! instead of being copied into the page cache and written back, which on the hosts measured was
//! the upload's largest CPU cost (docs/performance.md, "Uploads").
//!
//! `finish` is idempotent after a crash: when the final key already holds `size` bytes, or the
//! multipart upload was completed before (the staging object holds `size` bytes), it carries on
//! from there. `abort` forgets an upload; a missing one is not an error.

use std::ffi::{c_char, CStr};
use std::os::unix::fs::{FileExt, OpenOptionsExt};

use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

use crate::staging::Leftovers;
use crate::{
    block_on, bytes_arg, cstr_arg, durable_local, fail, ffi_call, key_path, map_os_error, out_arg, store_ref,
    to_c_string, FfiResult, OmlStorageError, OmlStorageStore, OML_STORAGE_INVALID_ARGUMENT, OML_STORAGE_NOT_FOUND,
    OML_STORAGE_UNAVAILABLE,
};

/// The largest object one CopyObject copies (5 GiB); a larger one is copied in ranges.
const S3_COPY_MAX: u64 = 5 << 30;
/// The range of a streamed copy (and its parts).
const COPY_RANGE: u64 = 64 << 20;

/// Copies `from` to `to` in ranges through this process: a multipart upload of COPY_RANGE parts
/// (memory: one range), for objects CopyObject cannot copy.
async fn copy_streaming(store: &OmlStorageStore, from: &Path, to: &Path, size: u64) -> FfiResult<()> {
    let mut upload = store.store.put_multipart(to).await.map_err(map_os_error)?;
    let mut off = 0u64;
    while off < size {
        let end = (off + COPY_RANGE).min(size);
        let bytes = match store.store.get_range(from, off..end).await {
            Ok(b) => b,
            Err(e) => {
                let _ = upload.abort().await;
                return Err(map_os_error(e));
            }
        };
        if let Err(e) = upload.put_part(PutPayload::from_bytes(bytes)).await {
            let _ = upload.abort().await;
            return Err(map_os_error(e));
        }
        off = end;
    }
    upload.complete().await.map_err(map_os_error)?;
    Ok(())
}

/// S3's smallest part but the last (5 MiB).
pub const OML_STORAGE_RESUMABLE_S3_MIN_PART: u64 = 5 << 20;
const LOCAL_HANDLE: &str = "local";

pub(crate) fn local_file(root: &std::path::Path, path: &Path) -> std::path::PathBuf {
    root.join(path.as_ref())
}

/// Direct I/O's alignment of file offsets, lengths and memory: 4 KiB, which covers every logical
/// block size Linux's block devices use (512 B or 4 KiB).
const DIO_ALIGN: usize = 4096;
/// The aligned bounce buffer one thread keeps for direct writes (a direct write goes out in
/// pieces of at most this size).
const DIO_BUFFER: usize = 256 << 10;
/// Below this many aligned bytes a write stays buffered (the open and the head's read would cost
/// more than the copy saves).
const DIO_MIN: u64 = 64 << 10;

/// A DIO_ALIGN-aligned buffer of DIO_BUFFER bytes.
struct AlignedBuffer(std::ptr::NonNull<u8>);

impl AlignedBuffer {
    fn layout() -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(DIO_BUFFER, DIO_ALIGN).expect("constant layout")
    }
    fn new() -> Option<Self> {
        // SAFETY: the layout's size is not zero.
        std::ptr::NonNull::new(unsafe { std::alloc::alloc_zeroed(Self::layout()) }).map(AlignedBuffer)
    }
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: DIO_BUFFER bytes were allocated at the pointer; `&mut self` makes the slice unique.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_ptr(), DIO_BUFFER) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by `new` with the same layout.
        unsafe { std::alloc::dealloc(self.0.as_ptr(), Self::layout()) }
    }
}

// SAFETY: the buffer is plain memory owned by the value; it moves between threads whole.
unsafe impl Send for AlignedBuffer {}

/// Bounce buffers not in use. A put takes one and gives it back, so the process holds as many as
/// puts ever ran at once (not one per thread that ever wrote: the HTTP workers are many).
static DIO_POOL: std::sync::Mutex<Vec<AlignedBuffer>> = std::sync::Mutex::new(Vec::new());

fn take_buffer() -> Option<AlignedBuffer> {
    let pooled = DIO_POOL.lock().ok().and_then(|mut p| p.pop());
    pooled.or_else(AlignedBuffer::new)
}

fn give_back(b: AlignedBuffer) {
    if let Ok(mut p) = DIO_POOL.lock() {
        p.push(b);
    }
}

/// Writes `bytes` at `offset` of the staging file `path` (`f`: the same file, opened for reading
/// and writing), the aligned middle with O_DIRECT. Contract: what the file holds afterwards is
/// exactly what `f.write_all_at(bytes, offset)` would leave, whichever way each byte went:
///  * the block that holds `offset` is completed first with the file's own bytes before `offset`
///    (read back through the page cache), so the direct write starts on a block boundary;
///  * the bytes past the last whole block are written through the page cache (the next write's
///    head reads them back; the kernel writes back and drops cached pages a direct write covers);
///  * where O_DIRECT is refused at open (EINVAL: tmpfs before Linux 6.6 and other file systems
///    without it), fewer than DIO_MIN aligned bytes are involved, or no bounce buffer can be had,
///    every byte is written through the page cache; a direct write that fails is redone whole
///    through the page cache.
/// Nothing here is durable: the caller's fdatasync (`f.sync_data`) is.
fn write_staging(f: &std::fs::File, path: &std::path::Path, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
    let align = DIO_ALIGN as u64;
    let start = offset & !(align - 1);
    let end = offset + bytes.len() as u64;
    let direct_end = end & !(align - 1);
    if direct_end <= start || direct_end - start < DIO_MIN {
        return f.write_all_at(bytes, offset);
    }
    let direct = match std::fs::OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path) {
        Ok(d) => d,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return f.write_all_at(bytes, offset),
        Err(e) => return Err(e),
    };
    let Some(mut buffer) = take_buffer() else {
        return f.write_all_at(bytes, offset); // no memory for the bounce buffer
    };
    let written = (|| -> std::io::Result<()> {
        let buf = buffer.bytes();
        let head = (offset - start) as usize;
        f.read_exact_at(&mut buf[..head], start)?;
        let (mut filled, mut at, mut taken) = (head, start, 0usize);
        let direct_bytes = (direct_end - offset) as usize;
        while taken < direct_bytes {
            let n = (DIO_BUFFER - filled).min(direct_bytes - taken);
            buf[filled..filled + n].copy_from_slice(&bytes[taken..taken + n]);
            filled += n;
            taken += n;
            // `filled` is DIO_BUFFER, or the last piece up to direct_end: a whole number of blocks.
            direct.write_all_at(&buf[..filled], at)?;
            at += filled as u64;
            filled = 0;
        }
        f.write_all_at(&bytes[taken..], direct_end)
    })();
    give_back(buffer);
    match written {
        Ok(()) => {
            DIRECT_WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
        // A write the file system refused after the open (an alignment stricter than DIO_ALIGN, a
        // short direct write): the whole piece again through the page cache, which leaves the
        // bytes the contract promises whatever the direct attempt left. A real I/O error fails
        // here too.
        Err(_) => f.write_all_at(bytes, offset),
    }
}

/// How many writes went out with O_DIRECT in this process (tests: the direct path ran).
static DIRECT_WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The count of staging writes that went out with O_DIRECT (whole, no fallback) in this process.
#[no_mangle]
pub extern "C" fn oml_storage_direct_write_count() -> u64 {
    DIRECT_WRITES.load(std::sync::atomic::Ordering::Relaxed)
}

fn io_fail<T>(what: &str, e: std::io::Error) -> FfiResult<T> {
    let code = if e.kind() == std::io::ErrorKind::NotFound { OML_STORAGE_NOT_FOUND } else { OML_STORAGE_UNAVAILABLE };
    fail(code, format!("{what}: {e}"))
}

/// The smallest part but the last a resumable write of this store takes: 5 MiB on S3, 0 on a
/// local directory.
#[no_mangle]
pub extern "C" fn oml_storage_resumable_min_part(store: *const OmlStorageStore) -> u64 {
    match store_ref(store) {
        Ok(s) => match &s.leftovers {
            Leftovers::S3(_) => OML_STORAGE_RESUMABLE_S3_MIN_PART,
            Leftovers::Local(_) => 0,
        },
        Err(_) => 0,
    }
}

/// Starts a resumable write at `key` (the staging key); *out_handle (free with
/// oml_storage_free_string) names it for the calls below.
#[no_mangle]
pub extern "C" fn oml_storage_resumable_start(
    store: *const OmlStorageStore,
    key: *const c_char,
    out_handle: *mut *mut c_char,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_handle, "out_handle")?;
        *out = std::ptr::null_mut();
        let store = store_ref(store)?;
        let path = key_path(store, cstr_arg(key, "key")?)?;
        let handle = match &store.leftovers {
            Leftovers::S3(t) => block_on(t.s3.create_multipart(&path))?.map_err(map_os_error)?,
            Leftovers::Local(root) => {
                let file = local_file(root, &path);
                let made = (|| -> std::io::Result<()> {
                    if let Some(parent) = file.parent() {
                        std::fs::create_dir_all(parent)?;
                    }
                    let f = std::fs::File::create(&file)?;
                    f.sync_all()?;
                    durable_local::sync_dirs(&file, root)
                })();
                if let Err(e) = made {
                    return io_fail(&format!("create staging file {}", file.display()), e);
                }
                LOCAL_HANDLE.to_string()
            }
        };
        *out = to_c_string(&handle);
        Ok(())
    })
}

/// Writes part `part_no` (1-based), `len` bytes at `data`, which start at byte `offset` of the
/// object. *out_etag (free with oml_storage_free_string): S3's ETag of the part, "" locally.
/// `sync` 0 (local only): not fsynced yet; a later put with `sync` makes every byte durable.
#[no_mangle]
pub extern "C" fn oml_storage_resumable_put(
    store: *const OmlStorageStore,
    key: *const c_char,
    handle: *const c_char,
    part_no: u32,
    offset: u64,
    data: *const u8,
    len: usize,
    sync: i32,
    out_etag: *mut *mut c_char,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_etag, "out_etag")?;
        *out = std::ptr::null_mut();
        let store = store_ref(store)?;
        let path = key_path(store, cstr_arg(key, "key")?)?;
        let handle = cstr_arg(handle, "handle")?.to_string();
        let etag = match &store.leftovers {
            Leftovers::S3(t) => {
                if part_no == 0 || part_no > 10_000 {
                    return fail(OML_STORAGE_INVALID_ARGUMENT, format!("part number {part_no} is not in 1..=10000"));
                }
                let payload = PutPayload::from_bytes(bytes_arg(data, len)?);
                let part = block_on(t.s3.put_part(&path, &handle, (part_no - 1) as usize, payload))?
                    .map_err(map_os_error)?;
                part.content_id
            }
            Leftovers::Local(root) => {
                if data.is_null() && len != 0 {
                    return fail(OML_STORAGE_INVALID_ARGUMENT, "data is NULL but len > 0");
                }
                // SAFETY: the caller passes `len` readable bytes at `data`.
                let bytes: &[u8] = if len == 0 { &[] } else { unsafe { std::slice::from_raw_parts(data, len) } };
                let file = local_file(root, &path);
                let f = match std::fs::OpenOptions::new().read(true).write(true).open(&file) {
                    Ok(f) => f,
                    Err(e) => return io_fail(&format!("staging file {}", file.display()), e),
                };
                let have = f.metadata().map(|m| m.len()).or_else(|e| io_fail("stat staging file", e))?;
                if have < offset {
                    return fail(
                        OML_STORAGE_NOT_FOUND,
                        format!("staging file {} holds {have} bytes, fewer than the part's offset {offset}", file.display()),
                    );
                }
                let written = (|| -> std::io::Result<()> {
                    f.set_len(offset)?;
                    write_staging(&f, &file, offset, bytes)?;
                    if sync != 0 {
                        f.sync_data()?;
                    }
                    Ok(())
                })();
                if let Err(e) = written {
                    return io_fail(&format!("write staging file {}", file.display()), e);
                }
                String::new()
            }
        };
        *out = to_c_string(&etag);
        Ok(())
    })
}

/// Makes the object whole at `final_key` from the parts (`etags[0..n]`, part i+1 each, ignored
/// locally) and removes the staging object. `size`: the object's bytes, for the crash checks.
#[no_mangle]
pub extern "C" fn oml_storage_resumable_finish(
    store: *const OmlStorageStore,
    key: *const c_char,
    handle: *const c_char,
    etags: *const *const c_char,
    n: usize,
    size: u64,
    final_key: *const c_char,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let store = store_ref(store)?;
        let path = key_path(store, cstr_arg(key, "key")?)?;
        let to = key_path(store, cstr_arg(final_key, "final_key")?)?;
        let handle = cstr_arg(handle, "handle")?.to_string();
        let mut parts = Vec::with_capacity(n);
        if n > 0 && etags.is_null() {
            return fail(OML_STORAGE_INVALID_ARGUMENT, "etags is NULL but n > 0");
        }
        for i in 0..n {
            // SAFETY: the caller passes n C strings.
            let p = unsafe { *etags.add(i) };
            if p.is_null() {
                return fail(OML_STORAGE_INVALID_ARGUMENT, format!("etag {i} is NULL"));
            }
            let s = unsafe { CStr::from_ptr(p) }.to_str().or_else(|_| fail(OML_STORAGE_INVALID_ARGUMENT, "etag is not UTF-8"))?;
            parts.push(PartId { content_id: s.to_string() });
        }
        block_on(async {
            let size_of = |p: Path| async move {
                match store.store.head(&p).await {
                    Ok(m) => Ok(Some(m.size)),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(map_os_error(e)),
                }
            };
            // Finished before a crash: the object is in place.
            if size_of(to.clone()).await? == Some(size) {
                let _ = store.store.delete(&path).await;
                return Ok(());
            }
            match &store.leftovers {
                Leftovers::S3(t) => {
                    if let Err(e) = t.s3.complete_multipart(&path, &handle, parts).await {
                        // Completed before a crash: the staging object is whole.
                        if size_of(path.clone()).await? != Some(size) {
                            return Err(map_os_error(e));
                        }
                    }
                    if size <= S3_COPY_MAX {
                        store.store.copy(&path, &to).await.map_err(map_os_error)?;
                    } else {
                        copy_streaming(store, &path, &to, size).await?;
                    }
                    match store.store.delete(&path).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                        Err(e) => Err(map_os_error(e)),
                    }
                }
                Leftovers::Local(root) => {
                    let file = local_file(root, &path);
                    let synced = std::fs::File::open(&file).and_then(|f| {
                        let len = f.metadata()?.len();
                        f.sync_all()?;
                        Ok(len)
                    });
                    match synced {
                        Ok(len) if len == size => {}
                        Ok(len) => {
                            return fail(
                                OML_STORAGE_NOT_FOUND,
                                format!("staging file {} holds {len} bytes, not {size}", file.display()),
                            )
                        }
                        Err(e) => return io_fail(&format!("staging file {}", file.display()), e),
                    }
                    store.store.rename(&path, &to).await.map_err(map_os_error)
                }
            }
        })?
    })
}

/// Forgets a resumable write: S3 aborts the multipart upload (its parts are freed), locally the
/// staging file is deleted. Missing: not an error.
#[no_mangle]
pub extern "C" fn oml_storage_resumable_abort(
    store: *const OmlStorageStore,
    key: *const c_char,
    handle: *const c_char,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let store = store_ref(store)?;
        let path = key_path(store, cstr_arg(key, "key")?)?;
        let handle = cstr_arg(handle, "handle")?.to_string();
        block_on(async {
            let r = match &store.leftovers {
                Leftovers::S3(t) => t.s3.abort_multipart(&path, &handle).await,
                Leftovers::Local(_) => store.store.delete(&path).await,
            };
            match r {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(map_os_error(e)),
            }
        })?
    })
}
