// MoE dispatch and combine (Runtime::MoeExchange, collectives/moe.h), written once over a CollectiveBackend and run
// on the host device (test_moe.cc) and the ascend device on the CANN fakes (test_ascend_collectives.cc): the layouts
// and offsets torch's all_to_all_vdev_2d / _offset define, a round trip that restores every token, and the verdicts
// every rank reaches alike before anything is written. Split tables live in device memory, as a framework holds them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collective_cases.h"

namespace hp::shmem::testutil {

// An int64 table in device memory outside the heap.
class DeviceInts {
 public:
  DeviceInts(const CollectiveBackend& backend, std::vector<std::int64_t> values)
      : backend_(backend), count_(values.size()) {
    data_ = backend.alloc_local(std::max<std::size_t>(count_ * 8, 8));
    Set(values);
  }
  ~DeviceInts() { backend_.free_local(data_); }
  DeviceInts(const DeviceInts&) = delete;
  DeviceInts& operator=(const DeviceInts&) = delete;
  std::int64_t* data() const { return static_cast<std::int64_t*>(data_); }
  void Set(const std::vector<std::int64_t>& values) const {
    if (!values.empty()) backend_.write(data_, values.data(), values.size() * 8);
  }
  std::vector<std::int64_t> Get() const {
    std::vector<std::int64_t> values(count_);
    if (count_ > 0) backend_.read(values.data(), data_, count_ * 8);
    return values;
  }

 private:
  const CollectiveBackend& backend_;
  std::size_t count_;
  void* data_ = nullptr;
};

namespace moe {

constexpr int kExperts = 3;
constexpr std::size_t kRowFloats = 2;   // a row: two floats
constexpr std::size_t kRowBytes = kRowFloats * sizeof(float);

// Rows rank `source` sends to expert e of rank `peer`: uneven, some empty.
inline std::int64_t Split(int source, int peer, int e) { return (source * 7 + peer * 3 + e * 5) % 4; }

// A token's value: who sent it, to which (peer, expert), which row of the chunk.
inline float Token(int source, int peer, int e, std::int64_t row, std::size_t column) {
  return static_cast<float>(source * 10000 + peer * 1000 + e * 100 + row * 2 + static_cast<std::int64_t>(column));
}

inline std::int64_t AlignUp(std::int64_t rows, std::int64_t align) {
  const std::int64_t aligned = (rows + align - 1) / align * align;
  return aligned < align ? align : aligned;
}

inline MoeExchangeArgs Args(const char* op, std::uint64_t team, MoeDirection direction, int experts,
                            const DeviceFloats& input, const DeviceFloats& output, const DeviceInts& in_splits,
                            const DeviceInts* in_offsets, const DeviceInts& out_table, std::size_t nsplits) {
  MoeExchangeArgs x;
  x.op = op;
  x.team = team;
  x.direction = direction;
  x.experts = experts;
  x.input = input.data();
  x.input_rows = static_cast<std::int64_t>(input.bytes() / kRowBytes);
  x.output = output.data();
  x.output_rows = static_cast<std::int64_t>(output.bytes() / kRowBytes);
  x.row_bytes = kRowBytes;
  x.in_splits = in_splits.data();
  x.in_offsets = in_offsets != nullptr ? in_offsets->data() : nullptr;
  x.out_splits = out_table.data();
  x.out_offsets = out_table.data() + nsplits;
  return x;
}

}  // namespace moe

// Dispatch (expert-major, aligned regions) then combine with dispatch's splits and offsets: every token returns to
// where it left, with symmetric inputs and with rank 0's ordinary (as torch.compile hands one over).
inline void RunMoeRoundTrip(const CollectiveBackend& backend, int world) {
  using namespace moe;
  RunOnRootTeam(backend, world, [&](int rank, Runtime& runtime, std::uint64_t t) {
    const int n = world;
    const std::size_t nsplits = static_cast<std::size_t>(n) * kExperts;
    // rows: what a rank sends or receives at most (splits below 4), with every region aligned
    const std::size_t capacity = static_cast<std::size_t>(3 * n * kExperts + 4 * kExperts);
    for (bool symmetric : {true, false}) {
      SCOPED_TRACE("symmetric=" + std::to_string(symmetric));
      // Symmetric allocations are collective: every rank makes them, and rank 0 uses ordinary ones instead.
      DeviceFloats heap_input(backend, runtime, capacity * kRowFloats, true);
      DeviceFloats heap_output(backend, runtime, capacity * kRowFloats, true);
      DeviceFloats back(backend, runtime, capacity * kRowFloats, true);
      DeviceFloats local_input(backend, runtime, capacity * kRowFloats, false);
      DeviceFloats local_output(backend, runtime, capacity * kRowFloats, false);
      const bool heap = symmetric || rank > 0;
      const DeviceFloats& input = heap ? heap_input : local_input;
      const DeviceFloats& output = heap ? heap_output : local_output;
      // Rank-major input: the chunks for (peer, expert) one after the other.
      std::vector<std::int64_t> splits(nsplits);
      std::vector<float> tokens(capacity * kRowFloats, 0.0F);
      std::size_t row = 0;
      for (int peer = 0; peer < n; ++peer) {
        for (int e = 0; e < kExperts; ++e) {
          const std::int64_t split = Split(rank, peer, e);
          splits[static_cast<std::size_t>(peer * kExperts + e)] = split;
          for (std::int64_t r = 0; r < split; ++r, ++row) {
            for (std::size_t c = 0; c < kRowFloats; ++c) tokens[row * kRowFloats + c] = Token(rank, peer, e, r, c);
          }
        }
      }
      const std::size_t routed = row;
      input.Set(tokens);
      const DeviceInts in_splits(backend, splits);
      const DeviceInts out_table(backend, std::vector<std::int64_t>(2 * nsplits, -1));
      MoeExchangeArgs dispatch = Args("moe_dispatch", t, MoeDirection::kDispatch, kExperts, input, output, in_splits,
                                      nullptr, out_table, nsplits);
      const std::int64_t align = 4;
      dispatch.major_align = align;
      ASSERT_TRUE(IsOk(runtime.MoeExchange(dispatch, kDefaultStream, nullptr)));

      // Expert-major: expert e's region starts aligned and holds every source's chunk in rank order.
      const std::vector<std::int64_t> out = out_table.Get();
      const std::vector<float> received = output.Get();
      std::int64_t region = 0;
      for (int e = 0; e < kExperts; ++e) {
        std::int64_t at = region;
        for (int s = 0; s < n; ++s) {
          const std::size_t i = static_cast<std::size_t>(e * n + s);
          const std::int64_t split = Split(s, rank, e);
          EXPECT_EQ(out[i], split) << "expert " << e << " source " << s;
          EXPECT_EQ(out[nsplits + i], at) << "expert " << e << " source " << s;
          for (std::int64_t r = 0; r < split; ++r) {
            for (std::size_t c = 0; c < kRowFloats; ++c) {
              EXPECT_EQ(received[static_cast<std::size_t>(at + r) * kRowFloats + c], Token(s, rank, e, r, c));
            }
          }
          at += split;
        }
        region += AlignUp(at - region, align);
      }

      // Combine with dispatch's splits and offsets (its backward): every token returns to where it left.
      const DeviceInts combine_splits(backend, std::vector<std::int64_t>(out.begin(), out.begin() + nsplits));
      const DeviceInts combine_offsets(backend, std::vector<std::int64_t>(out.begin() + nsplits, out.end()));
      const DeviceInts back_table(backend, std::vector<std::int64_t>(2 * nsplits, -1));
      const MoeExchangeArgs combine = Args("moe_combine", t, MoeDirection::kCombine, kExperts, output, back,
                                           combine_splits, &combine_offsets, back_table, nsplits);
      ASSERT_TRUE(IsOk(runtime.MoeExchange(combine, kDefaultStream, nullptr)));
      const std::vector<std::int64_t> restored = back_table.Get();
      std::int64_t packed = 0;
      for (std::size_t i = 0; i < nsplits; ++i) {
        EXPECT_EQ(restored[i], splits[i]);
        EXPECT_EQ(restored[nsplits + i], packed);
        packed += splits[i];
      }
      const std::vector<float> returned = back.Get();
      for (std::size_t f = 0; f < routed * kRowFloats; ++f) EXPECT_EQ(returned[f], tokens[f]) << "float " << f;
    }
  });
}

namespace moe {

// Which ranks pass ordinary tensors (the others symmetric ones) in a case of RunMoeOrdinaryInputs.
enum class OrdinaryRanks { kAll, kOdd, kFirst };

struct OrdinaryCase {
  const char* name;
  int experts;
  std::int64_t major_align;   // 0: packed
  bool offsets;               // dispatch's chunks at in_offsets: in reverse order, a row apart
  std::size_t row_floats;     // 0: two fifths of the team's staging and a float (a window's edge falls in a row)
  int salt;                   // varies the splits between cases
  OrdinaryRanks ordinary;
};

// One source's dispatch: its splits and each chunk's first row of `input`, indexed [peer * experts + e].
struct Sends {
  std::vector<std::int64_t> splits, starts;
  std::int64_t input_rows = 0;
};

inline Sends SendsOf(const OrdinaryCase& c, int source, int n) {
  const std::size_t nsplits = static_cast<std::size_t>(n) * static_cast<std::size_t>(c.experts);
  Sends sends;
  sends.splits.resize(nsplits);
  sends.starts.resize(nsplits);
  for (std::size_t t = 0; t < nsplits; ++t) {
    const auto peer = static_cast<int>(t / static_cast<std::size_t>(c.experts));
    const auto e = static_cast<int>(t % static_cast<std::size_t>(c.experts));
    sends.splits[t] = (source * 7 + peer * 3 + e * 5 + c.salt) % 4;
  }
  std::int64_t cursor = 0;
  for (std::size_t k = 0; k < nsplits; ++k) {
    const std::size_t t = c.offsets ? nsplits - 1 - k : k;
    sends.starts[t] = cursor;
    cursor += sends.splits[t] + (c.offsets ? 1 : 0);
  }
  sends.input_rows = cursor + 1;   // and a row never sent
  return sends;
}

// Column `column` of row `row` of `source`'s input: exact in float32, different for every source, row and column.
inline float InputValue(int source, std::int64_t row, std::size_t column) {
  return static_cast<float>((source * 512 + row) * 2048 + static_cast<std::int64_t>(column % 2048));
}

// What one rank holds after an exchange: its split table (splits, then offsets) and `rows` rows of output, the rows
// nothing lands in still -1 (none when `rows` is 0).
struct Received {
  std::vector<std::int64_t> table;
  std::vector<float> values;
};

// Dispatch as torch's all_to_all_vdev_2d defines it, for receiver `q`: expert e's region holds every source's chunk
// for (q, e) in rank order and takes max(align, the rows rounded up to align) rows (packed when align is 0).
inline Received ReferenceDispatch(const OrdinaryCase& c, const std::vector<Sends>& all, int q, std::size_t rows) {
  const int n = static_cast<int>(all.size());
  const std::size_t nsplits = static_cast<std::size_t>(n) * static_cast<std::size_t>(c.experts);
  Received r;
  r.table.resize(2 * nsplits);
  r.values.assign(rows * c.row_floats, -1.0F);
  std::int64_t cursor = 0;
  for (int e = 0; e < c.experts; ++e) {
    const std::int64_t region = cursor;
    for (int s = 0; s < n; ++s) {
      const std::size_t t = static_cast<std::size_t>(q * c.experts + e);
      const std::size_t i = static_cast<std::size_t>(e * n + s);
      const std::int64_t split = all[static_cast<std::size_t>(s)].splits[t];
      r.table[i] = split;
      r.table[nsplits + i] = cursor;
      for (std::int64_t k = 0; k < split && rows > 0; ++k) {   // rows 0: the table only
        for (std::size_t col = 0; col < c.row_floats; ++col) {
          r.values[static_cast<std::size_t>(cursor + k) * c.row_floats + col] =
              InputValue(s, all[static_cast<std::size_t>(s)].starts[t] + k, col);
        }
      }
      cursor += split;
    }
    if (c.major_align > 0) {
      const std::int64_t used = cursor - region;
      cursor = region + std::max(c.major_align, (used + c.major_align - 1) / c.major_align * c.major_align);
    }
  }
  return r;
}

// Combine of dispatch's output with dispatch's table, for rank `q`: q's own chunks back, packed in table order.
inline Received ReferenceCombine(const OrdinaryCase& c, const Sends& mine, int q, std::size_t rows) {
  const std::size_t nsplits = mine.splits.size();
  Received r;
  r.table.resize(2 * nsplits);
  r.values.assign(rows * c.row_floats, -1.0F);
  std::int64_t cursor = 0;
  for (std::size_t t = 0; t < nsplits; ++t) {
    r.table[t] = mine.splits[t];
    r.table[nsplits + t] = cursor;
    for (std::int64_t k = 0; k < mine.splits[t]; ++k, ++cursor) {
      for (std::size_t col = 0; col < c.row_floats; ++col) {
        r.values[static_cast<std::size_t>(cursor) * c.row_floats + col] = InputValue(q, mine.starts[t] + k, col);
      }
    }
  }
  return r;
}

}  // namespace moe

// Ordinary inputs and outputs (on every rank, or on some with the others symmetric): dispatch, then combine with
// dispatch's table, each compared with the reference above (every row, and the rows nothing lands in untouched); one
// and several experts, packed and at in_offsets, aligned regions, and rows so large that a rank's sends take
// several windows of the team's staging.
inline void RunMoeOrdinaryInputs(const CollectiveBackend& backend, int world) {
  using namespace moe;
  const std::vector<OrdinaryCase> cases = {
      {"one expert, packed, every rank ordinary", 1, 0, false, 2, 0, OrdinaryRanks::kAll},
      {"3 experts at in_offsets, align 4, every rank ordinary", 3, 4, true, 2, 1, OrdinaryRanks::kAll},
      {"2 experts, align 1, odd ranks ordinary", 2, 1, false, 3, 2, OrdinaryRanks::kOdd},
      {"4 experts at in_offsets, align 2, rank 0 ordinary", 4, 2, true, 2, 3, OrdinaryRanks::kFirst},
      {"rows of two fifths of the staging", 2, 0, true, 0, 0, OrdinaryRanks::kAll},
  };
  RunOnRootTeam(backend, world, [&](int rank, Runtime& runtime, std::uint64_t t) {
    const int n = world;
    auto view = runtime.DescribeTeam(t);
    ASSERT_TRUE(view.ok());
    for (OrdinaryCase c : cases) {
      SCOPED_TRACE(c.name);
      if (c.row_floats == 0) c.row_floats = view->staging_bytes / 10 + 1;
      const std::size_t nsplits = static_cast<std::size_t>(n) * static_cast<std::size_t>(c.experts);
      const std::size_t row_bytes = c.row_floats * sizeof(float);
      std::vector<Sends> all;
      for (int s = 0; s < n; ++s) all.push_back(SendsOf(c, s, n));
      // Room for what any rank sends or receives, and two rows more; the same on every rank, as symmetric
      // allocations must be.
      std::size_t rows = 0;
      for (int q = 0; q < n; ++q) {
        const std::vector<std::int64_t> table = ReferenceDispatch(c, all, q, 0).table;
        std::int64_t end = all[static_cast<std::size_t>(q)].input_rows;
        for (std::size_t i = 0; i < nsplits; ++i) end = std::max(end, table[nsplits + i] + table[i]);
        rows = std::max(rows, static_cast<std::size_t>(end) + 2);
      }
      if (row_bytes > view->staging_bytes / 4) {   // the case is there to take several windows: make sure it does
        std::size_t most = 0;
        for (int s = 0; s < n; ++s) {
          std::int64_t sent = 0;
          for (std::size_t i = 0; i < nsplits; ++i) {
            if (static_cast<int>(i) / c.experts != s) sent += all[static_cast<std::size_t>(s)].splits[i];
          }
          most = std::max(most, static_cast<std::size_t>(sent) * row_bytes);
        }
        ASSERT_GT(most, view->staging_bytes);
      }
      const bool ordinary = c.ordinary == OrdinaryRanks::kAll || (c.ordinary == OrdinaryRanks::kOdd && rank % 2 == 1) ||
                            (c.ordinary == OrdinaryRanks::kFirst && rank == 0);
      const bool any_symmetric = c.ordinary != OrdinaryRanks::kAll;
      const std::size_t floats = rows * c.row_floats;
      // Symmetric allocations are collective: every rank makes them when any rank uses them.
      std::vector<std::unique_ptr<DeviceFloats>> buffers;
      auto make = [&]() -> const DeviceFloats& {
        if (any_symmetric) buffers.push_back(std::make_unique<DeviceFloats>(backend, runtime, floats, true));
        if (ordinary) buffers.push_back(std::make_unique<DeviceFloats>(backend, runtime, floats, false));
        return *buffers.back();
      };
      const DeviceFloats& input = make();
      const DeviceFloats& output = make();
      const DeviceFloats& back = make();
      const Sends& mine = all[static_cast<std::size_t>(rank)];
      std::vector<float> values(floats);
      for (std::size_t f = 0; f < floats; ++f) values[f] = InputValue(rank, f / c.row_floats, f % c.row_floats);
      input.Set(values);
      output.Set(std::vector<float>(floats, -1.0F));
      back.Set(std::vector<float>(floats, -1.0F));
      std::vector<std::int64_t> splits_and_starts = mine.splits;
      splits_and_starts.insert(splits_and_starts.end(), mine.starts.begin(), mine.starts.end());
      const DeviceInts in_table(backend, splits_and_starts);
      const DeviceInts out_table(backend, std::vector<std::int64_t>(2 * nsplits, -7));
      const DeviceInts back_table(backend, std::vector<std::int64_t>(2 * nsplits, -7));

      MoeExchangeArgs dispatch;
      dispatch.team = t;
      dispatch.experts = c.experts;
      dispatch.input = input.data();
      dispatch.input_rows = static_cast<std::int64_t>(rows);
      dispatch.output = output.data();
      dispatch.output_rows = static_cast<std::int64_t>(rows);
      dispatch.row_bytes = row_bytes;
      dispatch.in_splits = in_table.data();
      dispatch.in_offsets = c.offsets ? in_table.data() + nsplits : nullptr;
      dispatch.major_align = c.major_align;
      dispatch.out_splits = out_table.data();
      dispatch.out_offsets = out_table.data() + nsplits;
      // One exchange, then its table and every row of its output against the reference.
      auto exchange = [&](const MoeExchangeArgs& x, const DeviceInts& table, const DeviceFloats& out,
                          const Received& expected) {
        const Status status = runtime.MoeExchange(x, kDefaultStream, nullptr);
        EXPECT_TRUE(IsOk(status)) << x.op;
        EXPECT_EQ(table.Get(), expected.table) << x.op;
        EXPECT_TRUE(out.Get() == expected.values) << x.op;
        return status.ok();
      };
      ASSERT_TRUE(exchange(dispatch, out_table, output, ReferenceDispatch(c, all, rank, rows)));

      MoeExchangeArgs combine = dispatch;
      combine.op = "moe_combine";
      combine.direction = MoeDirection::kCombine;
      combine.input = output.data();
      combine.output = back.data();
      combine.in_splits = out_table.data();
      combine.in_offsets = out_table.data() + nsplits;
      combine.major_align = 0;
      combine.out_splits = back_table.data();
      combine.out_offsets = back_table.data() + nsplits;
      ASSERT_TRUE(exchange(combine, back_table, back, ReferenceCombine(c, mine, rank, rows)));
    }
  });
}

// A receive buffer too small for what the peers send: every rank raises the same error, naming the rank, the expert
// and both sizes, and nothing is written anywhere; the team stays in step. Symmetric tensors, then ordinary ones.
inline void RunMoeTooSmall(const CollectiveBackend& backend, int world) {
  using namespace moe;
  RunOnRootTeam(backend, world, [&](int rank, Runtime& runtime, std::uint64_t t) {
    for (bool symmetric : {true, false}) {
      SCOPED_TRACE("symmetric=" + std::to_string(symmetric));
      const int n = world;
      const int last = world - 1;
      const std::size_t nsplits = static_cast<std::size_t>(n) * 2;
      // Every rank sends 3 rows to each expert of the last rank and 1 row to every other expert: the last rank
      // receives 6n rows (its expert 0 region takes 3n, expert 1's ends at row 6n), and its `out` holds 4n.
      std::vector<std::int64_t> splits(nsplits, 1);
      splits[nsplits - 2] = 3;
      splits[nsplits - 1] = 3;
      const std::size_t rows = 8 * static_cast<std::size_t>(n);
      DeviceFloats input(backend, runtime, rows * kRowFloats, symmetric);
      DeviceFloats output(backend, runtime, rows * kRowFloats, symmetric);
      const std::vector<float> untouched(rows * kRowFloats, -1.0F);
      output.Set(untouched);
      input.Set(std::vector<float>(rows * kRowFloats, static_cast<float>(rank)));
      const DeviceInts in_splits(backend, splits);
      const DeviceInts out_table(backend, std::vector<std::int64_t>(2 * nsplits, -7));
      MoeExchangeArgs x = Args("moe_dispatch", t, MoeDirection::kDispatch, 2, input, output, in_splits, nullptr,
                               out_table, nsplits);
      x.major_align = 1;
      if (rank == last) x.output_rows = 4 * n;
      const std::string expected = "moe_dispatch: `out` of rank " + std::to_string(last) + " must hold the " +
                                   std::to_string(6 * n) + " rows its peers send (the overflow starts at expert " +
                                   std::to_string(2 * last + 1) + ", local expert 1 of rank " + std::to_string(last) +
                                   "), but got " + std::to_string(4 * n) +
                                   " rows (every rank raises; nothing was written)";
      EXPECT_TRUE(HasError(runtime.MoeExchange(x, kDefaultStream, nullptr), StatusCode::kInvalidArgument, expected));
      EXPECT_EQ(out_table.Get(), std::vector<std::int64_t>(2 * nsplits, -7));
      EXPECT_EQ(output.Get(), untouched);
      // The team stays in step: the same exchange with room for everything goes through.
      x.output_rows = static_cast<std::int64_t>(rows);
      ASSERT_TRUE(IsOk(runtime.MoeExchange(x, kDefaultStream, nullptr)));
      const std::vector<std::int64_t> out = out_table.Get();
      std::int64_t got = 0;
      for (std::size_t i = 0; i < nsplits; ++i) got += out[i];
      EXPECT_EQ(got, rank == last ? 6 * n : 2 * n);
    }
  });
}

// Bad splits of one rank fail on every rank, before anything is written, whether its `input` is symmetric or not.
inline void RunMoeBadCalls(const CollectiveBackend& backend, int world) {
  using namespace moe;
  RunOnRootTeam(backend, world, [&](int rank, Runtime& runtime, std::uint64_t t) {
    const std::size_t nsplits = static_cast<std::size_t>(world);
    const std::size_t rows = 2 * nsplits;   // room for one row to every rank, and more
    DeviceFloats input(backend, runtime, rows * kRowFloats, true);
    DeviceFloats output(backend, runtime, 8 * kRowFloats * nsplits, true);
    const DeviceInts out_table(backend, std::vector<std::int64_t>(2 * nsplits, -7));
    DeviceInts in_splits(backend, std::vector<std::int64_t>(nsplits, 1));
    const MoeExchangeArgs x = Args("moe_dispatch", t, MoeDirection::kDispatch, 1, input, output, in_splits, nullptr,
                                   out_table, nsplits);
    std::vector<std::int64_t> negative(nsplits, 1);
    if (rank == 0) negative[nsplits - 1] = -1;
    in_splits.Set(negative);
    EXPECT_TRUE(HasError(runtime.MoeExchange(x, kDefaultStream, nullptr), StatusCode::kInvalidArgument,
                         "moe_dispatch: `in_splits` must be non-negative, but got in_splits[" +
                             std::to_string(nsplits - 1) + "]=-1 on rank 0"));
    std::vector<std::int64_t> past(nsplits, 1);
    if (rank == world - 1) past[0] = static_cast<std::int64_t>(rows);
    in_splits.Set(past);
    EXPECT_TRUE(HasError(runtime.MoeExchange(x, kDefaultStream, nullptr), StatusCode::kInvalidArgument,
                         "moe_dispatch: the chunks of `in_splits` must lie inside `input` (" + std::to_string(rows) +
                             " rows), but got chunk 1 ending at row " + std::to_string(rows + 1) + " on rank " +
                             std::to_string(world - 1)));
    EXPECT_EQ(out_table.Get(), std::vector<std::int64_t>(2 * nsplits, -7));
    // The same with rank 1's `input` an ordinary tensor: refused alike, then it goes through.
    DeviceFloats local(backend, runtime, rows * kRowFloats, false);
    MoeExchangeArgs ordinary = x;
    if (rank == 1) ordinary.input = local.data();
    in_splits.Set(negative);
    EXPECT_TRUE(HasError(runtime.MoeExchange(ordinary, kDefaultStream, nullptr), StatusCode::kInvalidArgument,
                         "moe_dispatch: `in_splits` must be non-negative, but got in_splits[" +
                             std::to_string(nsplits - 1) + "]=-1 on rank 0"));
    EXPECT_EQ(out_table.Get(), std::vector<std::int64_t>(2 * nsplits, -7));
    in_splits.Set(std::vector<std::int64_t>(nsplits, 1));
    ASSERT_TRUE(IsOk(runtime.MoeExchange(ordinary, kDefaultStream, nullptr)));
    EXPECT_EQ(out_table.Get()[0], 1);
    ASSERT_TRUE(IsOk(runtime.MoeExchange(x, kDefaultStream, nullptr)));
    EXPECT_EQ(out_table.Get()[0], 1);
  });
}

// Ranks that disagree about the call (dispatch against combine, another number of experts, another role) all raise
// ShmemMismatchError naming the field before anything is written, and the team stays in step.
inline void RunMoeMismatch(const CollectiveBackend& backend, int world) {
  using namespace moe;
  RunOnRootTeam(backend, world, [&](int rank, Runtime& runtime, std::uint64_t t) {
    const int last = world - 1;
    const int experts = rank == last ? 2 : 1;   // for the call whose row length differs
    const std::size_t most = static_cast<std::size_t>(world) * 2;
    const std::size_t rows = 4 * most;
    DeviceFloats input(backend, runtime, rows * kRowFloats, true);
    DeviceFloats output(backend, runtime, rows * kRowFloats, true);
    const std::vector<float> untouched(rows * kRowFloats, -1.0F);
    output.Set(untouched);
    const DeviceInts in_splits(backend, std::vector<std::int64_t>(most, 1));
    const DeviceInts out_table(backend, std::vector<std::int64_t>(2 * most, -7));
    const std::size_t nsplits = static_cast<std::size_t>(world);
    const MoeExchangeArgs agreed = Args("moe_dispatch", t, MoeDirection::kDispatch, 1, input, output, in_splits,
                                        nullptr, out_table, nsplits);
    MoeExchangeArgs combine = agreed;
    if (rank == last) {
      combine.op = "moe_combine";
      combine.direction = MoeDirection::kCombine;
    }
    MoeExchangeArgs more_experts = Args("moe_dispatch", t, MoeDirection::kDispatch, experts, input, output,
                                        in_splits, nullptr, out_table, nsplits * static_cast<std::size_t>(experts));
    MoeExchangeArgs backward = agreed;
    if (rank == last) backward.role = CallRole::kBackward;
    const std::vector<std::pair<std::string, MoeExchangeArgs>> calls = {
        {"collective", combine}, {"count", more_experts}, {"role", backward}};
    for (const auto& [field, x] : calls) {
      SCOPED_TRACE(field);
      EXPECT_TRUE(HasError(runtime.MoeExchange(x, kDefaultStream, nullptr), StatusCode::kMismatch,
                           "ranks disagree on a collective (" + field + ")"));
      EXPECT_EQ(out_table.Get(), std::vector<std::int64_t>(2 * most, -7));
      EXPECT_EQ(output.Get(), untouched);
    }
    // The team stays in step: the agreed call goes through.
    ASSERT_TRUE(IsOk(runtime.MoeExchange(agreed, kDefaultStream, nullptr)));
    EXPECT_EQ(out_table.Get()[0], 1);
  });
}

}  // namespace hp::shmem::testutil
