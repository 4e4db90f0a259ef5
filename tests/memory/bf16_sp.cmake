# bf16 at sp 2 with the tiled MLP and loss against the fp32 run;
# include()'d from tests/memory/CMakeLists.txt.
ulysses_test(bf16_sp_tests SOURCES bf16_sp_test.cpp DEPS ulysses_train_lib LABELS memory TIMEOUT 300)
