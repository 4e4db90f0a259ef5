// detect_dist_env on injected environments: torchrun, SLURM, Open MPI, none, malformed values.
#include "comm/dist_env.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "common/error.h"

namespace ulysses::comm {
namespace {

using Vars = std::map<std::string, std::string>;

DistEnv detect(const Vars& vars) { return detect_dist_env(env_from_map(vars)); }

// Expects a UserError whose message starts with "<variable>:".
void expect_error_naming(const Vars& vars, const std::string& variable) {
  try {
    detect(vars);
    ADD_FAILURE() << "no error; expected one naming " << variable;
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(variable + ":", 0), 0u) << e.what();
  }
}

// torchrun's agent serves the store (every torchrun form of PyTorch 2.x sets this).
TEST(DistEnv, TorchrunAgentStore) {
  const Vars base = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29400"}};
  EXPECT_FALSE(detect(base).agent_store);
  Vars agent = base;
  agent["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  agent["TORCHELASTIC_RESTART_COUNT"] = "2";
  const DistEnv env = detect(agent);
  EXPECT_TRUE(env.agent_store);
  EXPECT_EQ(env.restart_count, 2);
  EXPECT_NE(describe(env).find("(agent store)"), std::string::npos) << describe(env);
  agent["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_FALSE(detect(agent).agent_store);
  agent["TORCHELASTIC_RESTART_COUNT"] = "x";
  expect_error_naming(agent, "TORCHELASTIC_RESTART_COUNT");
}

TEST(DistEnv, NoLauncherIsAWorldOfOne) {
  const DistEnv env = detect({});
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_EQ(env.source, "single");
}

TEST(DistEnv, Torchrun) {
  const DistEnv env = detect({{"RANK", "3"},
                              {"WORLD_SIZE", "8"},
                              {"LOCAL_RANK", "1"},
                              {"LOCAL_WORLD_SIZE", "2"},
                              {"MASTER_ADDR", "10.1.2.3"},
                              {"MASTER_PORT", "1234"}});
  EXPECT_EQ(env.source, "torchrun");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "10.1.2.3");
  EXPECT_EQ(env.master_port, 1234);
  EXPECT_EQ(describe(env), "rank 3 of 8 (local 1 of 2, torchrun), master 10.1.2.3:1234");
}

TEST(DistEnv, TorchrunWithoutLocalValuesAssumesOneNode) {
  const DistEnv env = detect({{"RANK", "2"}, {"WORLD_SIZE", "4"}});
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
}

TEST(DistEnv, TorchrunTakesPrecedenceOverSlurmAndOpenMpi) {
  const DistEnv env = detect({{"RANK", "1"},
                              {"WORLD_SIZE", "2"},
                              {"SLURM_PROCID", "5"},
                              {"SLURM_NTASKS", "8"},
                              {"OMPI_COMM_WORLD_RANK", "3"},
                              {"OMPI_COMM_WORLD_SIZE", "4"}});
  EXPECT_EQ(env.source, "torchrun");
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 2);
}

TEST(DistEnv, Slurm) {
  const DistEnv env = detect({{"SLURM_PROCID", "5"},
                              {"SLURM_NTASKS", "8"},
                              {"SLURM_LOCALID", "1"},
                              {"SLURM_NTASKS_PER_NODE", "4"},
                              {"SLURM_JOB_NODELIST", "gpu[07-08]"},
                              {"SLURM_JOB_ID", "123456"},
                              {"OMPI_COMM_WORLD_RANK", "0"},
                              {"OMPI_COMM_WORLD_SIZE", "1"}});
  EXPECT_EQ(env.source, "slurm");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.master_addr, "gpu07");
  EXPECT_EQ(env.master_port, 20000 + 3456);  // 20000 + job id % 10000
}

TEST(DistEnv, SlurmTasksPerNodeListAndNodeListForms) {
  // 4(x2),2 expands to nodes {4, 4, 2}; node 2 has 2 tasks.
  DistEnv env = detect({{"SLURM_PROCID", "9"},
                        {"SLURM_NTASKS", "10"},
                        {"SLURM_LOCALID", "1"},
                        {"SLURM_NODEID", "2"},
                        {"SLURM_TASKS_PER_NODE", "4(x2),2"},
                        {"SLURM_NODELIST", "nodeA,nodeB"}});
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "nodeA");
  EXPECT_EQ(env.master_port, 29500);

  env = detect({{"SLURM_PROCID", "0"},
                {"SLURM_NTASKS", "2"},
                {"SLURM_JOB_NODELIST", "rack[3,5-6]-gpu,login1"}});
  EXPECT_EQ(env.master_addr, "rack3-gpu");
  EXPECT_EQ(env.local_world_size, 2);  // unknown per-node count: one node assumed

  env = detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_NODELIST", "solo"}});
  EXPECT_EQ(env.master_addr, "solo");
}

TEST(DistEnv, MasterVariablesOverrideSlurm) {
  const DistEnv env = detect({{"SLURM_PROCID", "0"},
                              {"SLURM_NTASKS", "2"},
                              {"SLURM_JOB_NODELIST", "gpu[01-02]"},
                              {"SLURM_JOB_ID", "77"},
                              {"MASTER_ADDR", "head"},
                              {"MASTER_PORT", "4000"}});
  EXPECT_EQ(env.master_addr, "head");
  EXPECT_EQ(env.master_port, 4000);
}

TEST(DistEnv, OpenMpi) {
  const DistEnv env = detect({{"OMPI_COMM_WORLD_RANK", "2"},
                              {"OMPI_COMM_WORLD_SIZE", "4"},
                              {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                              {"MASTER_ADDR", "n1"}});
  EXPECT_EQ(env.source, "openmpi");
  EXPECT_EQ(env.rank, 2);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "n1");
  EXPECT_EQ(env.master_port, 29500);
}

TEST(DistEnv, MalformedValuesNameTheVariable) {
  expect_error_naming({{"RANK", "abc"}, {"WORLD_SIZE", "2"}}, "RANK");
  expect_error_naming({{"RANK", " 1"}, {"WORLD_SIZE", "2"}}, "RANK");
  expect_error_naming({{"RANK", "1x"}, {"WORLD_SIZE", "2"}}, "RANK");
  expect_error_naming({{"RANK", "4"}, {"WORLD_SIZE", "4"}}, "RANK");
  expect_error_naming({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}, "RANK");
  expect_error_naming({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE");
  expect_error_naming({{"RANK", "0"}}, "WORLD_SIZE");
  expect_error_naming({{"WORLD_SIZE", "2"}}, "RANK");
  expect_error_naming({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}}, "WORLD_SIZE");
  expect_error_naming(
      {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
      "LOCAL_RANK");
  expect_error_naming({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}},
                      "MASTER_PORT");
  expect_error_naming({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", ""}}, "MASTER_ADDR");
  expect_error_naming({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "x"}}, "SLURM_NTASKS");
  expect_error_naming({{"SLURM_PROCID", "0"}}, "SLURM_NTASKS");
  expect_error_naming({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "2"}}, "SLURM_PROCID");
  expect_error_naming(
      {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_TASKS_PER_NODE", "2(x"}},
      "SLURM_TASKS_PER_NODE");
  expect_error_naming(
      {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "gpu[01-02"}},
      "SLURM_JOB_NODELIST");
  expect_error_naming({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "j7"}},
                      "SLURM_JOB_ID");
  expect_error_naming({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
                      "OMPI_COMM_WORLD_RANK");
  expect_error_naming({{"OMPI_COMM_WORLD_RANK", "0"},
                       {"OMPI_COMM_WORLD_SIZE", "2"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}},
                      "OMPI_COMM_WORLD_LOCAL_SIZE");
}

TEST(DistEnv, ProcessEnvReadsTheRealEnvironment) {
  ::setenv("ULYSSES_COMM_TEST_VARIABLE", "42", 1);
  EXPECT_EQ(process_env("ULYSSES_COMM_TEST_VARIABLE"), std::optional<std::string>("42"));
  ::unsetenv("ULYSSES_COMM_TEST_VARIABLE");
  EXPECT_EQ(process_env("ULYSSES_COMM_TEST_VARIABLE"), std::nullopt);
}

}  // namespace
}  // namespace ulysses::comm
