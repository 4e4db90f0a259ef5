#!/usr/bin/env python3
"""Writes a small Nsight Systems SQLite export by hand (the tables `ulysses-tune profile` and
scripts/campaign/nsys_syncs.py read) with known contents, for the campaign's dry run under
fake_nsys.sh. Times in ms in the comments; the file stores ns.

One thread, domain "ulysses": step 1 [0, 10) (warmup), step 2 [10, 30), step 3 [30, 50).
Warmup step: 5 cudaStreamSynchronize (left out). Each measured step: 2 cudaStreamSynchronize,
1 cudaEventSynchronize, 1 cudaMemcpyAsync device-to-host (4 ms, 1 MiB), 1 cudaMemcpyAsync
host-to-device (3 ms, 2 MiB), one compute kernel (8 ms) and one NCCL kernel (2 ms).
Expected per measured step: host syncs 3, D2H copy calls 1, D2H 4 ms, H2D 3 ms.
Usage: nsys_sync_fixture.py OUT.sqlite
"""
import sqlite3
import sys

MS = 1_000_000
db = sqlite3.connect(sys.argv[1])
db.executescript("""
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
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (
  start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER, globalTid INTEGER,
  correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER, callchainId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (
  start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER, contextId INTEGER,
  streamId INTEGER, correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL,
  copyKind INTEGER NOT NULL, srcKind INTEGER, dstKind INTEGER);
INSERT INTO StringIds VALUES
  (1, 'step'), (2, 'sm90_xmma_gemm_bf16'), (3, 'ncclDevKernel_SendRecv'),
  (10, 'cudaStreamSynchronize_v3020'), (11, 'cudaEventSynchronize_v3020'),
  (12, 'cudaMemcpyAsync_v3020'), (13, 'cudaLaunchKernel_v7000');
INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId, domainId) VALUES
  (0, NULL, 75, 'ulysses', 1, NULL, 1);
""")
corr = 100
for step, (start, end) in enumerate([(0, 10), (10, 30), (30, 50)], 1):
    db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, textId, domainId, "
               "int64Value) VALUES (?, ?, 59, 1, 1, 1, ?)", (start * MS, end * MS, step))
    t = start * MS
    if step == 1:
        for i in range(5):
            db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, 1, ?, 10, 0, 0)",
                       (t + i * 1000, t + i * 1000 + 500, corr))
            corr += 1
        continue
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, "
               "streamId, demangledName, shortName) VALUES (?, ?, 0, 1, 7, 2, 2)",
               (t + 1 * MS, t + 9 * MS))
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, "
               "streamId, demangledName, shortName) VALUES (?, ?, 0, 1, 9, 3, 3)",
               (t + 9 * MS, t + 11 * MS))
    for offset, name in ((1, 10), (2, 10), (3, 11)):
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, 1, ?, ?, 0, 0)",
                   (t + offset * MS, t + offset * MS + 1000, corr, name))
        corr += 1
    for offset, kind, ms, nbytes in ((4, 2, 4, 1 << 20), (12, 1, 3, 2 << 20)):
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, 1, ?, 12, 0, 0)",
                   (t + offset * MS, t + offset * MS + 1000, corr))
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, 0, 1, 11, ?, 1, ?, ?, 0, 0)",
                   (t + offset * MS, t + (offset + ms) * MS, corr, nbytes, kind))
        corr += 1
db.commit()
db.execute("PRAGMA journal_mode=DELETE")
db.close()
