// A record batch built column by column in C++ and handed to the Delta adapter through the Arrow
// C data interface (rust/oml-storage/include/oml_storage.h): what the lake writer's appends
// carry instead of JSON lines, so that the adapter neither parses JSON nor decodes base64 on the
// drain's hot path (docs/data/delta-tables.md "How rows cross the C ABI").
//
// The four Delta types the lake's tables use map to Arrow as the adapter's snapshot schema has
// them: string → utf8 ("u"), long → int64 ("l"), timestamp → timestamp[us, UTC] ("tsu:UTC"),
// binary → binary ("z"). Offsets are 32-bit, as utf8/binary require: a column whose bytes would
// pass INT32_MAX in one batch is refused (kPayloadTooLarge) before anything is appended.
//
// Rows are built value by value: Append* to each column of the row in any order, then
// EndRow (every column must have exactly one value for the row) or RollbackRow (the partial row
// is undone, the batch is as it was before it). Export moves everything into the two C structs;
// the batch is empty afterwards.
//
// Thread-compatible. The exported structs' release callbacks may run on any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

// The Arrow C data interface's structs (defined in oml_storage.h).
struct ArrowArray;
struct ArrowSchema;

namespace oml::lake {

enum class ArrowColumnType { kString, kLong, kTimestamp, kBinary };

struct ArrowColumnSpec {
  std::string name;
  ArrowColumnType type = ArrowColumnType::kString;
  bool nullable = true;
};

// The type of a Delta type name as delta_tables.h names them ("string", "long", "timestamp",
// "binary"); kInvalidArgument for any other.
Result<ArrowColumnType> ArrowColumnTypeOf(std::string_view delta_type);

class ArrowBatch {
 public:
  explicit ArrowBatch(std::vector<ArrowColumnSpec> columns);
  ~ArrowBatch();
  ArrowBatch(ArrowBatch&&) noexcept;
  ArrowBatch& operator=(ArrowBatch&&) noexcept;
  ArrowBatch(const ArrowBatch&) = delete;
  ArrowBatch& operator=(const ArrowBatch&) = delete;

  const std::vector<ArrowColumnSpec>& columns() const { return specs_; }
  // The column's index, or -1.
  int ColumnIndex(std::string_view name) const;
  int64_t num_rows() const { return rows_; }
  // Bytes held in value buffers (string/binary data and fixed-width values), for sizing.
  size_t value_bytes() const;

  // Expects about `rows` rows: sizes the buffers (a byte column's from its first value times
  // rows), so that they do not grow by copying. Only a hint.
  void ReserveRows(int64_t rows);

  // One value of the current row. The caller gives each column at most one value per row
  // (checked by EndRow) and the type its column has (string and binary take bytes; long and
  // timestamp take int64, a timestamp in microseconds since the epoch). AppendNull on a
  // non-nullable column is refused by EndRow.
  void AppendNull(int col);
  Status AppendBytes(int col, std::string_view bytes);  // kPayloadTooLarge past INT32_MAX bytes
  void AppendInt64(int col, int64_t v);
  // Ends the current row: kInvalidArgument naming the column if one has no value (and is not
  // nullable: a missing nullable value becomes null), has two, or is null but not nullable. On
  // error the row is rolled back.
  Status EndRow();
  void RollbackRow();

  // Moves the rows into *array (a struct array, "+s", one child per column) and *schema, both
  // owning their memory through their release callbacks; the batch is empty afterwards.
  void Export(ArrowArray* array, ArrowSchema* schema);

 private:
  struct Column;
  std::vector<ArrowColumnSpec> specs_;
  std::vector<std::unique_ptr<Column>> cols_;
  int64_t rows_ = 0;
  int64_t hint_rows_ = 0;
};

// A read-only view of one struct array a column scan handed over (DeltaTable::Scan,
// oml_storage_delta_scan_next): owns the two C structs and releases them. Import checks what
// the accessors rely on (one child per expected column, each of the expected format, buffer
// counts, lengths), so that a malformed producer is an error here, never a wild read.
//
// Move-only; thread-compatible.
class ArrowBatchView {
 public:
  ArrowBatchView();
  ~ArrowBatchView();
  ArrowBatchView(ArrowBatchView&&) noexcept;
  ArrowBatchView& operator=(ArrowBatchView&&) noexcept;
  ArrowBatchView(const ArrowBatchView&) = delete;
  ArrowBatchView& operator=(const ArrowBatchView&) = delete;

  // Takes ownership of *array and *schema (their release is NULL afterwards, whatever the
  // result). `types`: the column types expected, in order. kInvalidArgument if the struct does
  // not have them: the view is empty then.
  Status Import(ArrowArray* array, ArrowSchema* schema, const std::vector<ArrowColumnType>& types);

  int64_t num_rows() const { return rows_; }
  int num_columns() const { return static_cast<int>(cols_.size()); }
  bool IsNull(int col, int64_t row) const;
  // A string or binary column's value ("" when null).
  std::string_view Bytes(int col, int64_t row) const;
  // A long or timestamp column's value (0 when null); timestamps in microseconds since the epoch.
  int64_t Int64(int col, int64_t row) const;

 private:
  struct Col {
    ArrowColumnType type;
    int64_t offset = 0;
    const uint8_t* validity = nullptr;  // NULL: no nulls
    const int32_t* offsets = nullptr;   // string, binary
    const uint8_t* data = nullptr;      // string, binary: bytes; long, timestamp: int64 values
  };
  void Release();

  std::unique_ptr<ArrowArray> array_;
  std::unique_ptr<ArrowSchema> schema_;
  std::vector<Col> cols_;
  int64_t rows_ = 0;
};

}  // namespace oml::lake
