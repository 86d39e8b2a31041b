#include "distributed/collectives.h"

#include <fmt/format.h>

#include "base/text.h"

namespace metaload {
namespace {

std::string message_of(const std::exception& e) {
  // c10's what() carries a C++ backtrace; the first lines say what happened.
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string m = c10_error ? c10_error->what_without_backtrace() : e.what();
  const size_t raised = m.find("\nException raised from");
  if (raised != std::string::npos) m.resize(raised);
  return m;
}

bool says_timeout(const std::string& m) {
  for (const char* word : {"timed out", "Timed out", "timeout", "Timeout"})
    if (m.find(word) != std::string::npos) return true;
  return false;
}

}  // namespace

Collectives::Collectives(ProcessGroupPtr group, std::chrono::milliseconds timeout)
    : group_(std::move(group)), timeout_(timeout) {
  if (!group_) throw DistributedError("the process group is null");
  if (timeout_.count() <= 0)
    throw DistributedError(
        fmt::format("the collective timeout must be positive, got {} ms", timeout_.count()));
  rank_ = group_->getRank();
  size_ = group_->getSize();
}

std::string Collectives::failure() const {
  std::lock_guard<std::mutex> g(mu_);
  return failure_;
}

void Collectives::check_usable(const char* op) const {
  std::lock_guard<std::mutex> g(mu_);
  if (!failure_.empty())
    throw DistributedError(fmt::format(
        "{} on rank {} of {}: the group failed earlier and cannot be used again ({}); create a new "
        "process group",
        op, rank_, size_, failure_));
}

void Collectives::fail(const char* op, const std::string& why) {
  const std::string message = fmt::format("{} on rank {} of {} (timeout {} ms): {}", op, rank_,
                                          size_, timeout_.count(), why);
  {
    std::lock_guard<std::mutex> g(mu_);
    if (failure_.empty()) failure_ = message;
  }
  throw DistributedError(message);
}

void Collectives::wait(const c10::intrusive_ptr<c10d::Work>& work, const char* op) {
  std::string why;
  try {
    // c10d's Work::wait(timeout) throws when the time runs out; a peer that died makes the
    // backend fail the work (gloo: the connection closed) and wait rethrows that.
    if (work->wait(timeout_)) return;
    why = "the operation did not complete";
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string m = message_of(e);
    why = says_timeout(m) ? fmt::format(
                                "not every rank took part within {} ms (a rank died, "
                                "hangs, or never called {}): {}",
                                timeout_.count(), op, escape_text(m))
                          : "failed: " + escape_text(m);
  }
  fail(op, why);
}

void Collectives::run(const char* op,
                      const std::function<c10::intrusive_ptr<c10d::Work>()>& start) {
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = start();
  } catch (const std::exception& e) {
    fail(op, "failed to start: " + escape_text(message_of(e)));
  }
  wait(work, op);
}

void Collectives::all_reduce(at::Tensor& t) {
  const char* op = "all_reduce";
  check_usable(op);
  if (size_ == 1) return;
  // c10d needs dense contiguous tensors; a strided view is reduced through a copy.
  std::vector<at::Tensor> tensors{t.is_contiguous() ? t : t.contiguous()};
  run(op, [&] { return group_->allreduce(tensors); });
  if (!tensors[0].is_same(t)) t.copy_(tensors[0]);
}

std::vector<at::Tensor> Collectives::all_gather(const at::Tensor& t) {
  const char* op = "all_gather";
  check_usable(op);
  std::vector<at::Tensor> inputs{t.contiguous()};
  if (size_ == 1) return inputs;
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int i = 0; i < size_; ++i) outputs[0].push_back(at::empty_like(inputs[0]));
  run(op, [&] { return group_->allgather(outputs, inputs); });
  return outputs[0];
}

void Collectives::check_peer(const char* op, int peer) const {
  check_usable(op);
  if (peer < 0 || peer >= size_ || peer == rank_)
    throw DistributedError(
        fmt::format("{} on rank {} of {}: the peer must be another rank of the "
                    "group (0..{}), got {}",
                    op, rank_, size_, size_ - 1, peer));
}

void Collectives::send(const at::Tensor& t, int dst) {
  const char* op = "send";
  check_peer(op, dst);
  std::vector<at::Tensor> tensors{t.contiguous()};
  run(op, [&] { return group_->send(tensors, dst, /*tag=*/0); });
}

void Collectives::recv(at::Tensor& t, int src) {
  const char* op = "recv";
  check_peer(op, src);
  std::vector<at::Tensor> tensors{t.is_contiguous() ? t : t.contiguous()};
  run(op, [&] { return group_->recv(tensors, src, /*tag=*/0); });
  if (!tensors[0].is_same(t)) t.copy_(tensors[0]);
}

void Collectives::send_text(const std::string& text, int dst) {
  send(at::full({1}, static_cast<int64_t>(text.size()), at::kLong).to(scratch_), dst);
  if (text.empty()) return;
  at::Tensor bytes = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
  std::copy(text.begin(), text.end(), bytes.data_ptr<uint8_t>());
  send(bytes.to(scratch_), dst);
}

std::string Collectives::recv_text(int src) {
  at::Tensor length = at::zeros({1}, at::kLong).to(scratch_);
  recv(length, src);
  const int64_t n = length.cpu().item<int64_t>();
  if (n < 0 || n > (int64_t{1} << 40))
    fail("recv", fmt::format("rank {} announced a text of {} bytes", src, n));
  if (n == 0) return "";
  at::Tensor bytes = at::zeros({n}, at::kByte).to(scratch_);
  recv(bytes, src);
  const at::Tensor host = bytes.cpu();
  return std::string(reinterpret_cast<const char*>(host.data_ptr<uint8_t>()),
                     static_cast<size_t>(n));
}

std::vector<std::string> Collectives::all_gather_text(const std::string& text) {
  at::Tensor length = at::full({1}, static_cast<int64_t>(text.size()), at::kLong);
  int64_t longest = 0;
  std::vector<int64_t> lengths;
  for (const at::Tensor& l : all_gather(length.to(scratch_))) {
    lengths.push_back(l.item<int64_t>());
    longest = std::max(longest, lengths.back());
  }
  at::Tensor bytes = at::zeros({std::max<int64_t>(longest, 1)}, at::kByte);
  std::copy(text.begin(), text.end(), bytes.data_ptr<uint8_t>());
  std::vector<std::string> out;
  const std::vector<at::Tensor> all = all_gather(bytes.to(scratch_));
  for (size_t i = 0; i < all.size(); ++i) {
    const at::Tensor host = all[i].cpu();
    const auto* p = host.data_ptr<uint8_t>();
    out.emplace_back(reinterpret_cast<const char*>(p), static_cast<size_t>(lengths[i]));
  }
  return out;
}

ProcessGroupPtr process_group_from_ivalue(const c10::IValue& value) {
  const std::string type = value.isNone() ? "None" : value.type()->str();
  if (!value.isObject())
    throw DistributedError(fmt::format(
        "expected a c10d ProcessGroup (torch.distributed's group, as group.boxed() gives it), got "
        "a value of type {}",
        type));
  try {
    return value.toCustomClass<c10d::ProcessGroup>();
  } catch (const c10::Error&) {
    throw DistributedError(
        fmt::format("expected a c10d ProcessGroup, got an object of class {}", type));
  }
}

}  // namespace metaload
