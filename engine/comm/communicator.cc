#include "comm/communicator.h"

#include <cstring>
#include <vector>

#include "core/check.h"

namespace gpt {

std::string_view comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::kAllReduce:
      return "all_reduce";
    case CommOp::kReduceScatter:
      return "reduce_scatter";
    case CommOp::kAllGather:
      return "all_gather";
    case CommOp::kBroadcast:
      return "broadcast";
    case CommOp::kBarrier:
      return "barrier";
    case CommOp::kCount:
      break;
  }
  return "?";
}

void Work::wait() const {
  if (!state_) return;
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [this] { return state_->done; });
}

void Work::join() const {
  if (state_ && state_->device_join) {
    state_->device_join();
  } else {
    wait();
  }
}

bool Work::is_done() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

namespace {

class SingleCommunicator final : public Communicator {
 public:
  explicit SingleCommunicator(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view group_name() const override { return name_; }

  Work all_reduce(void*, int64_t n, DType dtype) override { return count(CommOp::kAllReduce, n, dtype); }
  Work reduce_scatter(const void* send, void* recv, int64_t n, DType dtype) override {
    if (send != recv) std::memmove(recv, send, n * dtype_size(dtype));
    return count(CommOp::kReduceScatter, n, dtype);
  }
  Work all_gather(const void* send, void* recv, int64_t n, DType dtype) override {
    if (send != recv) std::memmove(recv, send, n * dtype_size(dtype));
    return count(CommOp::kAllGather, n, dtype);
  }
  Work broadcast(void*, int64_t n, DType dtype, int root) override {
    GPT_CHECK(root == 0);
    return count(CommOp::kBroadcast, n, dtype);
  }
  Work barrier() override { return count(CommOp::kBarrier, 0, DType::kF32); }
  std::unique_ptr<Communicator> split(int, int, std::string name) override {
    return std::make_unique<SingleCommunicator>(std::move(name));
  }
  CommStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  Work count(CommOp op, int64_t n, DType dtype) {
    std::lock_guard<std::mutex> lock(mu_);
    CommOpStats& s = stats_.ops[static_cast<size_t>(op)];
    ++s.calls;
    s.elements += n;
    s.bytes += n * static_cast<int64_t>(dtype_size(dtype));
    ++stats_.last_seq;
    return Work();
  }
  std::string name_;
  mutable std::mutex mu_;
  CommStats stats_;
};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator(std::string name) {
  return std::make_unique<SingleCommunicator>(std::move(name));
}

std::string broadcast_string(Communicator& group, std::string text) {
  int32_t n = static_cast<int32_t>(text.size());
  group.broadcast(&n, 1, DType::kI32, 0).wait();
  std::vector<int32_t> words(static_cast<size_t>((n + 3) / 4), 0);
  if (group.rank() == 0) std::memcpy(words.data(), text.data(), text.size());
  group.broadcast(words.data(), static_cast<int64_t>(words.size()), DType::kI32, 0).wait();
  text.assign(reinterpret_cast<const char*>(words.data()), static_cast<size_t>(n));
  return text;
}

Status agree(Communicator& group, const Status& local, const std::string& what) {
  // Each rank's status code, so that the others fail with the failing rank's kind of error (and the job ends with one
  // exit code, whichever rank's abort lands first).
  const int32_t mine = static_cast<int32_t>(local.code());
  std::vector<int32_t> all(static_cast<size_t>(group.size()));
  group.all_gather(&mine, all.data(), 1, DType::kI32).wait();
  if (!local.is_ok()) return local;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r] != 0) {
      return Status::from_code(static_cast<StatusCode>(all[r]),
                               what + " failed on rank " + std::to_string(r) + " (its log has the cause)");
    }
  }
  return Status::ok();
}

}  // namespace gpt
