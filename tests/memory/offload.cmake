# Activation checkpointing + offload, optimizer offload, bf16 master weights and the memory limit;
# include()'d from tests/memory/CMakeLists.txt. The memory-limit test runs the
# ulysses-train binary.
ulysses_test(offload_tests SOURCES offload_test.cpp DEPS ulysses_train_lib LABELS memory TIMEOUT 600)
add_dependencies(offload_tests ulysses_train)
# The optimizer offload's numerical cases again with the host pass and ATen capped to each lower
# instruction set.
ulysses_isa_variants(offload_tests FILTER "OptimizerOffload.*:OffloadedTrainingRun.Offloaded*:MixedPrecision.*"
                     TIMEOUT 600 COST 60 LABELS memory)
# Page-locked host tensors and the warning when the driver refuses to lock them.
ulysses_test(pinned_host_tests SOURCES pinned_host_test.cpp DEPS ulysses_common LABELS memory TIMEOUT 60)
