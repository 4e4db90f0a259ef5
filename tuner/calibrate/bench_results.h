// Google Benchmark JSON as written by ulysses-bench (--benchmark_out_format=json) -> calibration
// rows for the store. One schema for every benchmark: per benchmark run, `time_ms` (the mean
// manual time of one iteration) and each ulysses-bench counter present: algbw_GBps and
// busbw_GBps (GB/s, bandwidth.h), tflops (TFLOP/s), GBps (GB/s). `params` is the name's
// key:value pieces as a JSON object ("AllToAll/bytes:1024/ranks:2" -> {"bytes":"1024",
// "ranks":"2"}). Aggregate entries (mean/median/stddev of repetitions) and runs that reported
// an error are skipped; Google Benchmark's "/manual_time" name suffix is dropped.
#pragma once
#include <string>
#include <vector>

#include "tuner/store/store.h"

namespace ulysses::calibrate {

// Throws UserError("<source>: ...") when `json_text` is not Google Benchmark JSON.
std::vector<store::Calibration> calibrations_from_bench_json(const std::string& json_text,
                                                             const std::string& source);

// The base of a benchmark name: "AllToAll/bytes:1024/ranks:2" -> "AllToAll".
std::string benchmark_family(const std::string& name);

}  // namespace ulysses::calibrate
