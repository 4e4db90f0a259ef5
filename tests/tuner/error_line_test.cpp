// The line a failed trial stores as its error (tuner/trial/classify.h: last_nonempty_line): our
// ranks' one-line errors as they are; from a Python rank's stderr the error itself, not the tqdm
// progress, warnings or traceback frames printed around it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "support/test_files.h"
#include "tuner/trial/classify.h"

namespace ulysses::trial {
namespace {

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A DeepSpeed rank's stderr when it failed: its logs, a warning, a traceback, the one line
// ds_trial.py prints last.
const std::string kTraceback =
    "[2026-11-26 19:24:48,258] [WARNING] [real_accelerator.py:213:get_accelerator] Setting "
    "accelerator to CPU.\n"
    "/venv/lib/python3.11/site-packages/torch/x.py:12: UserWarning: something old\n"
    "  warnings.warn(\n"
    "Traceback (most recent call last):\n"
    "  File \"/repo/ds_trial.py\", line 512, in <module>\n"
    "    main()\n"
    "    ^^^^^^\n"
    "RuntimeError: Error building extension 'cpu_adam'\n"
    "error: RuntimeError: Error building extension 'cpu_adam'\n";

// tqdm's progress: bars rewritten in place by carriage returns, ended by a newline.
const std::string kBars =
    "Loading checkpoint shards:   0%|          | 0/2 [00:00<?, ?it/s]\r"
    "Loading checkpoint shards:  50%|#####     | 1/2 [00:01<00:01,  1.02s/it]\r"
    "Loading checkpoint shards: 100%|##########| 2/2 [00:02<00:00,  1.01s/it]\n";

TEST(ErrorLine, NativeOneLineErrorsAreKept) {
  for (const std::string line :
       {"error: run.yaml: model.hidden_size: must be divisible by model.num_heads",
        "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB",
        "error: communication failed: rank 1 lost its connection (Connection reset by peer)",
        "error: unknown exception"}) {
    EXPECT_EQ(error_line_of(line + "\n"), line);
    EXPECT_EQ(error_line_of(line), line);  // no newline
    // c10's warnings before it change nothing.
    EXPECT_EQ(error_line_of("[W1126 19:24:48.258 ProcessGroupGloo.cpp:12] Warning: slow\n" + line +
                            "\n\n"),
              line);
  }
}

TEST(ErrorLine, ProgressAfterTheErrorIsSkipped) {
  EXPECT_EQ(error_line_of(kTraceback + kBars),
            "error: RuntimeError: Error building extension 'cpu_adam'");
  // A bar left without its newline, then blank lines.
  EXPECT_EQ(error_line_of("error: the real one\n  3%|3         | 1/30 [00:01<00:29]\n\n \n"),
            "error: the real one");
  // The error printed on the line a bar had left.
  EXPECT_EQ(error_line_of(" 50%|#####     | 1/2 [00:01<00:01,  1.02s/it]error: after the bar\n"),
            "error: after the bar");
  // Carriage-return line ends (CRLF) are not progress.
  EXPECT_EQ(error_line_of("error: windows line\r\n"), "error: windows line");
}

TEST(ErrorLine, TheExceptionIsPreferredOverLaterLines) {
  // The traceback without our closing line, then a log line and a warning.
  const std::string text =
      "Traceback (most recent call last):\n"
      "  File \"x.py\", line 3, in <module>\n"
      "torch.OutOfMemoryError: CUDA out of memory\n"
      "[2026-11-26 19:30:00,001] [INFO] [engine.py:12:destroy] destroying the engine\n"
      "/x.py:3: FutureWarning: soon\n";
  EXPECT_EQ(error_line_of(text), "torch.OutOfMemoryError: CUDA out of memory");
  EXPECT_EQ(error_line_of("KeyboardInterrupt\n"), "KeyboardInterrupt");
  EXPECT_EQ(error_line_of("[rank1]: RuntimeError: gloo timed out\n[rank1]:   File \"a.py\"\n"),
            "[rank1]: RuntimeError: gloo timed out");
  // c10's frames after the exception line.
  EXPECT_EQ(error_line_of("RuntimeError: bad shape\nException raised from f at a.cpp:3\n"
                          "frame #0: c10::Error::Error() + 0x10\n"),
            "RuntimeError: bad shape");
}

TEST(ErrorLine, WithoutAnErrorTheLastMeaningfulLine) {
  EXPECT_EQ(error_line_of("started\nstep 3 of 10\n" + kBars), "step 3 of 10");
  // Only warnings: the last of them, rather than nothing.
  EXPECT_EQ(error_line_of("UserWarning: a\nwarning: the last\n"), "warning: the last");
  // A warning and the code line Python prints under it: the warning.
  EXPECT_EQ(error_line_of("/x/y.py:3: FutureWarning: old\n  return func(*args, **kwargs)\n"),
            "/x/y.py:3: FutureWarning: old");
  EXPECT_EQ(error_line_of(kBars), "");
  EXPECT_EQ(error_line_of("\n \n\t\n"), "");
  EXPECT_EQ(error_line_of(""), "");
  // Words that merely contain "error" are not errors.
  EXPECT_EQ(error_line_of("MyErrorHandler ready\nnot an error here\n"), "not an error here");
}

TEST(ErrorLine, FromTheFilesTail) {
  testing::TempDir temp;
  const std::filesystem::path path = temp.path() / "rank0.err";
  write_text(path, std::string(200000, 'x') + "\n" + kTraceback + kBars);
  EXPECT_EQ(last_nonempty_line(path.string()),
            "error: RuntimeError: Error building extension 'cpu_adam'");
  write_text(path, "error: run.yaml: bad\n");
  EXPECT_EQ(last_nonempty_line(path.string()), "error: run.yaml: bad");
  EXPECT_EQ(last_nonempty_line((temp.path() / "missing").string()), "");
}

}  // namespace
}  // namespace ulysses::trial
