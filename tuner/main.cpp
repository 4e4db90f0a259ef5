// ulysses-tune: the tuner's command line. Each subcommand lives in its own tuner/<area>/ library;
// this file only wires them into CLI11 and maps errors to exit statuses (common/error.h).
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>

#include "comm/exit_status.h"
#include "common/build_info.h"
#include "common/error.h"
#include "tuner/calibrate/calibrate_command.h"
#include "tuner/launch/launch_command.h"
#include "tuner/plan/plan_command.h"
#include "tuner/nsys_profile/profile_command.h"
#include "tuner/recommend/recommend_command.h"
#include "tuner/report/list_show_command.h"
#include "tuner/report/report_command.h"
#include "tuner/sweep/sweep_command.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{
      "ulysses-tune: find, launch and explain long-context training configurations "
      "(DeepSpeed-Ulysses sequence parallelism + ALST memory features)",
      "ulysses-tune"};
  app.require_subcommand(1);
  app.set_version_flag("--version", ulysses::build_info("ulysses-tune"),
                       "Print the version, LibTorch version and compiled-in backends");
  app.footer(
      "Run `ulysses-tune COMMAND --help` for a command's options.\n"
      "Sweeps run trials as local processes (`runner: local`) or as SLURM job steps inside an\n"
      "allocation (`runner: srun`; `sweep --submit` sbatches the sweep). Reference: docs/.\n");

  ulysses::sweep::SweepOptions sweep_options;
  CLI::App* sweep = ulysses::sweep::add_sweep_command(app, &sweep_options);
  ulysses::recommend::RecommendOptions recommend_options;
  CLI::App* recommend = ulysses::recommend::add_recommend_command(app, &recommend_options);
  ulysses::recommend::ExportOptions export_options;
  CLI::App* export_cmd = ulysses::recommend::add_export_command(app, &export_options);
  ulysses::report::ReportOptions report_options;
  CLI::App* report = ulysses::report::add_report_command(app, &report_options);
  ulysses::report::ListOptions list_options;
  CLI::App* list = ulysses::report::add_list_command(app, &list_options);
  ulysses::report::ShowOptions show_options;
  CLI::App* show = ulysses::report::add_show_command(app, &show_options);
  ulysses::launch::LaunchOptions launch_options;
  CLI::App* launch = ulysses::launch::add_launch_command(app, &launch_options);
  ulysses::calibrate::CalibrateOptions calibrate_options;
  CLI::App* calibrate = ulysses::calibrate::add_calibrate_command(app, &calibrate_options);
  ulysses::nsys_profile::ProfileOptions profile_options;
  CLI::App* profile = ulysses::nsys_profile::add_profile_command(app, &profile_options);
  ulysses::plan::PlanOptions plan_options;
  CLI::App* plan = ulysses::plan::add_plan_command(app, &plan_options);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);  // prints help, or CLI11's message to stderr
    return status == 0 ? ulysses::kExitOk : ulysses::kExitUsage;
  }
  if (sweep->parsed()) return ulysses::sweep::run_sweep(sweep_options);
  if (recommend->parsed()) return ulysses::recommend::run_recommend(recommend_options);
  if (export_cmd->parsed()) return ulysses::recommend::run_export(export_options);
  if (report->parsed()) return ulysses::report::run_report(report_options);
  if (list->parsed()) return ulysses::report::run_list(list_options);
  if (show->parsed()) return ulysses::report::run_show(show_options);
  if (launch->parsed()) return ulysses::launch::run_launch(launch_options);
  if (calibrate->parsed()) return ulysses::calibrate::run_calibrate(calibrate_options);
  if (profile->parsed()) return ulysses::nsys_profile::run_profile(profile_options);
  if (plan->parsed()) return ulysses::plan::run_plan(plan_options);
  return ulysses::kExitUsage;  // unreachable: require_subcommand(1)
}

}  // namespace

int main(int argc, char** argv) {
  return ulysses::comm::run_with_exit_status([&] { return run(argc, argv); });
}
