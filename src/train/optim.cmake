# The optimizer area of src/train (AdamW, LR schedules, gradient clipping); include()'d from
# src/train/CMakeLists.txt.
ulysses_library(ulysses_optim SOURCES adamw.cpp lr_schedule.cpp grad_clip.cpp DEPS ulysses_common ulysses_config)
