#include "common/log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <ctime>

namespace oml::log {
namespace {

std::shared_ptr<spdlog::logger> Logger() {
  static std::shared_ptr<spdlog::logger> l = [] {
    auto lg = spdlog::stderr_logger_mt("oml");
    lg->set_pattern("%v");
    return lg;
  }();
  return l;
}

std::string NowUtc() {
  auto now = std::chrono::system_clock::now();
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  std::time_t secs = us / 1000000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[64];
  std::snprintf(out, sizeof out, "%s.%06lldZ", buf, static_cast<long long>(us % 1000000));
  return out;
}

void Emit(spdlog::level::level_enum lvl, const char* name, const std::string& msg, nlohmann::json fields) {
  auto lg = Logger();
  if (!lg->should_log(lvl)) return;
  nlohmann::json j = nlohmann::json::object();
  j["ts"] = NowUtc();
  j["level"] = name;
  j["msg"] = msg;
  if (fields.is_object()) for (auto& [k, v] : fields.items()) j[k] = v;
  lg->log(lvl, "{}", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

}  // namespace

void Init(const std::string& level) {
  auto lg = Logger();
  lg->set_level(spdlog::level::from_str(level));
  lg->flush_on(spdlog::level::info);
}

void Info(const std::string& m, nlohmann::json f) { Emit(spdlog::level::info, "info", m, std::move(f)); }
void Warn(const std::string& m, nlohmann::json f) { Emit(spdlog::level::warn, "warn", m, std::move(f)); }
void Error(const std::string& m, nlohmann::json f) { Emit(spdlog::level::err, "error", m, std::move(f)); }
void Debug(const std::string& m, nlohmann::json f) { Emit(spdlog::level::debug, "debug", m, std::move(f)); }

}  // namespace oml::log
