// ulysses-tune: the tuner's command line. Each subcommand lives in its own tuner/<area>/ library;
// this file only wires them into CLI11 and maps errors to exit statuses (common/error.h).
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>

#include "comm/exit_status.h"
#include "common/error.h"
#include "tuner/calibrate/calibrate_command.h"
#include "tuner/launch/launch_command.h"
#include "tuner/profile_cmd/profile_command.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{
      "ulysses-tune: find, launch and explain long-context training configurations "
      "(DeepSpeed-Ulysses sequence parallelism + ALST memory features)",
      "ulysses-tune"};
  app.require_subcommand(1);
  app.footer("Run `ulysses-tune COMMAND --help` for a command's options.");

  ulysses::launch::LaunchOptions launch_options;
  CLI::App* launch = ulysses::launch::add_launch_command(app, &launch_options);
  ulysses::calibrate::CalibrateOptions calibrate_options;
  CLI::App* calibrate = ulysses::calibrate::add_calibrate_command(app, &calibrate_options);
  ulysses::profile_cmd::ProfileOptions profile_options;
  CLI::App* profile = ulysses::profile_cmd::add_profile_command(app, &profile_options);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);  // prints help, or CLI11's message to stderr
    return status == 0 ? ulysses::kExitOk : ulysses::kExitUsage;
  }
  if (launch->parsed()) return ulysses::launch::run_launch(launch_options);
  if (calibrate->parsed()) return ulysses::calibrate::run_calibrate(calibrate_options);
  if (profile->parsed()) return ulysses::profile_cmd::run_profile(profile_options);
  return ulysses::kExitUsage;  // unreachable: require_subcommand(1)
}

}  // namespace

int main(int argc, char** argv) {
  return ulysses::comm::run_with_exit_status([&] { return run(argc, argv); });
}
