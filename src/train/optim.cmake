# The optimizer area of src/train (AdamW, LR schedules, gradient clipping); include()'d from
# src/train/CMakeLists.txt.
# The fused CPU AdamW kernel: its own flags (every fma written out, vectorizable sqrt), so no
# shared precompiled header (which is built with the tree's flags).
ulysses_library(ulysses_cpu_adam NO_PCH SOURCES cpu_adam.cpp DEPS ulysses_config)
target_compile_options(ulysses_cpu_adam PRIVATE -ffp-contract=off -fno-math-errno)
ulysses_library(ulysses_optim SOURCES adamw.cpp adamw_aten.cpp lr_schedule.cpp grad_clip.cpp
                DEPS ulysses_common ulysses_config ulysses_cpu_adam)
# The optimizer-offload benchmark (Google Benchmark; not a test): bench/optim_bench.cpp.
add_executable(optim_bench ${PROJECT_SOURCE_DIR}/bench/optim_bench.cpp)
target_link_libraries(optim_bench PRIVATE ulysses_optim benchmark::benchmark)
ulysses_common_flags(optim_bench)
