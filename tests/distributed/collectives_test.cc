// dist/: bounded collectives and the tensor-parallel handshake on c10d process groups made here
// (gloo cannot be constructed from C++ without gloo's headers, which neither torch ships): a group
// of threads in one process (a c10d::ProcessGroup subclass whose works complete when the last rank
// arrives), a group whose works never complete (the timeout) and one whose works fail (a dead
// peer). Then TransformersModel ranks on the thread group against the whole model.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "distributed/collectives.h"
#include "distributed/handshake.h"
#include "model/fixtures.h"
#include "model/transformers_model.h"
#include "tests/loader/test_util.h"

namespace metaload {
namespace {

using testing::expect_error;
using namespace std::chrono_literals;

// A c10d work the test completes by hand.
class ManualWork : public c10d::Work {
 public:
  void complete(std::exception_ptr e = nullptr) { finish(std::move(e)); }
};

// What the ranks of one ThreadGroup share: the pending collective (one at a time, as the families
// issue them).
struct Rendezvous {
  explicit Rendezvous(int n) : size(n) {}
  std::mutex mu;
  int size;
  int arrived = 0;
  // Per arrival: fills that rank's outputs from every rank's input.
  std::vector<std::function<void(const std::vector<at::Tensor>&)>> deliver;
  std::vector<c10::intrusive_ptr<ManualWork>> works;
  std::vector<at::Tensor> inputs;
  // Point to point, by (src, dst): messages sent before their receive, receives posted before
  // their message.
  std::map<std::pair<int, int>, std::deque<at::Tensor>> sent;
  std::map<std::pair<int, int>, std::deque<std::pair<at::Tensor, c10::intrusive_ptr<ManualWork>>>>
      waiting;
};

// Rank `rank` of an in-process group: a collective's work completes when every rank has called it.
class ThreadGroup : public c10d::ProcessGroup {
 public:
  ThreadGroup(int rank, std::shared_ptr<Rendezvous> r)
      : c10d::ProcessGroup(rank, r->size), r_(std::move(r)) {}

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions&) override {
    at::Tensor t = tensors[0];
    return arrive(t, [t](const std::vector<at::Tensor>& all) {
      at::Tensor sum = at::zeros_like(all[0]);
      for (const at::Tensor& x : all) sum.add_(x);
      t.copy_(sum);
    });
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    std::vector<at::Tensor> out = outputs[0];
    return arrive(inputs[0], [out](const std::vector<at::Tensor>& all) {
      for (size_t i = 0; i < all.size(); ++i) out[i].copy_(all[i]);
    });
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int) override {
    auto work = c10::make_intrusive<ManualWork>();
    std::lock_guard<std::mutex> g(r_->mu);
    auto& w = r_->waiting[{getRank(), dst}];
    if (w.empty()) {
      r_->sent[{getRank(), dst}].push_back(tensors[0].clone());
    } else {
      w.front().first.copy_(tensors[0]);
      w.front().second->complete();
      w.pop_front();
    }
    work->complete();
    return work;
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int) override {
    auto work = c10::make_intrusive<ManualWork>();
    std::lock_guard<std::mutex> g(r_->mu);
    auto& q = r_->sent[{src, getRank()}];
    if (q.empty()) {
      r_->waiting[{src, getRank()}].emplace_back(tensors[0], work);
    } else {
      tensors[0].copy_(q.front());
      q.pop_front();
      work->complete();
    }
    return work;
  }

 private:
  c10::intrusive_ptr<c10d::Work> arrive(const at::Tensor& input,
                                        std::function<void(const std::vector<at::Tensor>&)> f) {
    auto work = c10::make_intrusive<ManualWork>();
    std::lock_guard<std::mutex> g(r_->mu);
    if (r_->inputs.empty()) r_->inputs.resize(r_->size);
    r_->inputs[getRank()] = input.clone();
    r_->deliver.push_back(std::move(f));
    r_->works.push_back(work);
    if (++r_->arrived == r_->size) {  // the last rank delivers to everyone
      for (auto& d : r_->deliver) d(r_->inputs);
      for (auto& w : r_->works) w->complete();
      r_->arrived = 0;
      r_->deliver.clear();
      r_->works.clear();
      r_->inputs.clear();
    }
    return work;
  }
  std::shared_ptr<Rendezvous> r_;
};

// Rank 0 of 2 whose peer never shows up (works never complete), or died (works fail).
class LonelyGroup : public c10d::ProcessGroup {
 public:
  explicit LonelyGroup(bool peer_died) : c10d::ProcessGroup(0, 2), died_(peer_died) {}
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>&,
                                           const c10d::AllreduceOptions&) override {
    return work();
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>&,
                                           std::vector<at::Tensor>&,
                                           const c10d::AllgatherOptions&) override {
    return work();
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>&, int, int) override {
    return work();
  }
  std::vector<c10::intrusive_ptr<ManualWork>> pending;  // kept so that they never complete

 private:
  c10::intrusive_ptr<c10d::Work> work() {
    auto w = c10::make_intrusive<ManualWork>();
    if (died_)
      w->complete(std::make_exception_ptr(std::runtime_error("Connection closed by peer [::1]:4")));
    else
      pending.push_back(w);
    return w;
  }
  bool died_;
};

// Runs f(rank, group) on n threads over one ThreadGroup; returns what each returned or threw.
template <typename R>
std::vector<std::future<R>> on_ranks(int n, std::function<R(int, ProcessGroupPtr)> f) {
  auto r = std::make_shared<Rendezvous>(n);
  std::vector<std::future<R>> out;
  for (int i = 0; i < n; ++i)
    out.push_back(std::async(std::launch::async, f, i,
                             ProcessGroupPtr(c10::make_intrusive<ThreadGroup>(i, r))));
  return out;
}

TEST(Collectives, AllReduceAllGatherAndTextOnThreeRanks) {
  auto ranks = on_ranks<std::vector<std::string>>(3, [](int rank, ProcessGroupPtr g) {
    Collectives c(g, 10s);
    EXPECT_EQ(c.rank(), rank);
    EXPECT_EQ(c.size(), 3);
    at::Tensor t = at::full({2, 3}, rank + 1.0);
    c.all_reduce(t);
    EXPECT_TRUE(t.equal(at::full({2, 3}, 6.0)));
    // A strided view is reduced through a copy and written back.
    at::Tensor base = at::full({3, 4}, rank + 1.0);
    at::Tensor column = base.select(1, 2);
    c.all_reduce(column);
    EXPECT_TRUE(base.select(1, 2).equal(at::full({3}, 6.0)));
    EXPECT_TRUE(base.select(1, 0).equal(at::full({3}, rank + 1.0)));
    auto all = c.all_gather(at::arange(2, at::kFloat) + 10 * rank);
    EXPECT_EQ(all.size(), 3u);
    for (int r = 0; r < 3; ++r) EXPECT_TRUE(all[r].equal(at::arange(2, at::kFloat) + 10 * r));
    return c.all_gather_text(std::string(rank * 5, 'a' + rank));
  });
  for (auto& f : ranks) EXPECT_EQ(f.get(), (std::vector<std::string>{"", "bbbbb", "cccccccccc"}));
}

TEST(Collectives, ARankThatNeverAnswersIsATimeoutNamingTheOperation) {
  auto lonely = c10::make_intrusive<LonelyGroup>(/*peer_died=*/false);
  Collectives c(lonely, 200ms);
  at::Tensor t = at::ones({4});
  const auto t0 = std::chrono::steady_clock::now();
  const auto e = expect_error<DistributedError>([&] { c.all_reduce(t); });
  // A hang guard, not a speed claim: the 200 ms timeout ends the wait (the lonely group's work
  // never completes, so without it the call blocks for good); the bound is 50 times the timeout.
  // Allow-listed in tests/python/test_no_timing_asserts.py.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  const std::string m = e.what();
  EXPECT_NE(m.find("all_reduce on rank 0 of 2 (timeout 200 ms)"), std::string::npos) << m;
  EXPECT_NE(m.find("not every rank took part within 200 ms"), std::string::npos) << m;
  // The group may still hold the operation: it is not used again.
  const auto again = expect_error<DistributedError>([&] { c.all_gather(t); });
  EXPECT_NE(std::string(again.what()).find("failed earlier"), std::string::npos);
  EXPECT_FALSE(c.failure().empty());
}

TEST(Collectives, APeerThatDiedIsAFailureWithTheBackendsReason) {
  Collectives c(c10::make_intrusive<LonelyGroup>(/*peer_died=*/true), 10s);
  const auto e = expect_error<DistributedError>([&] { c.all_gather(at::ones({2})); });
  const std::string m = e.what();
  EXPECT_NE(m.find("all_gather on rank 0 of 2"), std::string::npos) << m;
  EXPECT_NE(m.find("failed: Connection closed by peer"), std::string::npos) << m;
}

TEST(Collectives, BadArgumentsAreTyped) {
  expect_error<DistributedError>([] { Collectives(ProcessGroupPtr(), 1s); });
  expect_error<DistributedError>([] { Collectives(c10::make_intrusive<LonelyGroup>(false), 0ms); });
  const auto e =
      expect_error<DistributedError>([] { process_group_from_ivalue(c10::IValue(int64_t{3})); });
  EXPECT_NE(std::string(e.what()).find("expected a c10d ProcessGroup"), std::string::npos);
}

TEST(Handshake, RanksThatDisagreeAllFailWithEveryRanksValues) {
  auto ranks = on_ranks<std::string>(2, [](int rank, ProcessGroupPtr g) {
    Collectives c(g, 10s);
    try {
      check_tp_agreement(c, TpIdentity{2 + rank, rank, "gpt2"});
    } catch (const DistributedError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  });
  for (auto& f : ranks) {
    const std::string m = f.get();
    EXPECT_NE(m.find("tp_size must equal the group's size 2 on every rank (rank 0: 2, rank 1: 3)"),
              std::string::npos)
        << m;
  }
  auto models = on_ranks<std::string>(2, [](int rank, ProcessGroupPtr g) {
    Collectives c(g, 10s);
    try {
      check_tp_agreement(c, TpIdentity{2, rank, rank ? "llama" : "gpt2"});
    } catch (const DistributedError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  });
  for (auto& f : models)
    EXPECT_NE(f.get().find("the ranks run different models (rank 0: gpt2, rank 1: llama)"),
              std::string::npos);
  auto agree = on_ranks<bool>(2, [](int rank, ProcessGroupPtr g) {
    Collectives c(g, 10s);
    check_tp_agreement(c, TpIdentity{2, rank, "gpt2"});
    return true;
  });
  for (auto& f : agree) EXPECT_TRUE(f.get());
}

TEST(Collectives, PointToPointTensorsAndTexts) {
  auto ranks = on_ranks<std::string>(3, [](int rank, ProcessGroupPtr g) {
    Collectives c(g, 10s);
    if (rank == 0) {
      c.send(at::arange(6, at::kFloat).view({2, 3}), 2);
      c.send_text("", 1);
      c.send_text(std::string("h\0llo \xc3\xa9", 9), 2);
      return std::string("sent");
    }
    if (rank == 1) return "[" + c.recv_text(0) + "]";
    at::Tensor t = at::zeros({2, 3});
    c.recv(t, 0);
    EXPECT_TRUE(t.equal(at::arange(6, at::kFloat).view({2, 3})));
    return c.recv_text(0);
  });
  EXPECT_EQ(ranks[0].get(), "sent");
  EXPECT_EQ(ranks[1].get(), "[]");
  EXPECT_EQ(ranks[2].get(), std::string("h\0llo \xc3\xa9", 9));
  Collectives c(c10::make_intrusive<LonelyGroup>(false), 200ms);
  for (int bad : {-1, 0, 2}) {  // not a rank, this rank, past the group
    const auto e = expect_error<DistributedError>([&] { c.send(at::ones({1}), bad); });
    EXPECT_NE(std::string(e.what()).find("the peer must be another rank of the group (0..1)"),
              std::string::npos)
        << e.what();
  }
  const auto e = expect_error<DistributedError>([&] { c.recv_text(1); });
  EXPECT_NE(std::string(e.what()).find("recv on rank 0 of 2 (timeout 200 ms): not every rank took "
                                       "part within 200 ms"),
            std::string::npos)
      << e.what();
}

TEST(Vote, EveryRankSeesEveryBallotAndTheSameFailure) {
  auto ranks =
      on_ranks<std::pair<std::vector<Ballot>, std::string>>(3, [](int rank, ProcessGroupPtr g) {
        Collectives c(g, 10s);
        const Ballot mine{rank == 1 ? "ReadError: x" : "", fmt::format("{{\"bytes\": {}}}", rank)};
        const std::vector<Ballot> all = gather_ballots(c, "loading 'm'", mine);
        return std::make_pair(all, vote_failure("loading 'm'", rank, 3, all));
      });
  for (int r = 0; r < 3; ++r) {
    auto [all, failure] = ranks[r].get();
    ASSERT_EQ(all.size(), 3u);
    EXPECT_EQ(all[2].data, "{\"bytes\":2}");
    EXPECT_EQ(all[1].failure, "ReadError: x");
    EXPECT_EQ(failure, fmt::format("loading 'm' on rank {} of 3: not every rank succeeded, so no "
                                   "rank goes ahead (rank 1: ReadError: x)",
                                   r));
  }
  EXPECT_EQ(vote_failure("s", 0, 2, {{"", "null"}, {"", "1"}}), "");
  Collectives lonely(c10::make_intrusive<LonelyGroup>(true), 1s);
  const auto e = expect_error<DistributedError>([&] { gather_ballots(lonely, "the vote", {}); });
  EXPECT_NE(std::string(e.what()).find("the vote on rank 0 of 2: the ranks could not agree"),
            std::string::npos)
      << e.what();
}

TEST(LoadHandshake, NamesEveryDisagreement) {
  auto hello = [](int rank, int size, std::string source = "null", int64_t buffer = 0,
                  int protocol = 1) {
    return fmt::format(
        "{{\"protocol\": {}, \"tp_rank\": {}, \"tp_size\": {}, \"source_rank\": {}, "
        "\"buffer_bytes\": {}, \"dequantize\": null, \"tp_plan\": null}}",
        protocol, rank, size, source, buffer);
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(load_handshake_problems({hello(0, 2), hello(1, 2)}, 2), V{});
  EXPECT_EQ(load_handshake_problems({hello(0, 1), hello(0, 1)}, 2), V{});  // replicas
  EXPECT_EQ(load_handshake_problems({hello(0, 2), hello(1, 3)}, 2),
            V{"tp_size differs (rank 0: 2, rank 1: 3)"});
  EXPECT_EQ(load_handshake_problems({hello(0, 3), hello(1, 3)}, 2),
            V{"tp_size 3 is neither 1 nor the process group's size 2"});
  EXPECT_EQ(load_handshake_problems({hello(1, 2), hello(1, 2)}, 2),
            V{"tp_rank must be 0..1, once each (rank 0: 1, rank 1: 1)"});
  EXPECT_EQ(load_handshake_problems({hello(0, 1), hello(1, 1)}, 2),
            V{"tp_size 1 has only tp_rank 0 (rank 0: 0, rank 1: 1)"});
  EXPECT_EQ(load_handshake_problems({hello(0, 2, "0"), hello(1, 2, "1")}, 2),
            V{"source_rank differs (rank 0: 0, rank 1: 1)"});
  EXPECT_EQ(load_handshake_problems({hello(0, 2, "2"), hello(1, 2, "2")}, 2),
            V{"source_rank 2 is not a rank of the group (0..1)"});
  EXPECT_EQ(load_handshake_problems({hello(0, 2), hello(1, 2, "null", -1)}, 2),
            V{"buffer_bytes must be 0 (the default, 64 MiB) or a positive number of bytes (rank "
              "1: -1)"});
  EXPECT_EQ(load_handshake_problems({hello(0, 2), hello(1, 2, "null", 0, 2)}, 2),
            V{"metaload versions differ (protocol rank 0: 1, rank 1: 2)"});
  EXPECT_EQ(load_handshake_problems({hello(0, 2), "[1]"}, 2),
            V{"rank 1 sent \"[1]\", not a metaload load's handshake"});
  // Over the group: the same error on every rank, before anything is read.
  auto ranks = on_ranks<std::string>(2, [](int rank, ProcessGroupPtr g) {
    Collectives c(g, 10s);
    try {
      load_handshake(c, fmt::format("{{\"tp_rank\": {}, \"tp_size\": {}, \"source_rank\": "
                                    "null, \"buffer_bytes\": 0}}",
                                    rank, 2 + rank));
    } catch (const DistributedError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  });
  for (auto& f : ranks) {
    EXPECT_NE(f.get().find("the ranks of the process group disagree, nothing was loaded: tp_size "
                           "differs (rank 0: 2, rank 1: 3)"),
              std::string::npos);
  }
}

// TransformersModel ranks over the thread group: the whole model's logits and tokens.
void expect_ranks_match_whole(const std::string& config, int n) {
  testing::TempDir d;
  FixtureOptions o;
  o.config = config;
  o.seed = 5;
  const std::string dir = make_checkpoint(o, d / "ckpt").dir;
  TransformersModel whole(dir);
  const at::Tensor ids = at::tensor({3, 1, 4, 1, 5, 9, 2, 6}, at::kLong).view({2, 4});
  const at::Tensor logits = whole.forward(ids), tokens = whole.generate(ids, 5);
  auto ranks = on_ranks<std::pair<at::Tensor, at::Tensor>>(n, [&](int, ProcessGroupPtr g) {
    ModelOptions mo;
    mo.tp_size = n;
    mo.tp_rank = -1;  // from the group
    mo.process_group = g;
    mo.collective_timeout = 30s;
    TransformersModel m(dir, mo);
    return std::make_pair(m.forward(ids), m.generate(ids, 5));
  });
  for (auto& f : ranks) {
    auto [l, t] = f.get();
    const double rel = (l - logits).abs().max().item<double>() / logits.abs().max().item<double>();
    EXPECT_LT(rel, 1e-5) << config << " tp " << n;
    EXPECT_TRUE(t.equal(tokens)) << config << " tp " << n;
  }
}

TEST(TensorParallelForward, ThreadRanksGiveTheWholeModelsLogits) {
  expect_ranks_match_whole("gpt2-tiny", 2);
  expect_ranks_match_whole("llama-tiny", 4);  // 2 kv heads, replicated over 4 ranks
  expect_ranks_match_whole("llama-tiny-tied", 3);
}

}  // namespace
}  // namespace metaload
