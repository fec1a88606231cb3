// test_dist's main: under mpirun every rank runs every test (collectives must match), then MPI is
// finalized; a failing rank aborts the job, so that no peer waits for it.
#include <gtest/gtest.h>

#include "distributed/communicator.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  return kiln::dist::finalize_world(rc);
}
