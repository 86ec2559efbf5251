//! Reading a Delta table's rows column by column, for readers that compare them (`oml
//! reconcile`): the data files of one snapshot version (or a named subset of them, for an
//! incremental read), decoded with the parquet crate and handed over a batch at a time through
//! the Arrow C data interface. No JSON, no hex, and never the whole table in memory.
//!
//! Contract (oml_storage.h, "Column scans"):
//! - Columns come back in the order asked for, each in its canonical Arrow type: utf8 ("u"),
//!   binary ("z"), int64 ("l") or timestamp[us, UTC] ("tsu:UTC"); a column a file lacks is all
//!   null (an operator's rewrite that dropped it reads as nulls, which a comparison reports).
//! - A file that cannot be read as Parquet of those columns (truncated, not Parquet, a column of
//!   an incompatible type) is OML_STORAGE_DAMAGED_FILE naming the file; a file that is gone is
//!   OML_STORAGE_NOT_FOUND naming it.
//! - Only tables whose files are plain Parquet are read: a snapshot with deletion vectors or
//!   partition columns (oml writes neither) is OML_STORAGE_INVALID_ARGUMENT.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::c_char;
use std::sync::Arc;

use deltalake::arrow::array::{new_null_array, Array, ArrayRef, StructArray};
use deltalake::arrow::compute::{cast_with_options, CastOptions};
use deltalake::arrow::datatypes::{DataType as ArrowDataType, Field as ArrowField, Fields, TimeUnit};
use deltalake::arrow::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
use deltalake::parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use deltalake::parquet::arrow::ProjectionMask;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use super::{
    block_on, cstr_arg, delta_ref, fail, ffi_call, lock_table, map_delta_error, map_os_error, opt_cstr_arg,
    out_arg, to_c_string, Failure, FfiResult, OmlStorageDeltaTable, OmlStorageError, OML_STORAGE_DAMAGED_FILE,
    OML_STORAGE_INVALID_ARGUMENT, OML_STORAGE_NOT_FOUND,
};

/// Rows per batch handed over: large enough that the per-batch cost vanishes, small enough that
/// a batch of bronze rows (about 1 KiB each) stays a few MiB.
const BATCH_ROWS: usize = 8192;

/// The canonical Arrow type a column of Delta (Arrow) type `t` is handed over as.
fn canonical(t: &ArrowDataType) -> Option<ArrowDataType> {
    use ArrowDataType::*;
    match t {
        Utf8 | LargeUtf8 | Utf8View => Some(Utf8),
        Binary | LargeBinary | BinaryView | FixedSizeBinary(_) => Some(Binary),
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 => Some(Int64),
        Timestamp(_, _) => Some(Timestamp(TimeUnit::Microsecond, Some("UTC".into()))),
        _ => None,
    }
}

fn damaged(path: &str, what: impl std::fmt::Display) -> Failure {
    Failure { code: OML_STORAGE_DAMAGED_FILE, message: format!("lake-file-damaged: data file {path}: {what}") }
}

/// An open scan. Owns nothing of the table handle: it keeps the object store and the file list.
pub struct OmlStorageDeltaScan {
    store: Arc<dyn ObjectStore>,
    files: VecDeque<Path>,
    fields: Fields, // requested columns, canonical types, nullable
    reader: Option<(String, ParquetRecordBatchReader)>,
}

impl OmlStorageDeltaScan {
    /// Opens the next file's reader; false when there is none.
    fn open_next(&mut self) -> FfiResult<bool> {
        let Some(path) = self.files.pop_front() else { return Ok(false) };
        let name = path.to_string();
        let store = self.store.clone();
        let p = path.clone();
        let bytes = block_on(async move { store.get(&p).await?.bytes().await })?.map_err(|e| match e {
            object_store::Error::NotFound { .. } => {
                Failure { code: OML_STORAGE_NOT_FOUND, message: format!("data file {name} is missing") }
            }
            other => map_os_error(other),
        })?;
        let name = path.to_string();
        let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| damaged(&name, e))?;
        let descr = builder.parquet_schema();
        let wanted: HashSet<&str> = self.fields.iter().map(|f| f.name().as_str()).collect();
        let leaves: Vec<usize> = (0..descr.num_columns())
            .filter(|&i| {
                let c = descr.column(i);
                c.path().parts().len() == 1 && wanted.contains(c.path().parts()[0].as_str())
            })
            .collect();
        let mask = ProjectionMask::leaves(descr, leaves);
        let reader = builder
            .with_projection(mask)
            .with_batch_size(BATCH_ROWS)
            .build()
            .map_err(|e| damaged(&name, e))?;
        self.reader = Some((name, reader));
        Ok(true)
    }

    /// The next non-empty batch as a struct array of the requested columns; None at the end.
    fn next_batch(&mut self) -> FfiResult<Option<StructArray>> {
        loop {
            if self.reader.is_none() && !self.open_next()? {
                return Ok(None);
            }
            let (name, reader) = self.reader.as_mut().expect("a reader is open");
            match reader.next() {
                None => self.reader = None,
                Some(Err(e)) => return Err(damaged(name, e)),
                Some(Ok(batch)) if batch.num_rows() == 0 => {}
                Some(Ok(batch)) => {
                    let rows = batch.num_rows();
                    let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.fields.len());
                    for f in self.fields.iter() {
                        columns.push(match batch.column_by_name(f.name()) {
                            None => new_null_array(f.data_type(), rows),
                            Some(c) if c.data_type() == f.data_type() => c.clone(),
                            // Not "safe": a value the cast cannot carry is an error, never a null.
                            Some(c) => cast_with_options(c, f.data_type(), &CastOptions { safe: false, ..Default::default() })
                                .map_err(|e| damaged(name, format!("column {}: {e}", f.name())))?,
                        });
                    }
                    let s = StructArray::try_new(self.fields.clone(), columns, None)
                        .map_err(|e| damaged(name, e))?;
                    return Ok(Some(s));
                }
            }
        }
    }
}

/// Opens a scan of the handle's snapshot. See oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_delta_scan_open(
    table: *const OmlStorageDeltaTable,
    columns_json: *const c_char,
    files_json: *const c_char,
    out_scan: *mut *mut OmlStorageDeltaScan,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_scan, "out_scan")?;
        *out = std::ptr::null_mut();
        let h = delta_ref(table)?;
        let columns: Vec<String> = serde_json::from_str(cstr_arg(columns_json, "columns_json")?)
            .or_else(|e| fail(OML_STORAGE_INVALID_ARGUMENT, format!("columns_json: {e}")))?;
        let only: Option<Vec<String>> = match opt_cstr_arg(files_json, "files_json")? {
            None => None,
            Some(s) => Some(
                serde_json::from_str(s)
                    .or_else(|e| fail(OML_STORAGE_INVALID_ARGUMENT, format!("files_json: {e}")))?,
            ),
        };
        let t = lock_table(h);
        let snap = t.snapshot().map_err(map_delta_error)?;
        if !snap.metadata().partition_columns().is_empty() {
            return fail(OML_STORAGE_INVALID_ARGUMENT, "a partitioned table cannot be scanned by columns");
        }
        let schema = snap.snapshot().arrow_schema();
        let mut fields = Vec::with_capacity(columns.len());
        for c in &columns {
            let f = schema
                .field_with_name(c)
                .or_else(|_| fail(OML_STORAGE_INVALID_ARGUMENT, format!("the table has no column {c:?}")))?;
            let ty = canonical(f.data_type()).ok_or_else(|| Failure {
                code: OML_STORAGE_INVALID_ARGUMENT,
                message: format!("column {c:?} has type {} that scans do not hand over", f.data_type()),
            })?;
            fields.push(ArrowField::new(c, ty, true));
        }
        let mut live: HashMap<String, Path> = HashMap::new();
        let mut order: Vec<Path> = Vec::new();
        for f in snap.log_data().iter() {
            if f.deletion_vector_descriptor().is_some() {
                return fail(OML_STORAGE_INVALID_ARGUMENT, "a table with deletion vectors cannot be scanned by columns");
            }
            live.insert(f.object_store_path().to_string(), f.object_store_path());
            order.push(f.object_store_path());
        }
        let files: VecDeque<Path> = match only {
            // The log's order, as delta-rs's own scans read the files.
            None => order.into_iter().collect(),
            Some(names) => {
                let mut v = VecDeque::with_capacity(names.len());
                for n in names {
                    match live.get(&n) {
                        Some(p) => v.push_back(p.clone()),
                        None => {
                            return fail(
                                OML_STORAGE_INVALID_ARGUMENT,
                                format!("data file {n:?} is not in version {} of the table", snap.version()),
                            )
                        }
                    }
                }
                v
            }
        };
        let scan = OmlStorageDeltaScan {
            store: t.log_store().object_store(None),
            files,
            fields: Fields::from(fields),
            reader: None,
        };
        *out = Box::into_raw(Box::new(scan));
        Ok(())
    })
}

/// The next batch of a scan. See oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_delta_scan_next(
    scan: *mut OmlStorageDeltaScan,
    out_array: *mut FFI_ArrowArray,
    out_schema: *mut FFI_ArrowSchema,
    out_rows: *mut i64,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let rows = out_arg(out_rows, "out_rows")?;
        *rows = 0;
        if out_array.is_null() || out_schema.is_null() {
            return fail(OML_STORAGE_INVALID_ARGUMENT, "out_array and out_schema are required");
        }
        if scan.is_null() {
            return fail(OML_STORAGE_INVALID_ARGUMENT, "scan is NULL");
        }
        // SAFETY: a non-NULL scan is one oml_storage_delta_scan_open returned and not yet closed;
        // the caller does not share it between threads (oml_storage.h).
        let s = unsafe { &mut *scan };
        let Some(batch) = s.next_batch()? else { return Ok(()) };
        let n = batch.len();
        let data = batch.into_data();
        let schema = FFI_ArrowSchema::try_from(ArrowDataType::Struct(s.fields.clone()))
            .or_else(|e| fail(super::OML_STORAGE_INTERNAL, format!("cannot export the schema: {e}")))?;
        let array = FFI_ArrowArray::new(&data);
        // SAFETY: the caller's structs are writable and released (or never filled); ptr::write
        // does not drop what was there.
        unsafe {
            std::ptr::write(out_array, array);
            std::ptr::write(out_schema, schema);
        }
        *rows = n as i64;
        Ok(())
    })
}

/// Closes a scan (NULL is a no-op).
#[no_mangle]
pub extern "C" fn oml_storage_delta_scan_close(scan: *mut OmlStorageDeltaScan) {
    if !scan.is_null() {
        super::no_unwind(|| drop(unsafe { Box::from_raw(scan) }));
    }
}

/// The data files of the handle's snapshot with what the log and the store say of each. See
/// oml_storage.h.
#[no_mangle]
pub extern "C" fn oml_storage_delta_files(
    table: *const OmlStorageDeltaTable,
    list_store: i32,
    out_json: *mut *mut c_char,
    err: *mut OmlStorageError,
) -> i32 {
    ffi_call(err, || {
        let out = out_arg(out_json, "out_json")?;
        *out = std::ptr::null_mut();
        let h = delta_ref(table)?;
        let t = lock_table(h);
        let listed: HashMap<Path, object_store::ObjectMeta> = if list_store != 0 {
            let store = t.log_store().object_store(None);
            block_on(store.list(None).map_ok(|m| (m.location.clone(), m)).try_collect::<HashMap<_, _>>())?
                .map_err(map_os_error)?
        } else {
            HashMap::new()
        };
        let snap = t.snapshot().map_err(map_delta_error)?;
        let files: Vec<serde_json::Value> = snap
            .log_data()
            .iter()
            .map(|f| {
                let p = f.object_store_path();
                let stored = listed.get(&p);
                serde_json::json!({
                    "path": p.to_string(),
                    "size": f.size(),
                    "num_records": f.num_records(),
                    "stored_size": stored.map(|m| m.size),
                    "stored_modified_ms": stored.map(|m| m.last_modified.timestamp_millis()),
                })
            })
            .collect();
        *out = to_c_string(&serde_json::Value::from(files).to_string());
        Ok(())
    })
}
