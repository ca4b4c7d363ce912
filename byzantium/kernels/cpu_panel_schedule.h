// How the panel GEMMs (cpu_gemm.cpp) share a prefill-sized product between threads.
//
// Each panel reads every row of x once, so with the rows in one piece x streams from L3 once per panel.
// Here the rows go in chunks whose slice of x fits in L2 with room to spare, each chunk's panels in order,
// and the threads take (chunk, a few panels) units from a shared counter: a core that the machine slows
// down does less of the work instead of keeping the other waiting at the end. An output is computed by one
// block whichever thread takes it, so the result does not depend on the schedule. Decode-sized products
// (fewer than SCHEDULE_MIN_ROWS rows) keep the static split: there the weights stream from memory and a
// thread's contiguous run of panels, each prefetching the next, is what counts.
#pragma once
#include <ATen/Parallel.h>
#include <algorithm>
#include <atomic>
#include <cstdint>

constexpr int64_t SCHEDULE_MIN_ROWS = 256;

// fn(p, m0, rows, prefetch_next) for every panel p and chunk [m0, m0 + rows) of the M rows; `row_bytes`:
// one row of x, `block_rows`: the kernel's rows per block (chunks are whole blocks).
template <typename F>
static void for_panel_chunks(int64_t M, int64_t row_bytes, int64_t block_rows, int64_t panels, F fn) {
  const int64_t chunk = std::max<int64_t>(4 * block_rows, (256 * 1024 / row_bytes) / block_rows * block_rows);
  const int64_t chunks = (M + chunk - 1) / chunk, group = std::min<int64_t>(panels, 4);
  const int64_t groups = (panels + group - 1) / group, units = chunks * groups;
  std::atomic<int64_t> next_unit{0};
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), units), 1, [&](int64_t, int64_t) {
    for (int64_t u; (u = next_unit.fetch_add(1)) < units;) {
      const int64_t m0 = u / groups * chunk, rows = std::min(chunk, M - m0);
      const int64_t p0 = u % groups * group, p1 = std::min(panels, p0 + group);
      for (int64_t p = p0; p < p1; ++p) fn(p, m0, rows, p + 1 < p1);
    }
  });
}
