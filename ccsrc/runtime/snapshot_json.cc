// The debug snapshot (and its configuration) as one JSON document: the one serialization every handler reads (the C
// ABI returns it, the torch binding parses it), with the keys core/multicore/snapshot.py projects into debug_state().
#include "runtime/json_writer.h"
#include "runtime/runtime.h"

namespace hp::shmem {

namespace {

void WriteAllocations(JsonWriter& json, const char* key, const std::vector<AllocationInfo>& allocations) {
  json.Key(key);
  json.BeginArray();
  for (const AllocationInfo& info : allocations) {
    json.BeginObject();
    // Where it is first, then what it belongs to: the order debug_state() has always printed.
    json.Key("allocation_id");
    json.Unsigned(info.id);
    json.Key("base");
    json.Unsigned(info.base);
    json.Key("offset");
    json.Unsigned(info.offset);
    json.Key("bytes");
    json.Unsigned(info.bytes);
    json.Key("reserved");
    json.Unsigned(info.reserved);
    json.Key("lifecycle");
    json.Unsigned(info.lifecycle);
    json.Key("state");
    json.String(AllocationStateName(info.state));
    json.Key("call_site");
    json.String(info.call_site);
    json.EndObject();
  }
  json.EndArray();
}

void WriteConfig(JsonWriter& json, const Config& config) {
  json.BeginObject();
  json.Key("heap_size");
  json.Unsigned(config.heap_size);
  json.Key("heap_size_source");
  json.String(config.heap_size_source);
  json.Key("timeout_sec");
  json.Double(config.timeout_sec);
  json.Key("log_level");
  json.Signed(static_cast<int>(config.log_level));
  json.Key("device");
  json.String(config.device);
  json.Key("checks");
  json.String(config.strict_checks ? "strict" : "deferred");
  json.Key("low_precision_dtype");
  json.String(config.low_precision_dtype);
  json.EndObject();
}

}  // namespace

std::string ConfigJson(const Config& config) {
  JsonWriter json;
  WriteConfig(json, config);
  return json.text();
}

std::string SnapshotJson(const DebugSnapshot& s) {
  JsonWriter json;
  json.BeginObject();
  json.Key("state");
  json.String(LifecycleStateName(s.state));
  json.Key("lifecycle");
  json.Unsigned(s.lifecycle);
  json.Key("rank");
  json.Signed(s.rank);
  json.Key("world_size");
  json.Signed(s.world_size);
  json.Key("device");
  json.String(s.device);
  json.Key("config");
  WriteConfig(json, s.config);
  json.Key("heap_base");
  json.Unsigned(s.heap_base);
  json.Key("heap_size");
  json.Unsigned(s.heap_size);
  json.Key("allocated");
  json.Unsigned(s.allocated);
  json.Key("max_allocated");
  json.Unsigned(s.max_allocated);
  json.Key("remaining");
  json.Unsigned(s.remaining);
  WriteAllocations(json, "active_allocations", s.active);
  WriteAllocations(json, "leaked_allocations", s.leaked);
  json.Key("latest_failure");
  json.String(s.latest_failure);
  json.Key("calls_in_flight");
  json.Unsigned(s.in_flight);
  json.Key("live_teams");
  json.Unsigned(s.live_teams);
  json.Key("reaches_peer_memory");
  json.Bool(s.reaches_peer_memory);
  json.Key("nodes");
  json.BeginArray();
  for (const int node : s.nodes) json.Signed(node);
  json.EndArray();
  json.Key("transports");
  json.BeginArray();
  for (const std::string& transport : s.transports) json.String(transport);
  json.EndArray();
  json.EndObject();
  return json.text();
}

}  // namespace hp::shmem
