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
/* Frees the bytes of a buffer filled by oml_storage_store_get and resets it to {NULL, 0}. */
void oml_storage_free_buffer(OmlStorageBuffer* buf);
/* Static version string ("oml-storage X (deltalake-core Y)"); never freed. */
const char* oml_storage_version(void);

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
/* Deletes an object. Deleting a missing object succeeds. */
int32_t oml_storage_store_delete(const OmlStorageStore* store, const char* key,
                                 OmlStorageError* err);

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
 * with *out_schema_matches = 0 and leaves the table alone. */
int32_t oml_storage_delta_create_table(const char* table_uri, const char* schema_json,
                                       const char* partition_columns_json,
                                       const char* table_name, int64_t* out_version,
                                       int32_t* out_created, int32_t* out_schema_matches,
                                       OmlStorageError* err);
/* Latest version of the Delta table at table_uri into *out_version.
 * OML_STORAGE_NOT_FOUND if there is no Delta table there (including a missing local dir). */
int32_t oml_storage_delta_table_version(const char* table_uri, int64_t* out_version,
                                        OmlStorageError* err);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* OML_STORAGE_H_ */
