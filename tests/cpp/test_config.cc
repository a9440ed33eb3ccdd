#include "runtime/config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

namespace hp::shmem {
namespace {

constexpr const char* kHeap = "HYPER_PARALLEL_SHMEM_HEAP_SIZE";
constexpr const char* kTimeout = "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC";
constexpr const char* kLevel = "HYPER_PARALLEL_SHMEM_LOG_LEVEL";
constexpr const char* kDevice = "HYPER_PARALLEL_SHMEM_DEVICE";

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

Result<Config> ParseOne(const char* name, const std::string& value) { return ParseConfig(FakeEnv({{name, value}})); }

void ExpectError(const Result<Config>& result, const std::string& message) {
  ASSERT_FALSE(result.ok()) << "expected failure: " << message;
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(result.status().message(), message);
}

TEST(ConfigTest, DefaultsWhenNothingIsSet) {
  Result<Config> result = ParseConfig(FakeEnv({}));
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->heap_size, std::size_t{1} << 30);
  EXPECT_EQ(result->timeout_sec, 120.0);
  EXPECT_EQ(result->log_level, LogLevel::kWarning);
  EXPECT_EQ(result->device, "host");
  EXPECT_EQ(result->ToString(), "heap_size=1073741824 timeout_sec=120 log_level=2 device=host checks=deferred low_precision_dtype=none");
}

TEST(ConfigTest, ToStringShowsEveryField) {
  Config config;
  config.heap_size = 2 * 1024 * 1024;
  config.timeout_sec = 0.5;
  config.log_level = LogLevel::kDebug;
  EXPECT_EQ(config.ToString(), "heap_size=2097152 timeout_sec=0.5 log_level=0 device=host checks=deferred low_precision_dtype=none");
}

TEST(ConfigTest, ChecksAreDeferredOrStrict) {
  EXPECT_FALSE(ParseConfig(FakeEnv({}))->strict_checks);
  EXPECT_TRUE(ParseConfig(FakeEnv({{"HYPER_PARALLEL_SHMEM_CHECKS", " Strict\n"}}))->strict_checks);
  EXPECT_FALSE(ParseConfig(FakeEnv({{"HYPER_PARALLEL_SHMEM_CHECKS", "deferred"}}))->strict_checks);
  Result<Config> bad = ParseConfig(FakeEnv({{"HYPER_PARALLEL_SHMEM_CHECKS", "always"}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "`HYPER_PARALLEL_SHMEM_CHECKS` must be one of deferred, strict, but got 'always'");
}

TEST(ConfigTest, AllVariablesTogether) {
  Result<Config> result = ParseConfig(
      FakeEnv({{kHeap, "2GiB"}, {kTimeout, "30.25"}, {kLevel, "error"}, {kDevice, "host"}}));
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->heap_size, std::size_t{2} << 30);
  EXPECT_EQ(result->timeout_sec, 30.25);
  EXPECT_EQ(result->log_level, LogLevel::kError);
  EXPECT_EQ(result->device, "host");
}

TEST(ConfigTest, HeapSizeGoodValues) {
  const std::pair<const char*, std::size_t> cases[] = {
      {"1073741824", std::size_t{1} << 30},
      {"1048576", std::size_t{1} << 20},
      {"512M", std::size_t{512} << 20},
      {"512m", std::size_t{512} << 20},
      {"512MB", std::size_t{512} << 20},
      {"512MiB", std::size_t{512} << 20},
      {"512mib", std::size_t{512} << 20},
      {"2048K", std::size_t{2048} << 10},
      {"2048kb", std::size_t{2048} << 10},
      {"2048KiB", std::size_t{2048} << 10},
      {"2G", std::size_t{2} << 30},
      {"2gb", std::size_t{2} << 30},
      {"2GiB", std::size_t{2} << 30},
      {"1024G", std::size_t{1} << 40},
      {" 64M\n", std::size_t{64} << 20},
  };
  for (const auto& [text, bytes] : cases) {
    Result<Config> result = ParseOne(kHeap, text);
    ASSERT_TRUE(result.ok()) << "'" << text << "': " << result.status().ToString();
    EXPECT_EQ(result->heap_size, bytes) << "'" << text << "'";
  }
}

TEST(ConfigTest, HeapSizeBadFormat) {
  const char* bad[] = {"abc", "", "   ", "-5", "-1G", "+5", "5X", "512MM", "512 M", "1.5G", "12abc", "G", "0x100",
                       "1e9", "5T", "1024B"};
  for (const char* text : bad) {
    ExpectError(ParseOne(kHeap, text), std::string("`HYPER_PARALLEL_SHMEM_HEAP_SIZE` must be a byte count such as "
                                                   "1073741824, 512M or 2GiB, but got '") +
                                           text + "'");
  }
}

TEST(ConfigTest, HeapSizeZeroAndOverflow) {
  ExpectError(ParseOne(kHeap, "0"), "`HYPER_PARALLEL_SHMEM_HEAP_SIZE` must be a positive byte count, but got '0'");
  ExpectError(ParseOne(kHeap, "0G"), "`HYPER_PARALLEL_SHMEM_HEAP_SIZE` must be a positive byte count, but got '0G'");
  ExpectError(ParseOne(kHeap, "99999999999999999999999"),
              "`HYPER_PARALLEL_SHMEM_HEAP_SIZE` must be a byte count that fits in 64 bits, but got "
              "'99999999999999999999999'");
  ExpectError(ParseOne(kHeap, "17179869184G"),   // 2^34 GiB = 2^64 bytes
              "`HYPER_PARALLEL_SHMEM_HEAP_SIZE` must be a byte count that fits in 64 bits, but got '17179869184G'");
}

TEST(ConfigTest, HeapSizeRange) {
  ExpectError(ParseOne(kHeap, "1024"), "`HYPER_PARALLEL_SHMEM_HEAP_SIZE` must be at least 1 MiB, but got 1024");
  ExpectError(ParseOne(kHeap, "1048575"),
              "`HYPER_PARALLEL_SHMEM_HEAP_SIZE` must be at least 1 MiB, but got 1048575");
  ExpectError(ParseOne(kHeap, "1025G"),
              "`HYPER_PARALLEL_SHMEM_HEAP_SIZE` must be at most 1 TiB, but got 1100585369600");
  ExpectError(ParseOne(kHeap, "1099511627777"),
              "`HYPER_PARALLEL_SHMEM_HEAP_SIZE` must be at most 1 TiB, but got 1099511627777");
  EXPECT_TRUE(ParseOne(kHeap, "1099511627776").ok());
  EXPECT_TRUE(ParseOne(kHeap, "1M").ok());
}

TEST(ConfigTest, ParseByteSizeNamesTheVariable) {
  Result<std::size_t> ok = ParseByteSize("size", "4KiB");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok.value(), 4096u);
  Result<std::size_t> small = ParseByteSize("size", "1");   // no range check here
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small.value(), 1u);
  Result<std::size_t> bad = ParseByteSize("size", "four");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "`size` must be a byte count such as 1073741824, 512M or 2GiB, but got 'four'");
}

TEST(ConfigTest, TimeoutGoodValues) {
  const std::pair<const char*, double> cases[] = {
      {"120", 120.0}, {"0.5", 0.5}, {".25", 0.25}, {"86400", 86400.0}, {"86400.0", 86400.0}, {"1", 1.0},
      {" 7.5 ", 7.5}, {"0.001", 0.001}, {"1e-3", 0.001}, {"1E3", 1000.0}, {"2.5e+1", 25.0}, {"5.e0", 5.0},
  };
  for (const auto& [text, seconds] : cases) {
    Result<Config> result = ParseOne(kTimeout, text);
    ASSERT_TRUE(result.ok()) << "'" << text << "': " << result.status().ToString();
    EXPECT_DOUBLE_EQ(result->timeout_sec, seconds) << "'" << text << "'";
  }
}

TEST(ConfigTest, TimeoutBadValues) {
  const char* bad[] = {"abc", "", "-1", "-0.5", "0", "0.0", ".", "1.2.3", "inf", "nan", "10s", "+5", "0x10",
                       "e3", "1e", "1e+", ".e1", "1e3.5", "1e-3s", "0e5"};
  for (const char* text : bad) {
    ExpectError(ParseOne(kTimeout, text),
                std::string("`HYPER_PARALLEL_SHMEM_TIMEOUT_SEC` must be a positive number of seconds such as 120, "
                            "0.5 or 1e-3, but got '") +
                    text + "'");
  }
}

TEST(ConfigTest, TimeoutRange) {
  ExpectError(ParseOne(kTimeout, "86400.5"), "`HYPER_PARALLEL_SHMEM_TIMEOUT_SEC` must be at most 86400, but got 86400.5");
  ExpectError(ParseOne(kTimeout, "100000"), "`HYPER_PARALLEL_SHMEM_TIMEOUT_SEC` must be at most 86400, but got 100000");
  // Below a millisecond, in any notation: 0.0000001 was once accepted while 1e-3 was refused.
  ExpectError(ParseOne(kTimeout, "0.0000001"),
              "`HYPER_PARALLEL_SHMEM_TIMEOUT_SEC` must be at least 0.001 (one millisecond), but got 0.0000001");
  ExpectError(ParseOne(kTimeout, "9e-4"),
              "`HYPER_PARALLEL_SHMEM_TIMEOUT_SEC` must be at least 0.001 (one millisecond), but got 9e-4");
  ExpectError(ParseOne(kTimeout, "1e-400"),
              "`HYPER_PARALLEL_SHMEM_TIMEOUT_SEC` must be at least 0.001 (one millisecond), but got 1e-400");
  ExpectError(ParseOne(kTimeout, "1e400"), "`HYPER_PARALLEL_SHMEM_TIMEOUT_SEC` must be at most 86400, but got 1e400");
  ExpectError(ParseOne(kTimeout, "8.7e4"), "`HYPER_PARALLEL_SHMEM_TIMEOUT_SEC` must be at most 86400, but got 8.7e4");
  const std::string huge(400, '9');
  ExpectError(ParseOne(kTimeout, huge), "`HYPER_PARALLEL_SHMEM_TIMEOUT_SEC` must be at most 86400, but got " + huge);
}

TEST(ConfigTest, LogLevelGoodValues) {
  const std::pair<const char*, LogLevel> cases[] = {
      {"0", LogLevel::kDebug},     {"1", LogLevel::kInfo},       {"2", LogLevel::kWarning},
      {"3", LogLevel::kError},     {"DEBUG", LogLevel::kDebug},  {"info", LogLevel::kInfo},
      {"Warning", LogLevel::kWarning}, {"eRRoR", LogLevel::kError}, {" debug\n", LogLevel::kDebug},
  };
  for (const auto& [text, level] : cases) {
    Result<Config> result = ParseOne(kLevel, text);
    ASSERT_TRUE(result.ok()) << "'" << text << "': " << result.status().ToString();
    EXPECT_EQ(result->log_level, level) << "'" << text << "'";
  }
}

TEST(ConfigTest, LogLevelBadValues) {
  const char* bad[] = {"4", "-1", "", "verbose", "warn", "02", "1.0", "DEBUGX"};
  for (const char* text : bad) {
    ExpectError(ParseOne(kLevel, text),
                std::string("`HYPER_PARALLEL_SHMEM_LOG_LEVEL` must be one of 0, 1, 2, 3, DEBUG, INFO, WARNING, ERROR, "
                            "but got '") +
                    text + "'");
  }
}

TEST(ConfigTest, DeviceValues) {
  for (const char* text : {"host", "ascend", " ascend\n"}) {
    Result<Config> good = ParseOne(kDevice, text);
    ASSERT_TRUE(good.ok()) << "'" << text << "': " << good.status().ToString();
  }
  EXPECT_EQ(ParseOne(kDevice, "host")->device, "host");
  EXPECT_EQ(ParseOne(kDevice, " ascend\n")->device, "ascend");
  for (const char* text : {"npu", "", "cuda", "HOSTS", "Ascend"}) {
    ExpectError(ParseOne(kDevice, text),
                std::string("`HYPER_PARALLEL_SHMEM_DEVICE` must be one of host, ascend, but got '") + text + "'");
  }
}

TEST(ConfigTest, TlsInfoIsPassedOnAsIsAndUnsetMeansOff) {
  Result<Config> unset = ParseConfig(FakeEnv({}));
  ASSERT_TRUE(unset.ok());
  EXPECT_EQ(unset->tls_info, "");
  const std::string settings = "tls.enable=true;tls.ca.path=/etc/ca;";
  Result<Config> set = ParseOne("HYPER_PARALLEL_SHMEM_TLS_INFO", settings.c_str());
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->tls_info, settings);
  // Key material stays out of logs and debug_state.
  EXPECT_EQ(set->ToString().find("tls"), std::string::npos);
}

TEST(ConfigTest, FirstBadVariableFailsTheWholeParse) {
  Result<Config> result = ParseConfig(FakeEnv({{kHeap, "64M"}, {kLevel, "loud"}}));
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("`HYPER_PARALLEL_SHMEM_LOG_LEVEL`"), std::string::npos);
}

TEST(ConfigTest, HeapSizeAliasIsReadAndAConflictIsAnError) {
  constexpr const char* kAlias = "SYMMETRIC_MEMORY_HEAP_SIZE";
  Result<Config> alias = ParseOne(kAlias, "48M");
  ASSERT_TRUE(alias.ok()) << alias.status().ToString();
  EXPECT_EQ(alias->heap_size, std::size_t{48} << 20);
  EXPECT_EQ(alias->heap_size_source, kAlias);
  EXPECT_EQ(ParseConfig(FakeEnv({}))->heap_size_source, "default");
  EXPECT_EQ(ParseOne(kHeap, "2M")->heap_size_source, kHeap);
  Result<Config> both = ParseConfig(FakeEnv({{kAlias, "64M"}, {kHeap, "64M"}}));
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(both->heap_size, std::size_t{64} << 20);
  ExpectError(ParseConfig(FakeEnv({{kAlias, "48M"}, {kHeap, "32M"}})),
              "`SYMMETRIC_MEMORY_HEAP_SIZE` must equal `HYPER_PARALLEL_SHMEM_HEAP_SIZE` when both are set, but got "
              "'48M' and '32M'");
  ExpectError(ParseOne(kAlias, "12Q"),
              "`SYMMETRIC_MEMORY_HEAP_SIZE` must be a byte count such as 1073741824, 512M or 2GiB, but got '12Q'");
  ExpectError(ParseOne(kAlias, "1K"), "`SYMMETRIC_MEMORY_HEAP_SIZE` must be at least 1 MiB, but got 1024");
}

constexpr const char* kLow = "SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE";

// The default wire format of a configuration parsed from the environment `env`.
Result<std::optional<ops::LowFormat>> DefaultUnder(std::map<std::string, std::string> env) {
  Result<Config> config = ParseConfig(FakeEnv(std::move(env)));
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return LowPrecisionDefault(*config);
}

TEST(ConfigTest, LowPrecisionDefaultIsReadWithTheRestAndCheckedWhenTaken) {
  Result<std::optional<ops::LowFormat>> unset = DefaultUnder({});
  ASSERT_TRUE(unset.ok());
  EXPECT_FALSE(unset->has_value());
  for (const char* off : {"", "none", " NONE "}) {
    Result<std::optional<ops::LowFormat>> value = DefaultUnder({{kLow, off}});
    ASSERT_TRUE(value.ok()) << off;
    EXPECT_FALSE(value->has_value()) << off;
  }
  const std::pair<const char*, ops::LowFormat> names[] = {
      {"bfloat16", ops::LowFormat::kBFloat16}, {" Float8_E4M3FN ", ops::LowFormat::kFloat8E4M3Fn},
      {"torch.float16", ops::LowFormat::kFloat16}, {"mindspore.float8_e5m2", ops::LowFormat::kFloat8E5M2}};
  for (const auto& [text, format] : names) {
    Result<std::optional<ops::LowFormat>> value = DefaultUnder({{kLow, text}});
    ASSERT_TRUE(value.ok()) << text;
    EXPECT_EQ(**value, format) << text;
  }
  // A bad name does not fail the configuration: only the calls that take the default.
  Result<Config> bad = ParseOne(kLow, "float7");
  ASSERT_TRUE(bad.ok()) << bad.status().ToString();
  EXPECT_EQ(bad->ToString(), "heap_size=1073741824 timeout_sec=120 log_level=2 device=host checks=deferred "
                             "low_precision_dtype='float7'");
  Result<std::optional<ops::LowFormat>> refused = LowPrecisionDefault(*bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(), "`SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE` must be one of float16, bfloat16, "
                                        "float8_e4m3fn, float8_e5m2 or 'none', but got 'float7'");
}

TEST(ConfigTest, AnInitsHeapSizeOverridesTheEnvironmentsWithinTheSameLimits) {
  Result<Config> config = ConfigForInit(std::size_t{3} << 20);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->heap_size, std::size_t{3} << 20);
  EXPECT_EQ(config->heap_size_source, "heap_size_bytes");
  Result<Config> small = ConfigForInit(4096);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().message(), "`heap_size_bytes` must be at least 1 MiB, but got 4096");
}

TEST(ConfigTest, ProcessEnvReadsTheRealEnvironment) {
  EnvLookup env = ProcessEnv();
  ASSERT_EQ(::setenv("HP_SHMEM_TEST_CONFIG_VAR", "hello", 1), 0);
  EXPECT_EQ(env("HP_SHMEM_TEST_CONFIG_VAR"), std::optional<std::string>("hello"));
  ASSERT_EQ(::unsetenv("HP_SHMEM_TEST_CONFIG_VAR"), 0);
  EXPECT_EQ(env("HP_SHMEM_TEST_CONFIG_VAR"), std::nullopt);

  ASSERT_EQ(::setenv(kLevel, "info", 1), 0);
  Result<Config> result = ParseConfig(ProcessEnv());
  ::unsetenv(kLevel);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->log_level, LogLevel::kInfo);
}

}  // namespace
}  // namespace hp::shmem
