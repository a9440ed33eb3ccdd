// The collective engine's cases, written once and run on every device: threads as ranks, buffers the host may not
// touch (the ascend fakes' heap and NPU memory are reached only through copies).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/runtime.h"
#include "test_support.h"
#include "thread_bootstrap.h"

namespace hp::shmem::testutil {

// How a case reaches a device's memory from the host, and makes the device.
struct CollectiveBackend {
  std::function<std::unique_ptr<Device>()> make_device;
  std::function<Config()> config;
  std::function<void*(std::size_t)> alloc_local;   // memory outside the heap, as a framework tensor holds it
  std::function<void(void*)> free_local;
  std::function<void(void*, const void*, std::size_t)> write;   // host -> device memory (heap or local)
  std::function<void(void*, const void*, std::size_t)> read;    // device memory -> host
  std::function<void(int rank)> enter_rank = [](int) {};
};

// A team over a subset of the world, with every world rank calling AllGather at once: each rank keeps its group's
// rows (splitting the world, as a framework's new_group would on every rank).
class SplitBootstrap final : public Bootstrap {
 public:
  SplitBootstrap(Bootstrap& world, std::vector<int> members)
      : world_(world), members_(std::move(members)) {}
  int rank() const override {
    for (std::size_t i = 0; i < members_.size(); ++i) {
      if (members_[i] == world_.rank()) return static_cast<int>(i);
    }
    return -1;
  }
  int world_size() const override { return static_cast<int>(members_.size()); }
  Status AllGather(const void* in, std::size_t bytes, void* out) override {
    std::vector<char> all(bytes * static_cast<std::size_t>(world_.world_size()));
    HP_RETURN_IF_ERROR(world_.AllGather(in, bytes, all.data()));
    for (std::size_t i = 0; i < members_.size(); ++i) {
      std::memcpy(static_cast<char*>(out) + i * bytes, all.data() + static_cast<std::size_t>(members_[i]) * bytes, bytes);
    }
    return Status::Ok();
  }
  Status Barrier() override { return world_.Barrier(); }

 private:
  Bootstrap& world_;
  std::vector<int> members_;
};

inline ElementType Float32() { return ElementType{"float32", 4, true, DataType::kFloat32}; }
inline ElementType Int32() { return ElementType{"int32", 4, true, DataType::kInt32}; }
inline ElementType Int64() { return ElementType{"int64", 8, true, DataType::kInt64}; }

inline std::vector<int> AllPes(int world) {
  std::vector<int> pes(static_cast<std::size_t>(world));
  for (int i = 0; i < world; ++i) pes[static_cast<std::size_t>(i)] = i;
  return pes;
}

// A float32 buffer in device memory: symmetric (from the runtime) or local.
class DeviceFloats {
 public:
  DeviceFloats(const CollectiveBackend& backend, Runtime& runtime, std::size_t count, bool symmetric)
      : backend_(backend), runtime_(runtime), count_(count) {
    if (symmetric) {
      auto info = runtime.Allocate(std::max<std::size_t>(count * 4, 4), 64, "test");
      EXPECT_TRUE(info.ok()) << info.status().ToString();
      allocation_ = info->id;
      data_ = reinterpret_cast<void*>(info->base);
    } else {
      data_ = backend.alloc_local(std::max<std::size_t>(count * 4, 4));
    }
  }
  ~DeviceFloats() {
    if (allocation_ != 0) {
      EXPECT_TRUE(runtime_.Free(allocation_, "test").ok());
    } else {
      backend_.free_local(data_);
    }
  }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  void* data() const { return data_; }
  float* at(std::size_t i) const { return static_cast<float*>(data_) + i; }
  std::size_t bytes() const { return count_ * 4; }
  // No copy of nothing: an empty vector has no data pointer to pass.
  void Set(const std::vector<float>& values) const {
    if (!values.empty()) backend_.write(data_, values.data(), values.size() * 4);
  }
  std::vector<float> Get() const {
    std::vector<float> values(count_);
    if (count_ > 0) backend_.read(values.data(), data_, count_ * 4);
    return values;
  }

 private:
  const CollectiveBackend& backend_;
  Runtime& runtime_;
  std::size_t count_;
  std::uint64_t allocation_ = 0;
  void* data_ = nullptr;
};

// Runs body(rank, runtime, root team) on `world` thread-ranks of a runtime on the backend's device, then releases the
// team and shuts the runtime down.
template <typename Body>
void RunOnRootTeam(const CollectiveBackend& backend, int world, Body&& body) {
  RunRanks(world, [&](int rank, Bootstrap& bootstrap) {
    backend.enter_rank(rank);
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(backend.config(), backend.make_device(), bootstrap)));
    auto team = runtime.CreateTeam(AllPes(world), bootstrap);
    ASSERT_TRUE(team.ok()) << team.status().ToString();
    body(rank, runtime, team.value());
    EXPECT_TRUE(IsOk(runtime.ReleaseTeam(team.value())));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

// Values that sum exactly in any order: small integers.
inline float Value(int rank, std::size_t i) { return static_cast<float>((rank + 1) * 3 + static_cast<int>(i % 97)); }

// Every collective against values computed here, on the small (one step), copy-free and staged paths.
inline void RunEveryCollective(const CollectiveBackend& backend, int world) {
  RunOnRootTeam(backend, world, [&](int rank, Runtime& runtime, std::uint64_t t) {
    const auto n = static_cast<std::size_t>(world);
    for (std::size_t count : {std::size_t{24}, std::size_t{40000}}) {   // 96 B (one step) and 160 KB
      for (bool symmetric : {false, true}) {
        SCOPED_TRACE("count=" + std::to_string(count) + " symmetric=" + std::to_string(symmetric));
        // all_reduce (sum, in place)
        DeviceFloats tensor(backend, runtime, count, symmetric);
        std::vector<float> mine(count), sum(count, 0.0f);
        for (std::size_t i = 0; i < count; ++i) {
          mine[i] = Value(rank, i);
          for (int r = 0; r < world; ++r) sum[i] += Value(r, i);
        }
        tensor.Set(mine);
        ASSERT_TRUE(IsOk(runtime.AllReduce(t, tensor.data(), tensor.bytes(), DataType::kFloat32, ReduceOp::kSum,
                                           kDefaultStream, nullptr)));
        EXPECT_EQ(tensor.Get(), sum);
        // all_reduce out of place: into `reduced` (symmetric or not), `values` (ordinary) left as it was
        {
          DeviceFloats values(backend, runtime, count, false);
          DeviceFloats reduced(backend, runtime, count, symmetric);
          values.Set(mine);
          reduced.Set(std::vector<float>(count, -1.0f));
          ASSERT_TRUE(IsOk(runtime.AllReduce(t, reduced.data(), reduced.bytes(), DataType::kFloat32, ReduceOp::kSum,
                                             kDefaultStream, nullptr, std::nullopt, values.data())));
          EXPECT_EQ(reduced.Get(), sum);
          EXPECT_EQ(values.Get(), mine);
        }
        // all_gather
        DeviceFloats input(backend, runtime, count, false);
        DeviceFloats output(backend, runtime, count * n, symmetric);
        input.Set(mine);
        ASSERT_TRUE(IsOk(runtime.AllGather(t, output.data(), output.bytes(), input.data(), input.bytes(), Float32(),
                                           kDefaultStream, nullptr)));
        std::vector<float> gathered;
        for (int r = 0; r < world; ++r) {
          for (std::size_t i = 0; i < count; ++i) gathered.push_back(Value(r, i));
        }
        EXPECT_EQ(output.Get(), gathered);
        // reduce_scatter of every rank's gathered copy (scaled by its rank + 1)
        DeviceFloats whole(backend, runtime, count * n, symmetric);
        DeviceFloats part(backend, runtime, count, false);
        std::vector<float> scaled(gathered);
        for (float& v : scaled) v *= static_cast<float>(rank + 1);
        whole.Set(scaled);
        ASSERT_TRUE(IsOk(runtime.ReduceScatter(t, part.data(), part.bytes(), whole.data(), whole.bytes(),
                                               DataType::kFloat32, ReduceOp::kSum, kDefaultStream, nullptr)));
        std::vector<float> expected(count);
        const float factor = static_cast<float>(world * (world + 1) / 2);
        for (std::size_t i = 0; i < count; ++i) expected[i] = gathered[static_cast<std::size_t>(rank) * count + i] * factor;
        EXPECT_EQ(part.Get(), expected);
        // all_to_all with uneven parts: rank i sends (i + j + 1) * count / 8 elements to rank j
        auto length = [&](int from, int to) { return static_cast<std::size_t>(from + to + 1) * count / 8; };
        std::vector<std::unique_ptr<DeviceFloats>> sends;
        std::vector<std::pair<const void*, std::size_t>> send_views;
        std::vector<std::uint64_t> receive_counts;
        std::size_t receive_total = 0;
        std::vector<float> received_expected;
        for (int j = 0; j < world; ++j) {
          std::vector<float> values(length(rank, j));
          for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(rank * 1000 + j * 100) + Value(rank, i);
          sends.push_back(std::make_unique<DeviceFloats>(backend, runtime, values.size(), false));
          sends.back()->Set(values);
          send_views.emplace_back(sends.back()->data(), values.size() * 4);
          receive_counts.push_back(length(j, rank));
          receive_total += length(j, rank);
          for (std::size_t i = 0; i < length(j, rank); ++i) {
            received_expected.push_back(static_cast<float>(j * 1000 + rank * 100) + Value(j, i));
          }
        }
        std::size_t largest_total = 0;   // a symmetric buffer has one size on every rank
        for (int r = 0; r < world; ++r) {
          std::size_t total = 0;
          for (int j = 0; j < world; ++j) total += length(j, r);
          largest_total = std::max(largest_total, total);
        }
        DeviceFloats receive(backend, runtime, largest_total, symmetric);
        ASSERT_TRUE(IsOk(runtime.AllToAll(t, send_views, receive.data(), receive.bytes(), receive_counts, Float32(),
                                          kDefaultStream, nullptr)));
        std::vector<float> received = receive.Get();
        received.resize(receive_total);
        EXPECT_EQ(received, received_expected);
        // send/recv around the ring
        if (world > 1) {
          DeviceFloats message(backend, runtime, count, false);
          DeviceFloats arrived(backend, runtime, count, false);
          message.Set(mine);
          const int next = (rank + 1) % world;
          const int previous = (rank + world - 1) % world;
          // Rank 0 starts the ring: a message larger than the mailbox's window waits for its receiver.
          if (rank == 0) {
            ASSERT_TRUE(IsOk(runtime.Send(t, message.data(), message.bytes(), Float32(), next, kDefaultStream, nullptr)));
          }
          ASSERT_TRUE(IsOk(runtime.Recv(t, arrived.data(), arrived.bytes(), Float32(), previous, kDefaultStream, nullptr)));
          if (rank != 0) {
            ASSERT_TRUE(IsOk(runtime.Send(t, message.data(), message.bytes(), Float32(), next, kDefaultStream, nullptr)));
          }
          std::vector<float> theirs(count);
          for (std::size_t i = 0; i < count; ++i) theirs[i] = Value(previous, i);
          EXPECT_EQ(arrived.Get(), theirs);
        }
        ASSERT_TRUE(IsOk(runtime.TeamBarrier(t, kDefaultStream)));
      }
    }
  });
}

// all_to_all on every path against values computed here: parts that travel with the counts (one step), staged pieces,
// pushes into a symmetric receive buffer, in place (the sends are the receive buffer's own blocks: swapped pairwise
// when it is symmetric, in cache-sized chunks), and sends that are the receive buffer's blocks in another order. Even
// and uneven counts, zero counts (this rank's own part among them).
inline void RunAllToAllPaths(const CollectiveBackend& backend, int world) {
  RunOnRootTeam(backend, world, [&](int rank, Runtime& runtime, std::uint64_t t) {
    const auto n = static_cast<std::size_t>(world);
    // The element `i` of what rank `from` sends rank `to`: exact in float32, different for every pair and offset.
    auto value = [](int from, int to, std::size_t i) {
      return static_cast<float>(from * 1000 + to * 100 + static_cast<int>(i % 97));
    };
    enum class Layout { kSeparate, kInPlace, kReversed };
    // 16 B and 12 KB parts travel with the counts; 280 KB parts go in pieces (and swap in several chunks).
    for (std::size_t unit : {std::size_t{4}, std::size_t{3000}, std::size_t{70000}}) {
      for (Layout layout : {Layout::kSeparate, Layout::kInPlace, Layout::kReversed}) {
        // Reversed blocks are read before anything is written only where every part is staged first (one step).
        if (layout == Layout::kReversed && unit > 3000) continue;
        for (bool uneven : {false, true}) {
          // In place needs what rank i sends rank j to fit the block rank j sends back: symmetric counts. The uneven
          // counts hold zeros, own parts among them (rank 0's, and rank 3's out of place).
          auto count = [&](int from, int to) -> std::size_t {
            if (!uneven || layout == Layout::kReversed) return unit;
            if (layout == Layout::kInPlace) return static_cast<std::size_t>((from + to) % 3) * unit;
            return static_cast<std::size_t>((2 * from + to) % 4) * unit;
          };
          for (bool symmetric : {false, true}) {
            SCOPED_TRACE("unit=" + std::to_string(unit) + " layout=" + std::to_string(static_cast<int>(layout)) +
                         " uneven=" + std::to_string(uneven) + " symmetric=" + std::to_string(symmetric));
            std::size_t largest_total = 0;   // a symmetric buffer has one size on every rank
            for (int r = 0; r < world; ++r) {
              std::size_t total = 0;
              for (int j = 0; j < world; ++j) total += count(j, r);
              largest_total = std::max(largest_total, total);
            }
            DeviceFloats receive(backend, runtime, largest_total, symmetric);
            std::vector<std::uint64_t> receive_counts;
            std::vector<std::size_t> starts;
            std::vector<float> expected;
            for (int j = 0; j < world; ++j) {
              starts.push_back(expected.size());
              receive_counts.push_back(count(j, rank));
              for (std::size_t i = 0; i < count(j, rank); ++i) expected.push_back(value(j, rank, i));
            }
            std::vector<std::unique_ptr<DeviceFloats>> separate;
            std::vector<std::pair<const void*, std::size_t>> sends;
            std::vector<float> initial(largest_total, -1.0f);
            for (int j = 0; j < world; ++j) {
              std::vector<float> values(count(rank, j));
              for (std::size_t i = 0; i < values.size(); ++i) values[i] = value(rank, j, i);
              if (layout == Layout::kSeparate) {
                separate.push_back(std::make_unique<DeviceFloats>(backend, runtime, values.size(), false));
                separate.back()->Set(values);
                sends.emplace_back(separate.back()->data(), values.size() * 4);
                continue;
              }
              // The block this send occupies: its own (in place), or the mirrored one (every count is `unit`).
              const std::size_t block = layout == Layout::kInPlace ? starts[static_cast<std::size_t>(j)]
                                                                   : (n - 1 - static_cast<std::size_t>(j)) * unit;
              std::copy(values.begin(), values.end(), initial.begin() + static_cast<std::ptrdiff_t>(block));
              sends.emplace_back(receive.at(block), values.size() * 4);
            }
            receive.Set(initial);
            ASSERT_TRUE(IsOk(runtime.AllToAll(t, sends, receive.data(), receive.bytes(), receive_counts, Float32(),
                                              kDefaultStream, nullptr)));
            std::vector<float> received = receive.Get();
            for (std::size_t i = expected.size(); i < received.size(); ++i) {
              EXPECT_EQ(received[i], initial[i]) << "written past the received parts at " << i;
            }
            received.resize(expected.size());
            EXPECT_EQ(received, expected);
            ASSERT_TRUE(IsOk(runtime.TeamBarrier(t, kDefaultStream)));
          }
        }
      }
    }
  });
}

// Ranks that call different collectives (or the same with other arguments) all fail with kMismatch naming both calls,
// nothing is written, and the next matching call works.
inline void RunMismatches(const CollectiveBackend& backend, int world) {
  RunOnRootTeam(backend, world, [&](int rank, Runtime& runtime, std::uint64_t t) {
    DeviceFloats tensor(backend, runtime, 16, false);
    DeviceFloats gathered(backend, runtime, 16 * static_cast<std::size_t>(world), false);
    const std::vector<float> ones(16, 1.0f);
    const bool odd = rank == world - 1;   // the last rank calls something else
    struct Case {
      const char* what;
      std::function<Status()> common;
      std::function<Status()> other;
      const char* field;
    };
    const std::vector<Case> cases = {
        {"all_reduce vs barrier",
         [&] { return runtime.AllReduce(t, tensor.data(), 64, DataType::kFloat32, ReduceOp::kSum, kDefaultStream, nullptr); },
         [&] { return runtime.TeamBarrier(t, kDefaultStream); }, "(collective)"},
        {"count",
         [&] { return runtime.AllReduce(t, tensor.data(), 64, DataType::kFloat32, ReduceOp::kSum, kDefaultStream, nullptr); },
         [&] { return runtime.AllReduce(t, tensor.data(), 32, DataType::kFloat32, ReduceOp::kSum, kDefaultStream, nullptr); },
         "(count)"},
        {"dtype",
         [&] { return runtime.AllReduce(t, tensor.data(), 64, DataType::kFloat32, ReduceOp::kSum, kDefaultStream, nullptr); },
         [&] { return runtime.AllReduce(t, tensor.data(), 64, DataType::kInt32, ReduceOp::kSum, kDefaultStream, nullptr); },
         "(dtype)"},
        {"op",
         [&] { return runtime.AllReduce(t, tensor.data(), 64, DataType::kFloat32, ReduceOp::kSum, kDefaultStream, nullptr); },
         [&] { return runtime.AllReduce(t, tensor.data(), 64, DataType::kFloat32, ReduceOp::kMax, kDefaultStream, nullptr); },
         "(op)"},
        {"wire",
         [&] {
           return runtime.AllReduce(t, tensor.data(), 64, DataType::kFloat32, ReduceOp::kSum, kDefaultStream, nullptr,
                                    ops::LowFormat::kFloat16);
         },
         [&] { return runtime.AllReduce(t, tensor.data(), 64, DataType::kFloat32, ReduceOp::kSum, kDefaultStream, nullptr); },
         "(wire)"},
        {"all_gather vs all_reduce",
         [&] {
           return runtime.AllGather(t, gathered.data(), gathered.bytes(), tensor.data(), 64, Float32(), kDefaultStream,
                                    nullptr);
         },
         [&] { return runtime.AllReduce(t, tensor.data(), 64, DataType::kFloat32, ReduceOp::kSum, kDefaultStream, nullptr); },
         "(collective)"},
        {"all_gather count",
         [&] {
           return runtime.AllGather(t, gathered.data(), gathered.bytes(), tensor.data(), 64, Float32(), kDefaultStream,
                                    nullptr);
         },
         [&] {
           return runtime.AllGather(t, gathered.data(), gathered.bytes() / 2, tensor.data(), 32, Float32(), kDefaultStream,
                                    nullptr);
         },
         "(count)"},
    };
    for (const Case& c : cases) {
      SCOPED_TRACE(c.what);
      tensor.Set(ones);
      const Status status = odd ? c.other() : c.common();
      EXPECT_EQ(status.code(), StatusCode::kMismatch) << status.ToString();
      EXPECT_TRUE(Contains(status.message(), std::string("ranks disagree on a collective ") + c.field)) << status.message();
      EXPECT_TRUE(Contains(status.message(), "rank " + std::to_string(world - 1) + " calls")) << status.message();
      EXPECT_EQ(tensor.Get(), ones);   // nothing was reduced into it
      // The team is still in step: a matching call works on every rank.
      ASSERT_TRUE(IsOk(runtime.AllReduce(t, tensor.data(), 64, DataType::kFloat32, ReduceOp::kSum, kDefaultStream, nullptr)));
      EXPECT_EQ(tensor.Get(), std::vector<float>(16, static_cast<float>(world)));
    }
  });
}

// The documented error bound of low-precision communication (symmetric_memory's _low_precision): u the format's unit
// roundoff, `casts` the number of roundings to it on the way (two for the two-shot all_reduce, else one), A the sum
// of the terms' magnitudes, M the largest A (the fp8 formats' underflow, per scale block, taken over the whole run).
inline double LowPrecisionBound(ops::LowFormat format, int casts, int world, double a, double m) {
  const double u = format == ops::LowFormat::kFloat16    ? std::ldexp(1.0, -11)
                   : format == ops::LowFormat::kBFloat16 ? std::ldexp(1.0, -8)
                   : format == ops::LowFormat::kFloat8E4M3Fn ? std::ldexp(1.0, -4)
                                                            : std::ldexp(1.0, -3);
  const double relative = (casts == 2 ? 2 * u + u * u : u) + 2 * world * std::ldexp(1.0, -23);
  return relative * a + 2 * world * std::ldexp(1.0, -9) / 448 * m;
}

// Low-precision all_reduce (one step, and two-shot in several pieces) and reduce_scatter (several pieces) in every
// format of `formats`: sums of small integers are exact in the 16-bit formats (every rank's part and every sum fits
// their significand); every result is within the documented bound; a rank in full precision fails every rank.
inline void RunLowPrecision(const CollectiveBackend& backend, int world, const std::vector<ops::LowFormat>& formats) {
  RunOnRootTeam(backend, world, [&](int rank, Runtime& runtime, std::uint64_t t) {
    const auto n = static_cast<std::size_t>(world);
    auto value = [](int r, std::size_t i) { return static_cast<float>(r + 1 + static_cast<int>(i % 29)); };
    for (ops::LowFormat format : formats) {
      const bool exact = !ops::LowFormatScaled(format);
      for (std::size_t count : {std::size_t{24}, std::size_t{100000}}) {   // one step; two-shot in pieces
        for (bool symmetric : {false, true}) {
          SCOPED_TRACE(std::string("format=") + ops::LowFormatName(format) + " count=" + std::to_string(count) +
                       " symmetric=" + std::to_string(symmetric));
          std::vector<float> mine(count);
          std::vector<double> sum(count, 0.0);
          double largest = 0;
          for (std::size_t i = 0; i < count; ++i) {
            mine[i] = value(rank, i);
            for (int r = 0; r < world; ++r) sum[i] += value(r, i);
            largest = std::max(largest, sum[i]);
          }
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
            DeviceFloats tensor(backend, runtime, count, symmetric);
            tensor.Set(mine);
            ASSERT_TRUE(IsOk(runtime.AllReduce(t, tensor.data(), tensor.bytes(), DataType::kFloat32, op, kDefaultStream,
                                               nullptr, format)));
            const std::vector<float> got = tensor.Get();
            const int casts = count * 4 <= (256u << 10) && world > 1 ? 1 : 2;
            const double divisor = op == ReduceOp::kAvg ? world : 1;
            for (std::size_t i = 0; i < count; ++i) {
              const double expected = sum[i] / divisor;
              if (exact && op == ReduceOp::kSum) {
                ASSERT_EQ(got[i], expected) << i;
              } else {
                ASSERT_LE(std::fabs(got[i] - expected),
                          LowPrecisionBound(format, casts, world, expected, largest / divisor)) << i;
              }
            }
          }
          // reduce_scatter: every rank's part p of `whole` is value(rank, p * count + i).
          DeviceFloats whole(backend, runtime, count * n, symmetric);
          DeviceFloats part(backend, runtime, count, false);
          std::vector<float> values(count * n);
          for (std::size_t i = 0; i < values.size(); ++i) values[i] = value(rank, i);
          whole.Set(values);
          ASSERT_TRUE(IsOk(runtime.ReduceScatter(t, part.data(), part.bytes(), whole.data(), whole.bytes(),
                                                 DataType::kFloat32, ReduceOp::kSum, kDefaultStream, nullptr, format)));
          const std::vector<float> got = part.Get();
          for (std::size_t i = 0; i < count; ++i) {
            double expected = 0;
            for (int r = 0; r < world; ++r) expected += value(r, static_cast<std::size_t>(rank) * count + i);
            if (exact) {
              ASSERT_EQ(got[i], expected) << i;
            } else {
              ASSERT_LE(std::fabs(got[i] - expected), LowPrecisionBound(format, 1, world, expected, largest)) << i;
            }
          }
        }
      }
    }
    // Refused before anything moves, alike on every rank: a format that cannot carry the reduction.
    DeviceFloats tensor(backend, runtime, 16, false);
    EXPECT_TRUE(HasError(runtime.AllReduce(t, tensor.data(), 64, DataType::kFloat32, ReduceOp::kMax, kDefaultStream,
                                           nullptr, ops::LowFormat::kFloat16),
                         StatusCode::kInvalidArgument,
                         "`low_precision_dtype` must be used with sum or avg only (dtype=float32 op=max), but got "
                         "float16"));
    EXPECT_TRUE(HasError(runtime.AllReduce(t, tensor.data(), 64, DataType::kInt32, ReduceOp::kSum, kDefaultStream,
                                           nullptr, ops::LowFormat::kFloat16),
                         StatusCode::kInvalidArgument, "must be used with floating-point tensors only"));
    EXPECT_TRUE(HasError(runtime.ReduceScatter(t, tensor.data(), 32, tensor.data(), 32 * n, DataType::kFloat16,
                                               ReduceOp::kSum, kDefaultStream, nullptr, ops::LowFormat::kBFloat16),
                         StatusCode::kInvalidArgument, "must be narrower than the tensor's dtype"));
    ASSERT_TRUE(IsOk(runtime.TeamBarrier(t, kDefaultStream)));
  });
}

// The one-step paths move data with the call's first sync (staged in the sender's half, or pushed into the
// receiver's, before the fingerprints are compared): a rank whose call is one-step sized against one whose call is
// staged sized fails like any mismatch, with no output written on any rank, and the calls after it (on both
// parities of the staging area) still pair up.
inline void RunOneStepAgainstStaged(const CollectiveBackend& backend, int world) {
  RunOnRootTeam(backend, world, [&](int rank, Runtime& runtime, std::uint64_t t) {
    const auto n = static_cast<std::size_t>(world);
    constexpr std::size_t kSmall = 16;      // 64 B: one step
    constexpr std::size_t kLarge = 80000;   // 320 KB: past one_step_bytes() (256 KiB at most), staged
    const bool odd = rank == world - 1;     // the last rank calls the staged-sized collective
    DeviceFloats small(backend, runtime, kSmall, false);
    DeviceFloats large(backend, runtime, kLarge, false);
    DeviceFloats small_gathered(backend, runtime, kSmall * n, false);
    DeviceFloats large_gathered(backend, runtime, kLarge * n, false);
    const std::vector<float> small_values(kSmall, static_cast<float>(rank + 1));
    const std::vector<float> large_values(kLarge, static_cast<float>(rank + 1));
    const std::vector<float> untouched_small(kSmall * n, -1.0f), untouched_large(kLarge * n, -1.0f);
    auto reset = [&] {
      small.Set(small_values);
      large.Set(large_values);
      small_gathered.Set(untouched_small);
      large_gathered.Set(untouched_large);
    };
    auto unchanged = [&] {
      EXPECT_EQ(small.Get(), small_values);
      EXPECT_EQ(large.Get(), large_values);
      EXPECT_EQ(small_gathered.Get(), untouched_small);
      EXPECT_EQ(large_gathered.Get(), untouched_large);
    };
    const float sum = static_cast<float>(world * (world + 1) / 2);
    // all_reduce: one step against staged.
    reset();
    Status status = odd ? runtime.AllReduce(t, large.data(), large.bytes(), DataType::kFloat32, ReduceOp::kSum,
                                            kDefaultStream, nullptr)
                        : runtime.AllReduce(t, small.data(), small.bytes(), DataType::kFloat32, ReduceOp::kSum,
                                            kDefaultStream, nullptr);
    EXPECT_EQ(status.code(), StatusCode::kMismatch) << status.ToString();
    EXPECT_TRUE(Contains(status.message(), "ranks disagree on a collective (count)")) << status.message();
    unchanged();
    // all_gather: one step against staged, then the same the other way round (the other parity).
    for (int turn = 0; turn < 2; ++turn) {
      SCOPED_TRACE("all_gather turn " + std::to_string(turn));
      reset();
      const bool large_here = odd == (turn == 0);
      status = large_here ? runtime.AllGather(t, large_gathered.data(), large_gathered.bytes(), large.data(),
                                              large.bytes(), Float32(), kDefaultStream, nullptr)
                          : runtime.AllGather(t, small_gathered.data(), small_gathered.bytes(), small.data(),
                                              small.bytes(), Float32(), kDefaultStream, nullptr);
      EXPECT_EQ(status.code(), StatusCode::kMismatch) << status.ToString();
      unchanged();
    }
    // all_to_all: every rank expects kSmall elements from each; the last rank sends kLarge (staged sized) to each.
    // The small senders pushed their parts into the receivers' staging with the counts; every rank refuses alike.
    reset();
    std::vector<std::pair<const void*, std::size_t>> sends;
    for (std::size_t j = 0; j < n; ++j) {
      sends.emplace_back(odd ? large.data() : small.data(), odd ? large.bytes() : small.bytes());
    }
    const std::vector<std::uint64_t> expect_small(n, kSmall);
    status = runtime.AllToAll(t, sends, small_gathered.data(), small_gathered.bytes(), expect_small, Float32(),
                              kDefaultStream, nullptr);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
    EXPECT_TRUE(Contains(status.message(), "of rank " + std::to_string(world - 1) + " must have the 16 elements rank"))
        << status.message();
    unchanged();
    // In step on both parities: a one-step call and a staged one, then a one-step all_to_all, all matching.
    for (int turn = 0; turn < 2; ++turn) {
      reset();
      ASSERT_TRUE(IsOk(runtime.AllReduce(t, small.data(), small.bytes(), DataType::kFloat32, ReduceOp::kSum,
                                         kDefaultStream, nullptr)));
      EXPECT_EQ(small.Get(), std::vector<float>(kSmall, sum));
      ASSERT_TRUE(IsOk(runtime.AllGather(t, large_gathered.data(), large_gathered.bytes(), large.data(), large.bytes(),
                                         Float32(), kDefaultStream, nullptr)));
      const std::vector<float> gathered = large_gathered.Get();
      for (std::size_t r = 0; r < n; ++r) EXPECT_EQ(gathered[r * kLarge + kLarge - 1], static_cast<float>(r + 1));
    }
    reset();
    std::vector<std::pair<const void*, std::size_t>> small_sends(n, {small.data(), small.bytes()});
    ASSERT_TRUE(IsOk(runtime.AllToAll(t, small_sends, small_gathered.data(), small_gathered.bytes(), expect_small,
                                      Float32(), kDefaultStream, nullptr)));
    const std::vector<float> received = small_gathered.Get();
    for (std::size_t r = 0; r < n; ++r) EXPECT_EQ(received[r * kSmall], static_cast<float>(r + 1));
  });
}

}  // namespace hp::shmem::testutil
