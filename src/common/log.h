// Structured logging: one JSON object per line on stderr, through spdlog.
//
//   {"ts":"2026-11-30T02:34:00.123456Z","level":"info","msg":"commit","tenant":"...","seq":7}
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace oml::log {

// Configures the process-wide logger. level: trace|debug|info|warn|error. Thread-safe after.
void Init(const std::string& level);

void Info(const std::string& msg, nlohmann::json fields = nlohmann::json::object());
void Warn(const std::string& msg, nlohmann::json fields = nlohmann::json::object());
void Error(const std::string& msg, nlohmann::json fields = nlohmann::json::object());
void Debug(const std::string& msg, nlohmann::json fields = nlohmann::json::object());

}  // namespace oml::log
