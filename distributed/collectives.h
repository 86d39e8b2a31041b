// Bounded collectives on a c10d::ProcessGroup the caller made (torch.distributed's group in
// Python, any c10d group in C++: gloo on CPU, NCCL on CUDA): every wait has a timeout, and a rank
// that died, hangs or never joined gives a DistributedError naming the operation, this rank and
// the timeout instead of a hang. Once a collective has failed the group is unusable (the
// operation may still be pending inside c10d): later calls fail at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "distributed/errors.h"

namespace metaload {

using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;

// Long enough for a slow forward step on a big model, short enough that a dead rank is noticed.
constexpr std::chrono::milliseconds kDefaultCollectiveTimeout{std::chrono::minutes(5)};

class Collectives {
 public:
  // DistributedError for a null group or a timeout <= 0.
  Collectives(ProcessGroupPtr group, std::chrono::milliseconds timeout = kDefaultCollectiveTimeout);

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const ProcessGroupPtr& group() const { return group_; }

  // Sums `t` over the ranks, in place (the same shape and dtype on every rank).
  void all_reduce(at::Tensor& t);
  // Every rank's `t` (the same shape on every rank), in rank order.
  std::vector<at::Tensor> all_gather(const at::Tensor& t);
  // Every rank's text, in rank order: lengths first, then the bytes padded to the longest.
  std::vector<std::string> all_gather_text(const std::string& text);

  // Point to point, by rank in this group (not the global rank): `t` to rank `dst`; into `t`
  // (its shape and dtype as sent) from rank `src`. DistributedError for a rank outside the group
  // or this rank itself.
  void send(const at::Tensor& t, int dst);
  void recv(at::Tensor& t, int src);
  // A text to `dst`: its length, then its bytes (none when empty); recv_text takes both.
  void send_text(const std::string& text, int dst);
  std::string recv_text(int src);

  // Where all_gather_text's scratch tensors live: the CPU (gloo) by default; NCCL groups need the
  // rank's CUDA device.
  void set_scratch_device(at::Device device) { scratch_ = device; }

  // The first failure's message, or "" while the group works.
  std::string failure() const;

 private:
  void check_usable(const char* op) const;
  void check_peer(const char* op, int peer) const;
  void run(const char* op, const std::function<c10::intrusive_ptr<c10d::Work>()>& start);
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* op);
  [[noreturn]] void fail(const char* op, const std::string& why);

  ProcessGroupPtr group_;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_;
  at::Device scratch_ = at::kCPU;
  mutable std::mutex mu_;
  std::string failure_;
};

// The process group inside a TorchScript value: what torch.distributed's group becomes in Python
// (`group.boxed()` on torch 2.x; metaload's bridge module on 1.13). DistributedError naming the
// value's type otherwise.
ProcessGroupPtr process_group_from_ivalue(const c10::IValue& value);

}  // namespace metaload
