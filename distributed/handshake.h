// The tensor-parallel handshake: before a rank loads or runs anything, every rank of the group
// tells every other its tp_size, tp_rank and model, so a launch whose ranks disagree fails on
// every rank with one message listing each rank's values, instead of hanging in a collective.
#pragma once

#include <cstdint>
#include <string>

#include "distributed/collectives.h"

namespace metaload {

struct TpIdentity {
  int64_t tp_size = 1;
  int64_t tp_rank = 0;
  // What the rank runs: class, config fingerprint and dtype; equal ranks run the same model.
  std::string model;
};

// All-gathers every rank's identity and checks that all ranks have tp_size == the group's size,
// tp_rank == their rank in the group, and the same model. DistributedError listing every rank's
// values otherwise (the same message on every rank), or when the all-gather fails or times out.
void check_tp_agreement(Collectives& group, const TpIdentity& mine);

// A vote on a step every rank must take together or not at all (a tensor-parallel dispatch):
// each rank says how its part went (`my_failure`, "" when it succeeded). Returns on every rank
// only when every rank succeeded; otherwise every rank raises the same DistributedError naming
// `step` and each failed rank's message, and a rank that died or went silent fails the vote
// within the group's timeout (DistributedError naming the step), never a hang.
void agree_on_outcome(Collectives& group, const std::string& step, const std::string& my_failure);

}  // namespace metaload
