// A small nsys SQLite export built by hand (the tables and columns `nsys export --type sqlite`
// writes that the ingest reads), with known comm / compute / overlap. Times in the comments
// are ms; the file stores ns.
//
// Thread 1 (rank 0, device 0), domain "ulysses" (id 1), registered "step" ranges (textId):
//   step 1 [0, 10) (warmup), step 2 [10, 30), step 3 [30, 50)
// Thread 2 (rank 1, device 1), same domain, plain-text "step" ranges at the same times.
// Domain "other" (id 2) has a "step" range [50, 100) that must be ignored.
// Device 0 kernels: compute [1, 5) (warmup), [12, 20), [22, 26), [40, 45), [55, 60) (outside);
//                   NCCL [18, 24), [28, 34)
//   -> window 40, comm 12, compute 17, overlap 4 ([18,20) + [22,24)), exposed 8, kernels 25
// Device 1 kernels: NCCL [10, 15) (only its demangled name says nccl), compute [15, 25)
//   -> window 40, comm 5, compute 10, overlap 0, kernels 15
#pragma once
#include <string>

#include "tuner/store/database.h"

namespace ulysses::testing {

inline void write_nsys_fixture(const std::string& path) {
  store::Database db = store::Database::open(path);
  db.exec(R"sql(
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
  start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER,
  globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL,
  mangledName INTEGER);
CREATE TABLE NVTX_EVENTS (
  start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
  category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER,
  textId INTEGER, domainId INTEGER, uint64Value INTEGER, int64Value INTEGER);
INSERT INTO StringIds VALUES
  (1, 'step'), (2, 'ampere_sgemm_128x64_nn'), (3, 'void gemm_kernel<float>(...)'),
  (4, 'ncclKernel_AllToAll_RING_LL_Sum_int8_t'), (5, 'ncclKernel_AllToAll_RING_LL(...)'),
  (6, 'sendrecv_kernel'), (7, 'ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)');
INSERT INTO NVTX_EVENTS
  (start, end, eventType, text, globalTid, textId, domainId, int64Value) VALUES
  (0, NULL, 75, 'ulysses', 1, NULL, 1, NULL),
  (0, NULL, 75, 'other', 1, NULL, 2, NULL),
  (0, 10000000, 59, NULL, 1, 1, 1, 1),
  (10000000, 30000000, 59, NULL, 1, 1, 1, 2),
  (30000000, 50000000, 59, NULL, 1, 1, 1, 3),
  (0, 10000000, 59, 'step', 2, NULL, 1, 1),
  (10000000, 30000000, 59, 'step', 2, NULL, 1, 2),
  (30000000, 50000000, 59, 'step', 2, NULL, 1, 3),
  (50000000, 100000000, 59, 'step', 1, NULL, 2, NULL),
  (12000000, 13000000, 59, 'a2a', 1, NULL, 1, NULL);
INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL
  (start, end, deviceId, contextId, streamId, demangledName, shortName) VALUES
  ( 1000000,  5000000, 0, 1, 7, 3, 2),
  (12000000, 20000000, 0, 1, 7, 3, 2),
  (22000000, 26000000, 0, 1, 7, 3, 2),
  (40000000, 45000000, 0, 1, 7, 3, 2),
  (55000000, 60000000, 0, 1, 7, 3, 2),
  (18000000, 24000000, 0, 1, 9, 5, 4),
  (28000000, 34000000, 0, 1, 9, 5, 4),
  (10000000, 15000000, 1, 2, 9, 7, 6),
  (15000000, 25000000, 1, 2, 7, 3, 2);
)sql");
  db.exec("PRAGMA journal_mode=DELETE");  // as nsys writes it: no WAL files beside it
}

}  // namespace ulysses::testing
