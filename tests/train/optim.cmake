# Tests of AdamW, LR schedules and gradient clipping; include()'d from tests/train/CMakeLists.txt.
ulysses_test(optim_tests SOURCES optim_test.cpp DEPS ulysses_optim LABELS train)
# The numerical cases again with the host pass and ATen capped to each lower instruction set.
ulysses_isa_variants(optim_tests FILTER "AdamW.*:FusedAdamW.*:HostGradientNorm.*:ClipGradNorm.*"
                     TIMEOUT 300 LABELS train)
