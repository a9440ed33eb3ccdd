#include "runtime/config.h"

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <system_error>

namespace hp::shmem {
namespace {

constexpr const char* kHeapSizeVar = "HYPER_PARALLEL_SHMEM_HEAP_SIZE";
constexpr const char* kTimeoutVar = "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC";
constexpr const char* kLogLevelVar = "HYPER_PARALLEL_SHMEM_LOG_LEVEL";
constexpr const char* kDeviceVar = "HYPER_PARALLEL_SHMEM_DEVICE";
constexpr const char* kTlsInfoVar = "HYPER_PARALLEL_SHMEM_TLS_INFO";
constexpr const char* kChecksVar = "HYPER_PARALLEL_SHMEM_CHECKS";
constexpr const char* kHeapSizeAliasVar = "SYMMETRIC_MEMORY_HEAP_SIZE";
constexpr const char* kLowPrecisionVar = "SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE";
// The user API's order, which its messages list.
constexpr ops::LowFormat kLowPrecisionFormats[] = {ops::LowFormat::kFloat16, ops::LowFormat::kBFloat16,
                                                   ops::LowFormat::kFloat8E4M3Fn, ops::LowFormat::kFloat8E5M2};

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kTiB = std::size_t{1} << 40;
constexpr double kMaxTimeoutSec = 86400.0;
constexpr double kMinTimeoutSec = 0.001;
constexpr const char* kMinTimeoutText = "at least 0.001 (one millisecond)";

bool IsSpace(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Surrounding whitespace (a stray newline from a shell) is not part of the value.
std::string Trim(const std::string& text) {
  std::size_t begin = 0;
  std::size_t end = text.size();
  while (begin < end && IsSpace(text[begin])) ++begin;
  while (end > begin && IsSpace(text[end - 1])) --end;
  return text.substr(begin, end - begin);
}

std::string Lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string Broken(const std::string& name, const std::string& what, const std::string& got) {
  return "`" + name + "` must be " + what + ", but got " + got;
}

std::string Quoted(const std::string& text) { return "'" + text + "'"; }

// Shortest text that reads back as the same double: 120 -> "120", 0.5 -> "0.5".
std::string FormatDouble(double value) {
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  if (ec != std::errc()) return std::to_string(value);
  return std::string(buffer, end);
}

Result<double> ParseTimeout(const std::string& text) {
  const std::string what = "a positive number of seconds such as 120, 0.5 or 1e-3";
  const std::string value = Trim(text);
  // Decimal, optionally with an exponent: digits with at most one '.', then e/E, an optional sign and digits.
  // No leading sign, inf, nan or hex: from_chars alone would take some of those.
  std::size_t pos = 0;
  std::size_t mantissa_digits = 0;
  while (pos < value.size() && IsDigit(value[pos])) ++pos, ++mantissa_digits;
  if (pos < value.size() && value[pos] == '.') {
    ++pos;
    while (pos < value.size() && IsDigit(value[pos])) ++pos, ++mantissa_digits;
  }
  if (mantissa_digits > 0 && pos < value.size() && (value[pos] == 'e' || value[pos] == 'E')) {
    ++pos;
    if (pos < value.size() && (value[pos] == '+' || value[pos] == '-')) ++pos;
    const std::size_t exponent_start = pos;
    while (pos < value.size() && IsDigit(value[pos])) ++pos;
    if (pos == exponent_start) mantissa_digits = 0;   // "1e" or "1e+": not a number
  }
  if (mantissa_digits == 0 || pos != value.size()) return InvalidArgument(Broken(kTimeoutVar, what, Quoted(text)));
  double seconds = 0.0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), seconds, std::chars_format::general);
  if (ec == std::errc::result_out_of_range) {
    // Too large for a double, or a nonzero value too small for one.
    const bool tiny = value.find_first_of("-") != std::string::npos;
    return InvalidArgument(Broken(kTimeoutVar, tiny ? kMinTimeoutText : "at most 86400", value));
  }
  if (ec != std::errc() || end != value.data() + value.size()) {
    return InvalidArgument(Broken(kTimeoutVar, what, Quoted(text)));
  }
  if (!(seconds > 0.0)) return InvalidArgument(Broken(kTimeoutVar, what, Quoted(text)));
  // Below a millisecond every wait would time out before a peer could answer: a typo, not a setting.
  if (seconds < kMinTimeoutSec) return InvalidArgument(Broken(kTimeoutVar, kMinTimeoutText, value));
  if (seconds > kMaxTimeoutSec) return InvalidArgument(Broken(kTimeoutVar, "at most 86400", value));
  return seconds;
}

Result<LogLevel> ParseLogLevel(const std::string& text) {
  const std::string value = Lower(Trim(text));
  if (value == "0" || value == "debug") return LogLevel::kDebug;
  if (value == "1" || value == "info") return LogLevel::kInfo;
  if (value == "2" || value == "warning") return LogLevel::kWarning;
  if (value == "3" || value == "error") return LogLevel::kError;
  return InvalidArgument(
      Broken(kLogLevelVar, "one of 0, 1, 2, 3, DEBUG, INFO, WARNING, ERROR", Quoted(text)));
}

// A heap size within the runtime's limits; `name` is what the caller called it.
Result<std::size_t> CheckedHeapSize(const char* name, std::size_t heap_size) {
  if (heap_size < kMiB) return InvalidArgument(Broken(name, "at least 1 MiB", std::to_string(heap_size)));
  if (heap_size > kTiB) return InvalidArgument(Broken(name, "at most 1 TiB", std::to_string(heap_size)));
  return heap_size;
}

Result<std::string> ParseDevice(const std::string& text) {
  const std::string value = Trim(text);
  if (value == "host" || value == "ascend") return value;
  return InvalidArgument(Broken(kDeviceVar, "one of host, ascend", Quoted(text)));
}

}  // namespace

std::string Config::ToString() const {
  return "heap_size=" + std::to_string(heap_size) + " timeout_sec=" + FormatDouble(timeout_sec) +
         " log_level=" + std::to_string(static_cast<int>(log_level)) + " device=" + device +
         " checks=" + (strict_checks ? "strict" : "deferred") + " low_precision_dtype=" +
         (low_precision_dtype.empty() ? std::string("none") : Quoted(low_precision_dtype));
}

EnvLookup ProcessEnv() {
  return [](const char* name) -> std::optional<std::string> {
    const char* value = std::getenv(name);
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

Result<std::size_t> ParseByteSize(const std::string& name, const std::string& text) {
  const std::string what = "a byte count such as 1073741824, 512M or 2GiB";
  const std::string value = Trim(text);
  std::size_t pos = 0;
  while (pos < value.size() && IsDigit(value[pos])) ++pos;
  if (pos == 0) return InvalidArgument(Broken(name, what, Quoted(text)));

  const std::string suffix = Lower(value.substr(pos));
  unsigned shift = 0;
  if (suffix.empty()) {
    shift = 0;
  } else if (suffix == "k" || suffix == "kb" || suffix == "kib") {
    shift = 10;
  } else if (suffix == "m" || suffix == "mb" || suffix == "mib") {
    shift = 20;
  } else if (suffix == "g" || suffix == "gb" || suffix == "gib") {
    shift = 30;
  } else {
    return InvalidArgument(Broken(name, what, Quoted(text)));
  }

  std::size_t count = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + pos, count);
  const bool too_big = ec == std::errc::result_out_of_range ||
                       (ec == std::errc() && count > (std::numeric_limits<std::size_t>::max() >> shift));
  if (too_big) return InvalidArgument(Broken(name, "a byte count that fits in 64 bits", Quoted(text)));
  if (ec != std::errc() || end != value.data() + pos) return InvalidArgument(Broken(name, what, Quoted(text)));
  if (count == 0) return InvalidArgument(Broken(name, "a positive byte count", Quoted(text)));
  return count << shift;
}

Result<Config> ParseConfig(const EnvLookup& env) {
  Config config;
  std::optional<std::string> heap_text = env(kHeapSizeVar);
  const char* heap_name = kHeapSizeVar;
  if (std::optional<std::string> alias = env(kHeapSizeAliasVar)) {
    if (heap_text.has_value() && *heap_text != *alias) {
      return InvalidArgument(std::string("`") + kHeapSizeAliasVar + "` must equal `" + kHeapSizeVar +
                             "` when both are set, but got " + Quoted(*alias) + " and " + Quoted(*heap_text));
    }
    heap_text = alias;
    heap_name = kHeapSizeAliasVar;
  }
  if (heap_text.has_value()) {
    HP_ASSIGN_OR_RETURN(const std::size_t heap_size, ParseByteSize(heap_name, *heap_text));
    HP_ASSIGN_OR_RETURN(config.heap_size, CheckedHeapSize(heap_name, heap_size));
    config.heap_size_source = heap_name;
  }
  if (auto text = env(kTimeoutVar)) {
    HP_ASSIGN_OR_RETURN(config.timeout_sec, ParseTimeout(*text));
  }
  if (auto text = env(kLogLevelVar)) {
    HP_ASSIGN_OR_RETURN(config.log_level, ParseLogLevel(*text));
  }
  if (auto text = env(kDeviceVar)) {
    HP_ASSIGN_OR_RETURN(config.device, ParseDevice(*text));
  }
  if (auto text = env(kTlsInfoVar)) config.tls_info = *text;   // the ascend device refuses a non-empty value
  if (auto text = env(kChecksVar)) {
    const std::string checks = Lower(Trim(*text));
    if (checks != "deferred" && checks != "strict") {
      return InvalidArgument(Broken(kChecksVar, "one of deferred, strict", Quoted(*text)));
    }
    config.strict_checks = checks == "strict";
  }
  if (auto text = env(kLowPrecisionVar)) config.low_precision_dtype = *text;   // checked by LowPrecisionDefault
  return config;
}

Result<Config> ConfigForInit(std::size_t heap_size_override) {
  HP_ASSIGN_OR_RETURN(Config config, ParseConfig(ProcessEnv()));
  if (heap_size_override != 0) {
    HP_ASSIGN_OR_RETURN(config.heap_size, CheckedHeapSize("heap_size_bytes", heap_size_override));
    config.heap_size_source = "heap_size_bytes";
  }
  return config;
}

Result<std::optional<ops::LowFormat>> LowPrecisionDefault(const Config& config) {
  std::string name = Lower(Trim(config.low_precision_dtype));
  if (name.empty() || name == "none") return std::optional<ops::LowFormat>();
  for (const char* prefix : {"torch.", "mindspore."}) {
    if (name.rfind(prefix, 0) == 0) name = name.substr(std::char_traits<char>::length(prefix));
  }
  std::string names;
  for (const ops::LowFormat format : kLowPrecisionFormats) {
    if (name == ops::LowFormatName(format)) return std::optional<ops::LowFormat>(format);
    names += std::string(names.empty() ? "" : ", ") + ops::LowFormatName(format);
  }
  return InvalidArgument(
      Broken(kLowPrecisionVar, "one of " + names + " or 'none'", Quoted(config.low_precision_dtype)));
}

}  // namespace hp::shmem
