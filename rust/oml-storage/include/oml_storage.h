/* oml_storage.h — C ABI of rust/oml-storage (object_store + delta-rs). No business logic.
 *
 * Conventions (every function returning int32_t):
 *   - The return value is an OML_STORAGE_* code; OML_STORAGE_OK (0) is success.
 *   - `err` may be NULL. Otherwise it is always written: {0, NULL} on success, and on failure
 *     {code, message} where message is a heap string to free with oml_storage_free_string.
 *   - No Rust panic crosses this boundary; a caught panic is reported as OML_STORAGE_PANIC.
 *   - Calls block the calling thread on one shared tokio runtime (2 worker threads, created on
 *     first use). They are thread-safe; a store handle may be shared between threads.
 *   - Strings in are NUL-terminated UTF-8 and only borrowed for the duration of the call.
 *
 * Keep in sync with src/lib.rs by hand.
 */
#ifndef OML_STORAGE_H_
#define OML_STORAGE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Codes ------------------------------------------------------------------------------- */
#define OML_STORAGE_OK 0
#define OML_STORAGE_INVALID_ARGUMENT 1  /* bad URL / key / schema JSON, unsupported scheme or type */
#define OML_STORAGE_NOT_FOUND 2         /* no such object; no Delta table at the URI */
#define OML_STORAGE_ALREADY_EXISTS 3    /* a conditional write lost a race */
#define OML_STORAGE_PERMISSION_DENIED 4 /* backend rejected credentials or the operation */
#define OML_STORAGE_UNAVAILABLE 5       /* I/O or network failure; retry later */
#define OML_STORAGE_INTERNAL 6          /* any other library failure */
#define OML_STORAGE_PANIC 7             /* a Rust panic was caught at the boundary (a bug) */
#define OML_STORAGE_CONFLICT 8          /* a Delta commit lost to a concurrent commit: the table
                                          * has a version newer than the handle's snapshot; nothing
                                          * was committed. Refresh, re-read the txn, decide again. */
#define OML_STORAGE_STALE_REWRITE 9     /* a rewrite (OPTIMIZE) refused to land over a commit that
                                          * landed since its snapshot and removed a file it read
                                          * (another OPTIMIZE or Z-order): nothing was committed;
                                          * the files it wrote are orphans for VACUUM. Refresh and
                                          * run it again. */
#define OML_STORAGE_DAMAGED_COMMIT 10   /* a commit file of the table's log is empty or not JSON
                                          * lines of single Delta actions (an OS crash before it was
                                          * durable, an operator's edit): the table is never read
                                          * as if that version were an empty commit. The message
                                          * names the version ("lake-commit-damaged: commit N of
                                          * ..."). See oml_storage_delta_set_aside_damaged_head. */
#define OML_STORAGE_DAMAGED_FILE 11     /* a data file a snapshot names cannot be read as Parquet
                                          * of the table's columns (truncated, not Parquet, a column
                                          * of an incompatible type). The message names the file
                                          * ("lake-file-damaged: data file <path>: ..."). */

typedef struct OmlStorageError {
  int32_t code;
  char* message; /* NULL or heap string; free with oml_storage_free_string */
} OmlStorageError;

typedef struct OmlStorageBuffer {
  uint8_t* data; /* may be non-NULL even when len == 0; free with oml_storage_free_buffer */
  size_t len;
} OmlStorageBuffer;

typedef struct OmlStorageStore OmlStorageStore; /* opaque */

/* ---- Memory ------------------------------------------------------------------------------ */
/* Frees a string returned by this library (error messages, list JSON). NULL is a no-op. */
void oml_storage_free_string(char* s);
/* Frees the bytes of a buffer filled by oml_storage_store_get / _get_range; resets it to {NULL, 0}. */
void oml_storage_free_buffer(OmlStorageBuffer* buf);
/* Static version string ("oml-storage X (deltalake-core Y)"); never freed. */
const char* oml_storage_version(void);

/* Local stores (a path or file:// URL, for objects and Delta tables) fsync every file they
 * write, and each directory from the file's own up to the store's root (the table's parent
 * directory for a table), before the write returns. This counts those fsyncs since the process
 * started (tests prove a commit was made durable with it). */
uint64_t oml_storage_durable_syncs(void);

/* Whole listings of a local Delta table's log (`_delta_log`, no start offset) since the process
 * started. An append, MERGE or commit makes none: the expired-log cleanup, which lists the whole
 * log, runs with OPTIMIZE's commit and in oml_storage_delta_vacuum (opening a table lists it too).
 * Tests read this to prove it. */
uint64_t oml_storage_durable_log_lists(void);

/* ---- Object store ------------------------------------------------------------------------ */
/* Opens a store. url:
 *   file:///abs/dir   local directory, created if missing
 *   /abs/dir          same as file://
 *   s3://bucket[/prefix]  S3 configured from the environment (AmazonS3Builder::from_env):
 *                     AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
 *                     AWS_SESSION_TOKEN, AWS_REGION, AWS_ALLOW_HTTP=true for http endpoints.
 * Any other scheme, or a relative path: OML_STORAGE_INVALID_ARGUMENT.
 * On success *out_store is a handle to close with oml_storage_store_close; else NULL. */
int32_t oml_storage_store_open(const char* url, OmlStorageStore** out_store,
                               OmlStorageError* err);
/* Closes a handle. NULL is a no-op. */
void oml_storage_store_close(OmlStorageStore* store);

/* Keys are '/'-separated and relative to the URL's prefix: non-empty, no leading or trailing
 * '/', no empty, "." or ".." segments (else OML_STORAGE_INVALID_ARGUMENT). */

/* Creates or replaces the whole object atomically (local: temp file + rename). */
int32_t oml_storage_store_put(const OmlStorageStore* store, const char* key,
                              const uint8_t* data, size_t len, OmlStorageError* err);
/* Reads the whole object into *out (free with oml_storage_free_buffer).
 * OML_STORAGE_NOT_FOUND if it does not exist; *out is then {NULL, 0}. */
int32_t oml_storage_store_get(const OmlStorageStore* store, const char* key,
                              OmlStorageBuffer* out, OmlStorageError* err);
/* Lists every key (recursively) that starts with the string `prefix` (NULL or "" = all keys),
 * relative to the store prefix, byte-wise sorted, as a JSON array of strings written to
 * *out_json (free with oml_storage_free_string). */
int32_t oml_storage_store_list(const OmlStorageStore* store, const char* prefix,
                               char** out_json, OmlStorageError* err);
/* As oml_storage_store_list, each entry an object {"key", "size" (bytes), "modified_ms" (last
 * modification, Unix milliseconds)}. */
int32_t oml_storage_store_list_meta(const OmlStorageStore* store, const char* prefix,
                                    char** out_json, OmlStorageError* err);
/* Deletes an object. Deleting a missing object succeeds. */
int32_t oml_storage_store_delete(const OmlStorageStore* store, const char* key,
                                 OmlStorageError* err);
/* Removes what interrupted writes left (invisible to list): on a local store, staging files
 * `<name>#<digits>` not modified for grace_secs; on S3, incomplete multipart uploads under the
 * store's prefix initiated at least grace_secs ago. *removed (may be NULL): how many. The grace
 * must exceed the longest write in progress. */
int32_t oml_storage_store_sweep_staging(const OmlStorageStore* store, uint64_t grace_secs,
                                        uint64_t* removed, OmlStorageError* err);
/* Creates the object only if no object has the key (local: a staged file hard-linked into
 * place; S3: PUT with If-None-Match: *, which the store must honour). If one exists:
 * OML_STORAGE_ALREADY_EXISTS and nothing is written. */
int32_t oml_storage_store_put_if_absent(const OmlStorageStore* store, const char* key,
                                        const uint8_t* data, size_t len, OmlStorageError* err);
/* Reads bytes [offset, min(offset + length, size)) of the object into *out (free with
 * oml_storage_free_buffer): empty when length is 0 or offset >= size. offset + length may
 * exceed the size (or UINT64_MAX). OML_STORAGE_NOT_FOUND if the object does not exist. */
int32_t oml_storage_store_get_range(const OmlStorageStore* store, const char* key,
                                    uint64_t offset, uint64_t length, OmlStorageBuffer* out,
                                    OmlStorageError* err);
/* Staging writes of resumable local writes that went out with O_DIRECT, whole, in this process
 * (tests). */
uint64_t oml_storage_direct_write_count(void);
/* As oml_storage_store_get_range, into the caller's `length` bytes at dst; *out_len: how many
 * were read (fewer only at the object's end). A local directory's file is read straight into
 * dst; S3 goes through get_range and one copy. OML_STORAGE_NOT_FOUND if the object does not
 * exist. */
int32_t oml_storage_store_read_range(const OmlStorageStore* store, const char* key, uint64_t offset,
                                     uint64_t length, uint8_t* dst, uint64_t* out_len,
                                     OmlStorageError* err);
/* The object's size in bytes (HEAD) into *out_size. OML_STORAGE_NOT_FOUND if it does not
 * exist (*out_size = 0). */
int32_t oml_storage_store_head(const OmlStorageStore* store, const char* key,
                               uint64_t* out_size, OmlStorageError* err);
/* Server-side copy of from_key to to_key within the store, replacing any object at to_key
 * atomically (local: a hard link renamed into place; S3: CopyObject, at most 5 GiB).
 * OML_STORAGE_NOT_FOUND if from_key does not exist. */
int32_t oml_storage_store_copy(const OmlStorageStore* store, const char* from_key,
                               const char* to_key, OmlStorageError* err);

/* ---- Resumable write (the caller keeps its progress) -------------------------------------- */
/* One object written part by part across requests and processes (upload sessions, rust/
 * oml-storage/src/resumable.rs). S3: a multipart upload at the staging key; each part's ETag is
 * answered for the caller to record; finish completes it and server-side copies it to the final
 * key. Local: an append-only staging file; put truncates it to `offset` and writes there (a file
 * shorter than offset: OML_STORAGE_NOT_FOUND, never padded); finish renames it into the final key.
 * Every write is durable (fsynced locally) before it returns. */
/* The smallest part but the last: 5 MiB on S3, 0 locally. */
uint64_t oml_storage_resumable_min_part(const OmlStorageStore* store);
/* *out_handle (free with oml_storage_free_string): S3's UploadId, "local" locally. */
int32_t oml_storage_resumable_start(const OmlStorageStore* store, const char* key, char** out_handle,
                                    OmlStorageError* err);
/* Part part_no (1..10000) holding the object's bytes from `offset`. *out_etag: the part's ETag ("" locally).
 * sync 0 (a local store only; S3 parts are always durable): the bytes are not fsynced yet; a later
 * put with sync != 0 (of any length, even 0) makes the whole file durable. */
int32_t oml_storage_resumable_put(const OmlStorageStore* store, const char* key, const char* handle,
                                  uint32_t part_no, uint64_t offset, const uint8_t* data, size_t len,
                                  int32_t sync, char** out_etag, OmlStorageError* err);
/* The object appears at final_key whole (`size` bytes; etags[i] is part i+1's); the staging
 * object is removed. Idempotent after a crash (final_key already holding `size` bytes, or the
 * multipart upload already completed). */
int32_t oml_storage_resumable_finish(const OmlStorageStore* store, const char* key, const char* handle,
                                     const char* const* etags, size_t n, uint64_t size, const char* final_key,
                                     OmlStorageError* err);
/* Forgets the write (S3: AbortMultipartUpload; local: deletes the staging file); missing is ok. */
int32_t oml_storage_resumable_abort(const OmlStorageStore* store, const char* key, const char* handle,
                                    OmlStorageError* err);

/* ---- Streaming writer (multipart upload) ------------------------------------------------- */
/* One object written in pieces. Bytes are buffered up to OML_STORAGE_WRITER_PART_BYTES; each
 * full part is uploaded (and awaited) inside the write call that filled it, so a writer holds
 * at most one part in memory. S3: a multipart upload, parts of exactly 8 MiB except the last
 * (S3 wants >= 5 MiB; at most 10,000 parts, so objects up to 80 GiB). Local: a hidden staging
 * file `<key>#<n>` next to the key (never listed).
 * Nothing is visible at the key until finish, which makes the whole object appear atomically
 * (replacing any object there). abort, a failed write or finish, or close without finish
 * remove the parts / staging file (best effort: on S3 a crash leaves an incomplete upload to
 * the bucket's lifecycle rule).
 * A writer is NOT thread-safe: one thread at a time. It keeps its own reference to the
 * backend, so it stays usable after its store handle is closed.
 * States: open -> finished | aborted | failed (a write or finish failed; parts discarded).
 * write/finish on a writer that is not open: OML_STORAGE_INVALID_ARGUMENT. */
#define OML_STORAGE_WRITER_PART_BYTES (8u << 20)
typedef struct OmlStorageWriter OmlStorageWriter; /* opaque */

/* Starts a write of key. *out_writer: close with oml_storage_writer_close; NULL on failure. */
int32_t oml_storage_writer_open(const OmlStorageStore* store, const char* key,
                                OmlStorageWriter** out_writer, OmlStorageError* err);
/* Appends len bytes at data (copied). */
int32_t oml_storage_writer_write(OmlStorageWriter* writer, const uint8_t* data, size_t len,
                                 OmlStorageError* err);
/* Uploads the buffered rest and completes: the object appears atomically. No writes after. */
int32_t oml_storage_writer_finish(OmlStorageWriter* writer, OmlStorageError* err);
/* Discards everything written; the key is left as it was. OK again on an aborted writer, and on
 * a failed one; OML_STORAGE_INVALID_ARGUMENT on a finished one (delete the object instead). */
int32_t oml_storage_writer_abort(OmlStorageWriter* writer, OmlStorageError* err);
/* Frees the writer, aborting it first if it is still open (best effort). NULL is a no-op. */
void oml_storage_writer_close(OmlStorageWriter* writer);

/* ---- Delta tables ------------------------------------------------------------------------ */
/* table_uri: an absolute local path, file:///abs/path or s3://bucket/prefix (s3 options come
 * from the same AWS_* environment variables; commits use If-None-Match conditional puts). */

/* Creates an empty Delta table at table_uri unless one exists.
 *   schema_json: JSON array of {"name": str, "type": str, "nullable": bool (default true)};
 *                type is one of string, long, integer, binary, boolean,
 *                timestamp (microseconds, UTC-adjusted).
 *   partition_columns_json: NULL, "" or a JSON array of column names.
 *   table_name: NULL or the Delta metadata name (e.g. "bronze.events").
 * Outputs (all required):
 *   *out_version         the table's current version (0 right after creation)
 *   *out_created         1 if this call created the table, 0 if it already existed
 *   *out_schema_matches  1 if the table's columns (name, type, nullability, in order) and
 *                        partition columns equal the requested ones, else 0
 * An existing table with a different schema is NOT an error: the call returns OML_STORAGE_OK
 * with *out_schema_matches = 0 and leaves the table alone.
 * A new table gets delta.checkpointInterval = 10 (commits then write a checkpoint every 10
 * versions; an existing table keeps its own). */
int32_t oml_storage_delta_create_table(const char* table_uri, const char* schema_json,
                                       const char* partition_columns_json,
                                       const char* table_name, int64_t* out_version,
                                       int32_t* out_created, int32_t* out_schema_matches,
                                       OmlStorageError* err);
/* Latest version of the Delta table at table_uri into *out_version.
 * OML_STORAGE_NOT_FOUND if there is no Delta table there (including a missing local dir). */
int32_t oml_storage_delta_table_version(const char* table_uri, int64_t* out_version,
                                        OmlStorageError* err);

/* ---- Delta table handles (the lake writer's operations) -------------------------------- */
/* A handle holds one table and the snapshot (a table version) that every read and commit
 * through it is based on. Commits are conditional on that snapshot: commit N+1 is written with
 * put-if-absent (object_store PutMode::Create; on S3 If-None-Match: *), and delta-rs's own
 * retry-and-rebase is turned off, so if any other commit landed after the snapshot the call
 * fails with OML_STORAGE_CONFLICT and commits nothing (append and MERGE never rebase, so no
 * commit of theirs can land over one that removed a file they read). A successful commit advances the handle
 * to the version it wrote; a failed one leaves it unchanged. A handle may be shared between
 * threads (calls on one handle are serialized).
 *
 * Rows are JSON lines: one JSON object per line, decoded with arrow-json against the table's
 * own Arrow schema, strictly: an unknown field, a wrong type, or null/absent in a non-nullable
 * column is OML_STORAGE_INVALID_ARGUMENT and commits nothing. Encodings: string as a JSON
 * string, long/integer as a JSON number, boolean as true/false, binary as a standard padded BASE64 string,
 * timestamp as RFC 3339 text ("2025-01-02T03:04:05.123456Z") or integer microseconds since the
 * epoch. An absent nullable column is null. At least one row is required.
 *
 * Every commit carries a txn action {appId: app_id, version: txn_version} (no lastUpdated, so
 * no retention can expire it) and the caller's metadata in its commitInfo. metadata_json: NULL,
 * "" or a JSON object whose keys all start with "oml." (else OML_STORAGE_INVALID_ARGUMENT).
 * The adapter does NOT compare txn_version with the table's current txn version for app_id:
 * skipping an already-applied batch is the caller's check (oml_storage_delta_last_txn). */
typedef struct OmlStorageDeltaTable OmlStorageDeltaTable; /* opaque */

/* Damaged commits at the head of a table's log (each newest commit file, while it is damaged:
 * empty, or not JSON lines of single actions) are moved out of the log, to
 * _oml_damaged/<version>.json.<unix ms> under the table, newest first, so the table reads as of the
 * last intact commit and the next commit rewrites that version. Version 0 and a version with a
 * checkpoint are never moved. *out_count is how many were moved, *out_lowest_version the lowest
 * (-1 if none). OML_STORAGE_DAMAGED_COMMIT if a damaged commit remains below an intact one (a
 * commit built on it: the table must be rebuilt), or at a checkpoint. Only the lake writer that
 * holds the lease calls this. */
int32_t oml_storage_delta_set_aside_damaged_head(const char* table_uri, int64_t* out_count,
                                                 int64_t* out_lowest_version, OmlStorageError* err);

/* Opens the table at table_uri (see above) at its latest version. OML_STORAGE_NOT_FOUND if no
 * Delta table is there. Close *out_table with oml_storage_delta_close. */
int32_t oml_storage_delta_open(const char* table_uri, OmlStorageDeltaTable** out_table,
                               OmlStorageError* err);
/* oml_storage_delta_open without refusing damaged commits: deltalake-core's own reading (an
 * empty commit file is an empty version). Only for `oml lake rebuild`, which empties such a
 * table and checkpoints it, so the damaged commit falls below the newest checkpoint. A commit
 * that is not JSON still fails (deltalake-core cannot load the table). */
int32_t oml_storage_delta_open_unchecked(const char* table_uri, OmlStorageDeltaTable** out_table,
                                         OmlStorageError* err);
/* Closes a handle. NULL is a no-op. */
void oml_storage_delta_close(OmlStorageDeltaTable* table);
/* The handle's snapshot version. */
int32_t oml_storage_delta_snapshot_version(const OmlStorageDeltaTable* table,
                                           int64_t* out_version, OmlStorageError* err);
/* Moves the handle's snapshot to the table's latest version, written to *out_version. */
int32_t oml_storage_delta_refresh(OmlStorageDeltaTable* table, int64_t* out_version,
                                  OmlStorageError* err);

/* As of the handle's snapshot: the latest txn version recorded for app_id, or -1 if none
 * (*out_txn_version), and the commit that recorded it: its table version (*out_commit_version)
 * and the "oml."-keys of its commitInfo as a JSON object string (*out_metadata_json, free with
 * oml_storage_free_string; "{}" if that commit had none). If there is no txn, or the commit's
 * log file is gone (expired-log cleanup keeps it 30 days past a later checkpoint), then
 * *out_commit_version = -1 and *out_metadata_json = NULL; the txn version itself survives
 * checkpoints and vacuum. */
int32_t oml_storage_delta_last_txn(const OmlStorageDeltaTable* table, const char* app_id,
                                   int64_t* out_txn_version, int64_t* out_commit_version,
                                   char** out_metadata_json, OmlStorageError* err);

/* Appends rows (rows_len bytes of JSON lines at rows_jsonl) in one commit with the txn action
 * and metadata. *out_version: the version written. OML_STORAGE_CONFLICT as above. */
int32_t oml_storage_delta_append(OmlStorageDeltaTable* table, const char* rows_jsonl,
                                 size_t rows_len, const char* app_id, int64_t txn_version,
                                 const char* metadata_json, int64_t* out_version,
                                 OmlStorageError* err);

/* The Arrow C data interface (https://arrow.apache.org/docs/format/CDataInterface.html): the
 * two structs exactly as the specification defines them, under its include guard. */
#ifndef ARROW_C_DATA_INTERFACE
#define ARROW_C_DATA_INTERFACE
#define ARROW_FLAG_DICTIONARY_ORDERED 1
#define ARROW_FLAG_NULLABLE 2
#define ARROW_FLAG_MAP_KEYS_SORTED 4
struct ArrowSchema {
  const char* format;
  const char* name;
  const char* metadata;
  int64_t flags;
  int64_t n_children;
  struct ArrowSchema** children;
  struct ArrowSchema* dictionary;
  void (*release)(struct ArrowSchema*);
  void* private_data;
};
struct ArrowArray {
  int64_t length;
  int64_t null_count;
  int64_t offset;
  int64_t n_buffers;
  int64_t n_children;
  const void** buffers;
  struct ArrowArray** children;
  struct ArrowArray* dictionary;
  void (*release)(struct ArrowArray*);
  void* private_data;
};
#endif /* ARROW_C_DATA_INTERFACE */

/* Appends one record batch, given through the Arrow C data interface as a struct array
 * (format "+s") whose children are the table's columns (same names, types and order as the
 * snapshot's schema; Delta "timestamp" is "tsu:UTC", "binary" is "z", "string" "u", "long"
 * "l"), in one commit with the txn action and metadata, as oml_storage_delta_append does.
 * Ownership: the adapter MOVES *array and *schema on every call, whatever it returns (their
 * release is NULL afterwards), and calls their release callbacks when done, possibly from
 * another thread. The data is validated in full (offsets, UTF-8, nulls in non-nullable
 * columns): anything that does not fit is OML_STORAGE_INVALID_ARGUMENT and commits nothing. */
int32_t oml_storage_delta_append_arrow(OmlStorageDeltaTable* table, struct ArrowArray* array,
                                       struct ArrowSchema* schema, const char* app_id,
                                       int64_t txn_version, const char* metadata_json,
                                       int64_t* out_version, OmlStorageError* err);

/* Empties the table: one commit that removes every data file of the snapshot (dataChange true)
 * and records the txn (app_id, txn_version) and the metadata, like an append. Conditional on the
 * snapshot as every commit is (OML_STORAGE_CONFLICT if any commit landed since; nothing
 * committed). `oml lake rebuild` resets the stream's txn to 0 with it, so the lake writer refills
 * the table from the outbox exactly once. *out_version is the new table version. */
int32_t oml_storage_delta_truncate(OmlStorageDeltaTable* table, const char* app_id, int64_t txn_version,
                                   const char* metadata_json, int64_t* out_version, OmlStorageError* err);

/* MERGE in one commit with the txn action and metadata:
 *   ON every key column equal (key_columns_json: non-empty JSON array of column names; keys
 *   must be non-null in every row),
 *   WHEN MATCHED THEN UPDATE SET the update columns (update_columns_json: JSON array of non-key
 *   column names; NULL = every non-key column; [] = matched rows are left alone),
 *   and SET c = target.c + source.c for each add column (add_columns_json: NULL/"" or a JSON
 *   array of non-nullable long/integer columns, neither key nor update columns; with add
 *   columns, keys must be unique among the rows: aggregate first),
 *   WHEN NOT MATCHED THEN INSERT the whole row.
 *   newer_column (NULL/"" for none; a non-nullable long column, not a key or add column): the
 *   matched UPDATE applies only WHEN source.c > target.c, so a row older than the one stored
 *   (a replay, a requeue) changes nothing, whatever order rows arrive in.
 * Rows are applied as if one at a time in their given order: rows with equal keys are folded
 * first (key and update columns from the last such row, or with newer_column from the row with
 * the greatest value, the last of equals; the other columns from the first), so the later (newer)
 * row wins and the result equals sequential application. A MERGE that changes no row still
 * commits its txn action and metadata alone (delta-rs would commit nothing), conditional on the
 * same snapshot: OML_STORAGE_CONFLICT if a commit landed since. *out_version as append. */
int32_t oml_storage_delta_merge(OmlStorageDeltaTable* table, const char* rows_jsonl,
                                size_t rows_len, const char* key_columns_json,
                                const char* update_columns_json, const char* add_columns_json,
                                const char* newer_column, const char* app_id,
                                int64_t txn_version, const char* metadata_json,
                                int64_t* out_version, OmlStorageError* err);

/* Decodes rows (JSON lines) against the handle's snapshot schema and writes nothing. OK if every
 * row fits; else OML_STORAGE_INVALID_ARGUMENT with *out_bad_line = the 0-based line number of the
 * first row that does not fit on its own (-1 if none does alone). The lake writer uses it to find
 * a poison row before committing anything. */
int32_t oml_storage_delta_check_rows(const OmlStorageDeltaTable* table, const char* rows_jsonl,
                                     size_t rows_len, int64_t* out_bad_line, OmlStorageError* err);

/* The handle's snapshot schema as JSON (*out_json, free with oml_storage_free_string):
 * {"columns": [{"name", "type", "nullable"}, ...] in table order, "partition_columns": [...]},
 * types named as oml_storage_delta_create_table takes them (others by their Delta name). */
int32_t oml_storage_delta_schema(const OmlStorageDeltaTable* table, char** out_json,
                                 OmlStorageError* err);
/* Every row of the handle's snapshot as JSON lines (*out_jsonl, free with
 * oml_storage_free_string; "" for an empty table), in no particular order, every column present
 * (null as null), in the same encodings the writers accept. Holds the whole table in memory:
 * for tests and small tables. */
int32_t oml_storage_delta_read_rows(const OmlStorageDeltaTable* table, char** out_jsonl,
                                    OmlStorageError* err);

/* ---- Column scans ------------------------------------------------------------------------
 * Reading a table's rows a batch at a time through the Arrow C data interface, for readers that
 * compare many rows (`oml reconcile`): no JSON, no hex, never the whole table in memory.
 *
 * oml_storage_delta_files: the data files of the handle's snapshot as JSON (*out_json, free with
 * oml_storage_free_string): [{"path", "size", "num_records", "stored_size",
 * "stored_modified_ms"}, ...], path relative to the table root as the log names it, size and
 * num_records as the log's add action says (num_records null without stats), stored_* as one
 * listing of the store finds the file now (null: missing) when list_store is non-zero; with 0
 * the store is not listed (a LIST of the whole table, its log included) and stored_* are null.
 * A missing file makes every read of the table fail: `oml status` reports it, and `oml lake
 * rebuild` repairs the table.
 *
 * oml_storage_delta_scan_open: a scan of the handle's snapshot (the snapshot is fixed when it
 * opens; the handle may be used or closed afterwards). columns_json: a JSON array of column
 * names, handed back in that order. files_json: NULL for every data file of the snapshot (in the
 * log's order, as delta-rs scans them), or a
 * JSON array of paths as oml_storage_delta_files names them (each must be in the snapshot:
 * OML_STORAGE_INVALID_ARGUMENT otherwise). Refused (OML_STORAGE_INVALID_ARGUMENT) for an unknown
 * column, a column of a type other than string, binary, long or timestamp, and a table with
 * partition columns or deletion vectors (oml writes neither).
 *
 * oml_storage_delta_scan_next: the next batch as a struct array (*out_array, *out_schema; the
 * caller releases both) with one child per column: utf8 ("u"), binary ("z"), int64 ("l") or
 * timestamp[us, UTC] ("tsu:UTC"), every child nullable; a column a file lacks is all null.
 * *out_rows = the batch's rows, at least 1; 0 at the end, with the structs left untouched.
 * A file that is gone is OML_STORAGE_NOT_FOUND; one that cannot be read (or holds a value its
 * column's type cannot carry) is OML_STORAGE_DAMAGED_FILE; both name it. The scan is over after
 * an error.
 * Not thread-safe: one thread at a time per scan. */
typedef struct OmlStorageDeltaScan OmlStorageDeltaScan; /* opaque */
int32_t oml_storage_delta_files(const OmlStorageDeltaTable* table, int32_t list_store, char** out_json,
                                OmlStorageError* err);
int32_t oml_storage_delta_scan_open(const OmlStorageDeltaTable* table, const char* columns_json,
                                    const char* files_json, OmlStorageDeltaScan** out_scan,
                                    OmlStorageError* err);
int32_t oml_storage_delta_scan_next(OmlStorageDeltaScan* scan, struct ArrowArray* out_array,
                                    struct ArrowSchema* out_schema, int64_t* out_rows,
                                    OmlStorageError* err);
void oml_storage_delta_scan_close(OmlStorageDeltaScan* scan);

/* Writes a checkpoint of the handle's snapshot version (*out_version). Commits also write one
 * by themselves every delta.checkpointInterval commits (default 100). */
int32_t oml_storage_delta_checkpoint(const OmlStorageDeltaTable* table, int64_t* out_version,
                                     OmlStorageError* err);
/* OPTIMIZE: bin-packs the snapshot's data files smaller than target_size_bytes (> 0) into files
 * of about that size, in one commit with no txn action; rows and every txn version stay. Its add
 * and remove actions are written with dataChange = true, so that another delta-rs based rewrite
 * planned before it landed is refused by that tool's own conflict checker instead of keeping a
 * second copy of the rows. Unlike append and merge it rebases over commits that landed since the
 * snapshot (delta-rs tries the put up to 16 times), unless one of them
 *   - removed a file it rewrote (another OPTIMIZE or Z-order, whatever its dataChange; ours:
 *     refused by delta-rs's checker, another tool's dataChange = false one: by the adapter
 *     itself, against every commit between its snapshot and the version it would write):
 *     OML_STORAGE_STALE_REWRITE;
 *   - changed the metadata or protocol: OML_STORAGE_CONFLICT (delta-rs's checker).
 * Either way nothing is committed. The removed files stay on storage until a VACUUM past the
 * retention. *out_files_removed and *out_files_added: the files it replaced and wrote (0 and 0:
 * nothing to compact, no commit). */
int32_t oml_storage_delta_optimize(OmlStorageDeltaTable* table, uint64_t target_size_bytes,
                                   int64_t* out_files_removed, int64_t* out_files_added,
                                   OmlStorageError* err);
/* VACUUM (full mode): deletes data files that the handle's snapshot no longer references
 * (removed files and orphans such as a fenced writer's uncommitted Parquet files) and that are
 * older than retention_hours (>= 0; the table's delta.deletedFileRetentionDuration is not
 * enforced, the caller decides). It first refreshes the handle to the latest version (full
 * mode would take the files of commits newer than a stale snapshot for orphans). Writes
 * VACUUM START/END commits when it deletes anything, advancing the handle.
 * Retention 0 while another writer is between writing files and committing them can delete
 * those files: use 0 only in tests. *out_files_deleted: the number of files deleted. */
int32_t oml_storage_delta_vacuum(OmlStorageDeltaTable* table, int64_t retention_hours,
                                 int64_t* out_files_deleted, OmlStorageError* err);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* OML_STORAGE_H_ */
