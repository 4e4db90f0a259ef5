# Tests of AdamW, LR schedules and gradient clipping; include()'d from tests/train/CMakeLists.txt.
ulysses_test(optim_tests SOURCES optim_test.cpp DEPS ulysses_optim LABELS train)
