# Sequence tiling: sequence_tiled_compute, TiledMLP, TiledLogitsLoss against the plain
# path, alone and through train::compute_gradients on 1 and 2 Gloo ranks;
# include()'d from tests/memory/CMakeLists.txt.
ulysses_test(tiling_tests SOURCES tiling_test.cpp DEPS ulysses_train_lib LABELS memory TIMEOUT 300)
# add_matmul_'s ways of summing half products into an fp32 sum, against the fp64 reference.
ulysses_test(wide_matmul_tests SOURCES wide_matmul_test.cpp DEPS ulysses_sp LABELS memory TIMEOUT 60)
