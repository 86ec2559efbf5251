// See arrow_batch.h.
#include "lake/arrow_batch.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <utility>

#include "oml_storage.h"

namespace oml::lake {

struct ArrowBatch::Column {
  ArrowColumnType type = ArrowColumnType::kString;
  int64_t length = 0;  // values appended, the current row's included
  int64_t null_count = 0;
  std::vector<uint8_t> validity;    // bit i (LSB first) set: value i is not null
  std::vector<int32_t> offsets{0};  // string, binary: length + 1 entries
  std::string data;                 // string, binary: the values' bytes
  std::vector<int64_t> values;      // long, timestamp

  bool fixed() const { return type == ArrowColumnType::kLong || type == ArrowColumnType::kTimestamp; }
  bool IsValid(int64_t i) const { return (validity[static_cast<size_t>(i / 8)] >> (i % 8)) & 1; }
  void PushValidity(bool valid) {
    if (static_cast<size_t>(length / 8) >= validity.size()) validity.push_back(0);
    if (valid) {
      validity[static_cast<size_t>(length / 8)] |= static_cast<uint8_t>(1u << (length % 8));
    } else {
      ++null_count;
    }
    ++length;
  }
  // Back to n values.
  void Truncate(int64_t n) {
    while (length > n) {
      --length;
      if (!IsValid(length)) --null_count;
      validity[static_cast<size_t>(length / 8)] &= static_cast<uint8_t>(~(1u << (length % 8)));
    }
    validity.resize(static_cast<size_t>((n + 7) / 8));
    if (fixed()) {
      values.resize(static_cast<size_t>(n));
    } else {
      offsets.resize(static_cast<size_t>(n) + 1);
      data.resize(static_cast<size_t>(offsets.back()));
    }
  }
};

Result<ArrowColumnType> ArrowColumnTypeOf(std::string_view delta_type) {
  if (delta_type == "string") return ArrowColumnType::kString;
  if (delta_type == "long") return ArrowColumnType::kLong;
  if (delta_type == "timestamp") return ArrowColumnType::kTimestamp;
  if (delta_type == "binary") return ArrowColumnType::kBinary;
  return InvalidArgument("no Arrow column type for Delta type '" + std::string(delta_type) + "'");
}

ArrowBatch::ArrowBatch(std::vector<ArrowColumnSpec> columns) : specs_(std::move(columns)) {
  for (const auto& s : specs_) {
    cols_.push_back(std::make_unique<Column>());
    cols_.back()->type = s.type;
  }
}

ArrowBatch::~ArrowBatch() = default;
ArrowBatch::ArrowBatch(ArrowBatch&&) noexcept = default;
ArrowBatch& ArrowBatch::operator=(ArrowBatch&&) noexcept = default;

int ArrowBatch::ColumnIndex(std::string_view name) const {
  for (size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name == name) return static_cast<int>(i);
  return -1;
}

size_t ArrowBatch::value_bytes() const {
  size_t n = 0;
  for (const auto& c : cols_) n += c->data.size() + c->values.size() * sizeof(int64_t);
  return n;
}

void ArrowBatch::ReserveRows(int64_t rows) {
  if (rows <= 0) return;
  hint_rows_ = rows;
  for (auto& c : cols_) {
    c->validity.reserve(static_cast<size_t>((rows + 7) / 8));
    if (c->fixed()) {
      c->values.reserve(static_cast<size_t>(rows));
    } else {
      c->offsets.reserve(static_cast<size_t>(rows) + 1);
    }
  }
}

void ArrowBatch::AppendNull(int col) {
  Column& c = *cols_[static_cast<size_t>(col)];
  if (c.fixed()) {
    c.values.push_back(0);
  } else {
    c.offsets.push_back(c.offsets.back());
  }
  c.PushValidity(false);
}

Status ArrowBatch::AppendBytes(int col, std::string_view bytes) {
  Column& c = *cols_[static_cast<size_t>(col)];
  if (bytes.size() > static_cast<size_t>(INT32_MAX) - c.data.size()) {
    return Status(Code::kPayloadTooLarge,
                  "column " + specs_[static_cast<size_t>(col)].name + " passes 2 GiB in one batch",
                  "lake-batch-too-large");
  }
  if (c.data.empty() && hint_rows_ > 0 && !bytes.empty()) {
    c.data.reserve(std::min<size_t>(bytes.size() * static_cast<size_t>(hint_rows_) / 4 * 5 + 64, INT32_MAX));
  }
  c.data.append(bytes);
  c.offsets.push_back(static_cast<int32_t>(c.data.size()));
  c.PushValidity(true);
  return Status::Ok();
}

void ArrowBatch::AppendInt64(int col, int64_t v) {
  Column& c = *cols_[static_cast<size_t>(col)];
  c.values.push_back(v);
  c.PushValidity(true);
}

void ArrowBatch::RollbackRow() {
  for (auto& c : cols_) c->Truncate(rows_);
}

Status ArrowBatch::EndRow() {
  for (size_t i = 0; i < cols_.size(); ++i) {
    Column& c = *cols_[i];
    const ArrowColumnSpec& s = specs_[i];
    if (c.length == rows_ && s.nullable) AppendNull(static_cast<int>(i));
    std::string problem;
    if (c.length == rows_) {
      problem = "has no value (not nullable)";
    } else if (c.length > rows_ + 1) {
      problem = "has two values";
    } else if (!s.nullable && !c.IsValid(rows_)) {
      problem = "is null (not nullable)";
    }
    if (!problem.empty()) {
      RollbackRow();
      return InvalidArgument("column " + s.name + " " + problem, "invalid-row");
    }
  }
  ++rows_;
  return Status::Ok();
}

namespace {

// What an exported struct array owns: the columns' memory and the child structs.
struct ExportedArray {
  std::vector<std::vector<uint8_t>> validity;
  std::vector<std::vector<int32_t>> offsets;
  std::vector<std::string> data;
  std::vector<std::vector<int64_t>> values;
  std::vector<std::array<const void*, 3>> buffers;  // per child
  std::vector<ArrowArray> children;
  std::vector<ArrowArray*> child_ptrs;
  const void* struct_buffers[1] = {nullptr};
};

struct ExportedSchema {
  std::vector<std::string> names;
  std::vector<ArrowSchema> children;
  std::vector<ArrowSchema*> child_ptrs;
};

// Children's memory belongs to the parent: their release only marks them released.
void ReleaseChildArray(ArrowArray* a) { a->release = nullptr; }
void ReleaseChildSchema(ArrowSchema* s) { s->release = nullptr; }

void ReleaseArray(ArrowArray* a) {
  if (a == nullptr || a->release == nullptr) return;
  delete static_cast<ExportedArray*>(a->private_data);
  a->release = nullptr;
}

void ReleaseSchema(ArrowSchema* s) {
  if (s == nullptr || s->release == nullptr) return;
  delete static_cast<ExportedSchema*>(s->private_data);
  s->release = nullptr;
}

const char* Format(ArrowColumnType t) {
  switch (t) {
    case ArrowColumnType::kString:
      return "u";
    case ArrowColumnType::kLong:
      return "l";
    case ArrowColumnType::kTimestamp:
      return "tsu:UTC";
    case ArrowColumnType::kBinary:
      return "z";
  }
  return "u";
}

}  // namespace

void ArrowBatch::Export(ArrowArray* array, ArrowSchema* schema) {
  RollbackRow();  // an unfinished row is not part of the batch
  const size_t n = cols_.size();
  auto* ea = new ExportedArray;
  ea->buffers.resize(n);
  ea->children.resize(n);
  ea->child_ptrs.resize(n);
  ea->validity.resize(n);
  ea->offsets.resize(n);
  ea->data.resize(n);
  ea->values.resize(n);
  for (size_t i = 0; i < n; ++i) {
    Column& c = *cols_[i];
    ea->validity[i] = std::move(c.validity);
    ea->offsets[i] = std::move(c.offsets);
    ea->data[i] = std::move(c.data);
    ea->values[i] = std::move(c.values);
    const void* valid = c.null_count > 0 ? ea->validity[i].data() : nullptr;
    ArrowArray& child = ea->children[i];
    child = ArrowArray{};
    child.length = rows_;
    child.null_count = c.null_count;
    if (c.fixed()) {
      ea->buffers[i] = {valid, ea->values[i].data(), nullptr};
      child.n_buffers = 2;
    } else {
      ea->buffers[i] = {valid, ea->offsets[i].data(), ea->data[i].data()};
      child.n_buffers = 3;
    }
    child.buffers = ea->buffers[i].data();
    child.release = &ReleaseChildArray;  // value-initialized above: the rest is 0 / NULL
    ea->child_ptrs[i] = &child;
  }
  *array = ArrowArray{};
  array->length = rows_;
  array->n_buffers = 1;
  array->buffers = ea->struct_buffers;
  array->n_children = static_cast<int64_t>(n);
  array->children = ea->child_ptrs.data();
  array->release = &ReleaseArray;
  array->private_data = ea;

  auto* es = new ExportedSchema;
  es->names.reserve(n);
  es->children.resize(n);
  es->child_ptrs.resize(n);
  for (size_t i = 0; i < n; ++i) {
    es->names.push_back(specs_[i].name);
    ArrowSchema& child = es->children[i];
    child = ArrowSchema{};
    child.format = Format(specs_[i].type);
    child.name = es->names[i].c_str();
    child.flags = specs_[i].nullable ? ARROW_FLAG_NULLABLE : 0;
    child.release = &ReleaseChildSchema;  // value-initialized above: the rest is 0 / NULL
    es->child_ptrs[i] = &child;
  }
  *schema = ArrowSchema{};
  schema->format = "+s";
  schema->name = "";
  schema->metadata = nullptr;
  schema->flags = 0;
  schema->n_children = static_cast<int64_t>(n);
  schema->children = es->child_ptrs.data();
  schema->dictionary = nullptr;
  schema->release = &ReleaseSchema;
  schema->private_data = es;

  for (size_t i = 0; i < n; ++i) {
    cols_[i] = std::make_unique<Column>();
    cols_[i]->type = specs_[i].type;
  }
  rows_ = 0;
}

// ---- ArrowBatchView --------------------------------------------------------------------------

ArrowBatchView::ArrowBatchView() = default;
ArrowBatchView::~ArrowBatchView() { Release(); }
ArrowBatchView::ArrowBatchView(ArrowBatchView&& o) noexcept
    : array_(std::move(o.array_)), schema_(std::move(o.schema_)), cols_(std::move(o.cols_)), rows_(o.rows_) {
  o.rows_ = 0;
}
ArrowBatchView& ArrowBatchView::operator=(ArrowBatchView&& o) noexcept {
  if (this != &o) {
    Release();
    array_ = std::move(o.array_);
    schema_ = std::move(o.schema_);
    cols_ = std::move(o.cols_);
    rows_ = o.rows_;
    o.rows_ = 0;
  }
  return *this;
}

void ArrowBatchView::Release() {
  if (array_ && array_->release != nullptr) array_->release(array_.get());
  if (schema_ && schema_->release != nullptr) schema_->release(schema_.get());
  array_.reset();
  schema_.reset();
  cols_.clear();
  rows_ = 0;
}

namespace {
const char* FormatOf(ArrowColumnType t) {
  switch (t) {
    case ArrowColumnType::kString: return "u";
    case ArrowColumnType::kBinary: return "z";
    case ArrowColumnType::kLong: return "l";
    case ArrowColumnType::kTimestamp: return "tsu:UTC";
  }
  return "";
}
}  // namespace

Status ArrowBatchView::Import(ArrowArray* array, ArrowSchema* schema, const std::vector<ArrowColumnType>& types) {
  Release();
  // Move first, so that the caller's structs are released on every path.
  array_ = std::make_unique<ArrowArray>(*array);
  schema_ = std::make_unique<ArrowSchema>(*schema);
  array->release = nullptr;
  schema->release = nullptr;
  auto bad = [&](const std::string& why) {
    Release();
    return InvalidArgument("a scanned batch is not what the adapter hands over: " + why);
  };
  if (array_->release == nullptr || schema_->release == nullptr) return bad("released");
  if (schema_->format == nullptr || std::string_view(schema_->format) != "+s") return bad("not a struct");
  if (array_->n_children != static_cast<int64_t>(types.size()) || schema_->n_children != array_->n_children)
    return bad(std::to_string(array_->n_children) + " columns, want " + std::to_string(types.size()));
  if (!types.empty() && (array_->children == nullptr || schema_->children == nullptr)) return bad("no children");
  if (array_->length < 0 || array_->offset != 0) return bad("length or offset");
  rows_ = array_->length;
  for (size_t i = 0; i < types.size(); ++i) {
    const ArrowSchema* cs = schema_->children[i];
    const ArrowArray* ca = array_->children[i];
    if (cs == nullptr || ca == nullptr || cs->format == nullptr) return bad("column " + std::to_string(i));
    if (std::string_view(cs->format) != FormatOf(types[i]))
      return bad("column " + std::to_string(i) + " has format " + cs->format + ", want " + FormatOf(types[i]));
    const bool var = types[i] == ArrowColumnType::kString || types[i] == ArrowColumnType::kBinary;
    if (ca->n_buffers != (var ? 3 : 2) || ca->length < array_->length || ca->offset < 0 || ca->buffers == nullptr)
      return bad("column " + std::to_string(i) + " buffers");
    Col c;
    c.type = types[i];
    c.offset = ca->offset;
    c.validity = ca->null_count == 0 ? nullptr : static_cast<const uint8_t*>(ca->buffers[0]);
    if (var) {
      c.offsets = static_cast<const int32_t*>(ca->buffers[1]);
      c.data = static_cast<const uint8_t*>(ca->buffers[2]);
      if (c.offsets == nullptr && rows_ > 0) return bad("column " + std::to_string(i) + " offsets");
    } else {
      c.data = static_cast<const uint8_t*>(ca->buffers[1]);
      if (c.data == nullptr && rows_ > 0) return bad("column " + std::to_string(i) + " values");
    }
    cols_.push_back(c);
  }
  return Status::Ok();
}

bool ArrowBatchView::IsNull(int col, int64_t row) const {
  const Col& c = cols_[static_cast<size_t>(col)];
  if (c.validity == nullptr) return false;
  const int64_t i = c.offset + row;
  return ((c.validity[i / 8] >> (i % 8)) & 1) == 0;
}

std::string_view ArrowBatchView::Bytes(int col, int64_t row) const {
  if (IsNull(col, row)) return {};
  const Col& c = cols_[static_cast<size_t>(col)];
  const int64_t i = c.offset + row;
  const int32_t b = c.offsets[i], e = c.offsets[i + 1];
  if (c.data == nullptr || e <= b) return {};
  return {reinterpret_cast<const char*>(c.data) + b, static_cast<size_t>(e - b)};
}

int64_t ArrowBatchView::Int64(int col, int64_t row) const {
  if (IsNull(col, row)) return 0;
  const Col& c = cols_[static_cast<size_t>(col)];
  int64_t v;
  std::memcpy(&v, c.data + (c.offset + row) * 8, sizeof v);
  return v;
}

}  // namespace oml::lake
