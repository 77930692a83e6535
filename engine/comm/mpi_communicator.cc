#include "comm/mpi_communicator.h"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <thread>

#include "comm/comm_stream.h"
#include "core/check.h"

#define GPT_MPI_CHECK(call) GPT_CHECK_MSG((call) == MPI_SUCCESS, #call)

namespace gpt {

namespace {

// bf16 travels as a 2-byte type with a user-defined sum computed through fp32.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

struct MpiTypes {
  MPI_Datatype bf16_type = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum_op = MPI_OP_NULL;
};

MpiTypes& mpi_types() {
  static MpiTypes types;
  return types;
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kBF16: return mpi_types().bf16_type;
    case DType::kI32: return MPI_INT32_T;
    case DType::kU16: return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_sum(DType t) { return t == DType::kBF16 ? mpi_types().bf16_sum_op : MPI_SUM; }

// Completes a non-blocking collective without monopolising a core: MPI's blocking calls busy-poll, and
// under mpirun's one-core-per-rank binding that spinning comm thread starves the compute threads of its
// own rank. So: test, and between tests sleep briefly (after a short spin for small, fast collectives).
void complete(MPI_Request* request) {
  for (int spins = 0;; ++spins) {
    int done = 0;
    GPT_MPI_CHECK(MPI_Test(request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

int count(int64_t n) {
  GPT_CHECK_MSG(n >= 0 && n <= INT_MAX, "collective larger than INT_MAX elements");
  return static_cast<int>(n);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, bool owned, std::string name) : comm_(comm), owned_(owned), name_(std::move(name)) {
    GPT_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    GPT_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~MpiCommunicator() override {
    stream_.reset();  // finish queued collectives before freeing the communicator
    if (owned_) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view group_name() const override { return name_; }

  Work all_reduce(void* buf, int64_t n, DType dtype) override {
    return stream_->submit(CommOp::kAllReduce, n, bytes(n, dtype), [=, this] {
      MPI_Request req;
      GPT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, count(n), mpi_type(dtype), mpi_sum(dtype), comm_, &req));
      complete(&req);
    });
  }
  Work reduce_scatter(const void* send, void* recv, int64_t n, DType dtype) override {
    return stream_->submit(CommOp::kReduceScatter, n * size_, bytes(n * size_, dtype), [=, this] {
      MPI_Request req;
      GPT_MPI_CHECK(
          MPI_Ireduce_scatter_block(send, recv, count(n), mpi_type(dtype), mpi_sum(dtype), comm_, &req));
      complete(&req);
    });
  }
  Work all_gather(const void* send, void* recv, int64_t n, DType dtype) override {
    const bool in_place = send == static_cast<const char*>(recv) + n * rank_ * dtype_size(dtype);
    return stream_->submit(CommOp::kAllGather, n * size_, bytes(n * size_, dtype), [=, this] {
      MPI_Request req;
      GPT_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, count(n), mpi_type(dtype), recv, count(n),
                                   mpi_type(dtype), comm_, &req));
      complete(&req);
    });
  }
  Work broadcast(void* buf, int64_t n, DType dtype, int root) override {
    return stream_->submit(CommOp::kBroadcast, n, bytes(n, dtype), [=, this] {
      MPI_Request req;
      GPT_MPI_CHECK(MPI_Ibcast(buf, count(n), mpi_type(dtype), root, comm_, &req));
      complete(&req);
    });
  }
  Work barrier() override {
    return stream_->submit(CommOp::kBarrier, 0, 0, [this] {
      MPI_Request req;
      GPT_MPI_CHECK(MPI_Ibarrier(comm_, &req));
      complete(&req);
    });
  }
  std::unique_ptr<Communicator> split(int color, int key, std::string name) override {
    MPI_Comm sub = MPI_COMM_NULL;
    stream_->run_sync([&] { GPT_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub)); });
    return std::make_unique<MpiCommunicator>(sub, true, std::move(name));
  }
  CommStats stats() const override { return stream_->stats(); }

 private:
  static int64_t bytes(int64_t n, DType t) { return n * static_cast<int64_t>(dtype_size(t)); }
  MPI_Comm comm_;
  bool owned_;
  std::string name_;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<CommStream> stream_ = std::make_unique<CommStream>();
};

}  // namespace

Expected<std::unique_ptr<MpiEnvironment>> MpiEnvironment::init(int* argc, char*** argv) {
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    return Status::failed_precondition("MPI_Init_thread failed");
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    return Status::failed_precondition("this MPI library does not provide MPI_THREAD_MULTIPLE");
  }
  std::unique_ptr<MpiEnvironment> env(new MpiEnvironment());
  GPT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &env->world_rank_));
  GPT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &env->world_size_));
  MPI_Comm node = MPI_COMM_NULL;
  GPT_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, env->world_rank_, MPI_INFO_NULL, &node));
  GPT_MPI_CHECK(MPI_Comm_rank(node, &env->local_rank_));
  GPT_MPI_CHECK(MPI_Comm_size(node, &env->local_size_));
  MPI_Comm_free(&node);
  MpiTypes& t = mpi_types();
  GPT_MPI_CHECK(MPI_Type_contiguous(1, MPI_UINT16_T, &t.bf16_type));
  GPT_MPI_CHECK(MPI_Type_commit(&t.bf16_type));
  GPT_MPI_CHECK(MPI_Op_create(&bf16_sum, /*commute=*/1, &t.bf16_sum_op));
  return env;
}

MpiEnvironment::~MpiEnvironment() {
  MpiTypes& t = mpi_types();
  if (t.bf16_sum_op != MPI_OP_NULL) MPI_Op_free(&t.bf16_sum_op);
  if (t.bf16_type != MPI_DATATYPE_NULL) MPI_Type_free(&t.bf16_type);
  MPI_Finalize();
}

std::unique_ptr<Communicator> MpiEnvironment::make_world() {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, false, "world");
}

void MpiEnvironment::abort(int exit_code) {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::abort();
}

}  // namespace gpt
