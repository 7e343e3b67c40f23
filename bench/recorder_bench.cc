// The flight recorder's own work per operation, timed in a loop (Google Benchmark): the part
// of recording's cost that does not depend on the machine's load, and a bound for what an
// all-reduce pays with recording on.
//
//  * ScheduleOp/records:2000: what the executor calls for one operation on the schedule path
//    (ring, tree, TCP) with one receiving peer: begin, the first data from the peer, the peers
//    seen in its stamp, the earliest and latest entries, end. ScheduleOp/records:0: recording
//    off (LOOM_FLIGHT_RECORDER=0), where begin returns null and end returns at once.
//  * DirectOp/N: the direct all-reduce of N ranks: begin, N - 1 first arrivals under one clock
//    read, every rank's entry time, end.
//  * ClockRead: one CLOCK_MONOTONIC read, the unit of the costs above.
//
// Not included: the stamp (32 bytes) a sender copies into the first slot of an operation to
// each peer, and the caller's own begin/end bookkeeping around the recorder.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "trace/recorder.h"
#include "util/status.h"
#include "util/wait.h"

namespace loom::trace {
namespace {

OpRecord* beginOp(FlightRecorder& rec, uint64_t seq) {
  return rec.begin(seq, "allreduce", 2, 7, 0, -1);
}

// Capacity 2000: recording on; 0: off, where the executor skips every call but begin and end.
void ScheduleOp(benchmark::State& state) {
  FlightRecorder rec(static_cast<size_t>(state.range(0)), 0, 2);
  uint64_t seq = 0;
  for (auto _ : state) {
    OpRecord* r = beginOp(rec, ++seq);
    if (r != nullptr) {
      FlightRecorder::noteFirstArrival(r, 1);
      rec.notePeerSeen(1, seq);  // the sender, and the earliest and latest ranks its stamp names
      rec.notePeerSeen(0, seq);
      rec.notePeerSeen(1, seq);
      rec.noteExtremes(r, 0, r->enterNs, 1, r->enterNs + 100);
    }
    rec.end(r, Status::ok());
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(ScheduleOp)->ArgName("records")->Arg(2000)->Arg(0);

void DirectOp(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  FlightRecorder rec(2000, 0, n);
  std::vector<int64_t> enters(static_cast<size_t>(n));
  uint64_t seq = 0;
  for (auto _ : state) {
    OpRecord* r = beginOp(rec, ++seq);
    const int64_t seen = nowNs();
    for (int q = 1; q < n; ++q) FlightRecorder::noteFirstArrivalAt(r, q, seen);
    for (int q = 0; q < n; ++q) enters[static_cast<size_t>(q)] = r->enterNs + q;
    rec.noteArrivals(r, enters);
    rec.end(r, Status::ok());
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(DirectOp)->Arg(2)->Arg(4)->Arg(8);

void ClockRead(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(nowNs());
}
BENCHMARK(ClockRead);

}  // namespace
}  // namespace loom::trace

BENCHMARK_MAIN();
