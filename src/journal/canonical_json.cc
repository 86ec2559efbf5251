#include "journal/canonical_json.h"

namespace oml::journal {
namespace {

Status CheckSubset(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::number_float:
      return InvalidArgument("floating-point numbers are not allowed in signed JSON");
    case nlohmann::json::value_t::binary:
      return InvalidArgument("binary values are not allowed in signed JSON");
    case nlohmann::json::value_t::object:
    case nlohmann::json::value_t::array:
      for (const auto& e : v) OML_RETURN_IF_ERROR(CheckSubset(e));
      return Status::Ok();
    default:
      return Status::Ok();
  }
}

}  // namespace

Result<std::string> Canonicalize(const nlohmann::json& v) {
  OML_RETURN_IF_ERROR(CheckSubset(v));
  try {
    return v.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::strict);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string("not canonicalizable: ") + e.what());
  }
}

Result<nlohmann::json> ParseCanonical(const std::string& bytes) {
  nlohmann::json v = nlohmann::json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return DataLoss("signed bytes are not valid JSON");
  auto again = Canonicalize(v);
  if (!again.ok() || *again != bytes) return DataLoss("signed bytes are not canonical JSON");
  return v;
}

}  // namespace oml::journal
