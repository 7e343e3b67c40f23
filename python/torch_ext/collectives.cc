// The loom backend's collectives: each checks its tensors, makes its Loom calls
// (several as one group, so one ticket) and returns the queued Work. Data that only
// moves (broadcast, gathers, scatters, all-to-all, send/receive) moves as bytes, so
// every dtype works; reductions take Loom's type of the tensor.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include "backend.h"
#include "util.h"

namespace loom::torchext {

namespace {

std::string nth(const char* arg, size_t i) {
  return std::string(arg) + "[" + std::to_string(i) + "]";
}

// An argument's name, spelled out only when an error needs it: the checks of every call cost no
// allocation.
class ArgName {
 public:
  ArgName(const char* arg) : arg_(arg) {}           // NOLINT: implicit by design
  ArgName(const std::string& arg) : text_(&arg) {}  // NOLINT
  ArgName(const char* arg, size_t index) : arg_(arg), index_(index) {}
  std::string str() const {
    if (text_ != nullptr) return *text_;
    return index_ == kNone ? std::string(arg_) : nth(arg_, index_);
  }

 private:
  static constexpr size_t kNone = ~size_t{0};
  const char* arg_ = nullptr;
  const std::string* text_ = nullptr;
  size_t index_ = kNone;
};

// In-place element-wise operations (all-reduce, broadcast, reduce; their tensors are outputs)
// work on any dense layout (channels_last, say: every rank's tensor has the same one) in place,
// and on a strided view through a contiguous copy (enqueueInPlace). The rest take any strided
// tensor: a tensor that is not contiguous moves through a contiguous copy (inputOf, outputOf),
// in its elements' logical order, as gloo's users expect. An output's elements must not overlap.
enum class Layout { Input, Output };

void checkTensor(const at::Tensor& t, const ArgName& arg, Layout layout) {
  if (!t.defined()) fail(arg.str() + ": undefined tensor");
  if (!t.device().is_cpu())
    fail(arg.str() + ": a tensor on " + t.device().str() +
         "; the loom backend moves CPU tensors (register another backend for this device)");
  if (t.is_sparse()) fail(arg.str() + ": sparse tensors are not supported by the loom backend");
  // A strided view whose overlap torch cannot tell (MemOverlap::TooHard) is taken, as gloo takes
  // it.
  if (layout == Layout::Output && !t.is_non_overlapping_and_dense() &&
      at::has_internal_overlap(t) == at::MemOverlap::Yes)
    fail(arg.str() + ": the output's elements overlap (an expanded tensor)");
}

// What Loom reads of input t: t itself, or a contiguous copy.
at::Tensor inputOf(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// Where Loom writes output t: t itself, or a contiguous tensor copied into t once done
// (copyBack).
at::Tensor outputOf(const at::Tensor& t) {
  return t.is_contiguous() ? t : at::empty(t.sizes(), t.options());
}

// The epilogue that copies the outputs Loom wrote elsewhere into the caller's (nullptr when
// Loom wrote every one in place).
std::function<void()> copyBack(const std::vector<at::Tensor>& user,
                               const std::vector<at::Tensor>& written) {
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
  for (size_t i = 0; i < user.size(); ++i)
    if (!user[i].is_same(written[i])) pairs.emplace_back(user[i], written[i]);
  if (pairs.empty()) return nullptr;
  return [pairs]() mutable {
    for (auto& p : pairs) p.first.copy_(p.second);
  };
}

// a's tensors, then b's (what an operation keeps: its inputs, then where it writes).
std::vector<at::Tensor> joined(std::vector<at::Tensor> a, const std::vector<at::Tensor>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void checkList(const std::vector<at::Tensor>& ts, const char* arg, Layout layout) {
  if (ts.empty()) fail(std::string(arg) + ": empty tensor list");
  for (size_t i = 0; i < ts.size(); ++i) checkTensor(ts[i], ArgName(arg, i), layout);
}

void checkSame(const at::Tensor& a, const at::Tensor& b, const ArgName& arg, int64_t numel) {
  if (a.scalar_type() != b.scalar_type())
    fail(arg.str() + ": " + c10::toString(b.scalar_type()) + ", the input is " +
         c10::toString(a.scalar_type()));
  if (b.numel() != numel)
    fail(arg.str() + ": " + std::to_string(b.numel()) + " elements, expected " +
         std::to_string(numel));
}

size_t bytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

at::Tensor flatten(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  flat.reserve(ts.size());
  for (const at::Tensor& t : ts) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& ts) {
  int64_t at = 0;
  for (at::Tensor& t : ts) {
    t.copy_(flat.narrow(0, at, t.numel()).view(t.sizes()));
    at += t.numel();
  }
}

template <typename F>
void grouped(F&& calls) {
  check(loomGroupStart(), "loomGroupStart");
  try {
    calls();
  } catch (...) {
    (void)loomGroupEnd();
    throw;
  }
  check(loomGroupEnd(), "loomGroupEnd");
}

int rootOf(int64_t root, int size) {
  if (root < 0 || root >= size)
    fail("rootRank: " + std::to_string(root) + " is not a rank of this group of " +
         std::to_string(size));
  return static_cast<int>(root);
}

}  // namespace

using WorkPtr = c10::intrusive_ptr<c10d::Work>;

WorkPtr LoomBackend::broadcast(std::vector<at::Tensor>& tensors,
                               const c10d::BroadcastOptions& opts) {
  checkList(tensors, "tensors", Layout::Output);
  const int root = rootOf(opts.rootRank, getSize());
  return enqueueInPlace(
      c10d::OpType::BROADCAST, tensors, "loomBroadcast", [&](const at::Tensor& t, size_t) {
        return loomBroadcast(t.data_ptr(), t.data_ptr(), bytes(t), loomUint8, root, comm_, nullptr);
      });
}

WorkPtr LoomBackend::allreduce(std::vector<at::Tensor>& tensors,
                               const c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse())
    return allreduceSparse(tensors[0], opts);
  checkList(tensors, "tensors", Layout::Output);
  if (tensors.size() == 1 && tensors[0].is_non_overlapping_and_dense()) {  // the common case
    at::Tensor& t = tensors[0];
    const loomRedOp_t op = redOp(opts.reduceOp, t);
    return enqueue(c10d::OpType::ALLREDUCE, tensors, [&] {
      check(loomAllReduce(t.data_ptr(), t.data_ptr(), reduceCount(t), reduceType(t), op, comm_,
                          nullptr),
            "loomAllReduce");
    });
  }
  return allreduceMany(tensors, opts.reduceOp, c10d::OpType::ALLREDUCE);
}

loomResult_t LoomBackend::sumSparse(at::Tensor& t, uint64_t tag, std::string* message) {
  const int n = getSize();
  const at::Tensor in = t.coalesce();  // here, in call order after the lane's earlier sums
  const at::Tensor idx = in.indices().contiguous();  // [sparse dims, nnz], int64
  const at::Tensor val = in.values().contiguous();   // [nnz, dense dims...]
  const int64_t nnz = in._nnz();
  // Each rank's entry count, and what every rank must share: its sizes, sparse dimensions and
  // dtype (a rank whose sizes differ would put indices out of another rank's bounds).
  uint64_t sizesHash = 1469598103934665603ull;  // FNV-1a over the sizes
  for (const int64_t d : in.sizes())
    sizesHash = (sizesHash ^ static_cast<uint64_t>(d)) * 1099511628211ull;
  constexpr int kHeader = 5;
  at::Tensor mine =
      at::tensor({nnz, static_cast<int64_t>(in.dim()), in.sparse_dim(),
                  static_cast<int64_t>(in.scalar_type()), static_cast<int64_t>(sizesHash)},
                 at::kLong);
  at::Tensor headers = at::empty({n, kHeader}, at::kLong);
  loomResult_t r = laneStep(
      [&](loomComm_t lane) {
        const loomResult_t r = loomCommSetOpTag(lane, tag);  // loom-trace numbers it as torch
        if (r != loomSuccess) return r;
        return loomAllGather(mine.data_ptr(), headers.data_ptr(), kHeader, loomInt64, lane,
                             nullptr);
      },
      message);
  if (r != loomSuccess) return r;
  for (int q = 0; q < n; ++q) {  // every rank sees every header, so every rank refuses alike
    if (headers[q].narrow(0, 1, kHeader - 1).equal(headers[0].narrow(0, 1, kHeader - 1))) continue;
    std::string sizes;
    for (const int64_t d : in.sizes()) sizes += (sizes.empty() ? "" : ", ") + std::to_string(d);
    *message = "tensors[0]: rank " + std::to_string(q) +
               "'s sparse tensor differs from rank 0's in its sizes, sparse dimensions or dtype "
               "(rank " +
               std::to_string(getRank()) + "'s: sizes [" + sizes + "], " +
               std::to_string(in.sparse_dim()) + " sparse dimensions, " +
               c10::toString(in.scalar_type()) + ")";
    return loomInvalidArgument;
  }
  const at::Tensor counts = headers.select(1, 0).contiguous();
  const int64_t most = counts.max().item<int64_t>();
  at::Tensor idxPad = at::zeros({idx.size(0), most}, idx.options());
  idxPad.narrow(1, 0, nnz).copy_(idx);
  std::vector<int64_t> shape = val.sizes().vec();
  shape[0] = most;
  at::Tensor valPad = at::zeros(shape, val.options());
  valPad.narrow(0, 0, nnz).copy_(val);
  at::Tensor idxAll = at::empty({n, idx.size(0), most}, idx.options());
  shape.insert(shape.begin(), n);
  at::Tensor valAll = at::empty(shape, val.options());
  r = laneStep(
      [&](loomComm_t lane) {
        loomResult_t g = loomGroupStart();
        if (g != loomSuccess) return g;
        loomResult_t a = loomAllGather(idxPad.data_ptr(), idxAll.data_ptr(), bytes(idxPad),
                                       loomUint8, lane, nullptr);
        if (a == loomSuccess || a == loomInProgress)
          a = loomAllGather(valPad.data_ptr(), valAll.data_ptr(), bytes(valPad), loomUint8, lane,
                            nullptr);
        g = loomGroupEnd();
        return a == loomSuccess || a == loomInProgress ? g : a;
      },
      message);
  if (r != loomSuccess) return r;
  std::vector<at::Tensor> idxs, vals;
  for (int q = 0; q < n; ++q) {
    const int64_t c = counts[q].item<int64_t>();
    idxs.push_back(idxAll[q].narrow(1, 0, c));
    vals.push_back(valAll[q].narrow(0, 0, c));
  }
  t.copy_(at::sparse_coo_tensor(at::cat(idxs, 1), at::cat(vals, 0), in.sizes()).coalesce());
  return loomSuccess;
}

WorkPtr LoomBackend::allreduceSparse(at::Tensor& t, const c10d::AllreduceOptions& opts) {
  if (comm_ == nullptr) fail("the process group was shut down or aborted");
  if (opts.reduceOp.op_ != c10d::ReduceOp::SUM) fail("op: a sparse all-reduce sums (SUM only)");
  if (!t.device().is_cpu()) fail("tensors[0]: a sparse tensor on " + t.device().str());
  // The block's work could not include it: it runs on the sparse lane, not in the block's group.
  if (coalescing_) fail("tensors[0]: a sparse all-reduce inside a coalescing block");
  auto w = c10::make_intrusive<LoomWork>(this, c10d::OpType::ALLREDUCE, std::vector<at::Tensor>{t},
                                         nullptr, std::vector<at::Tensor>{});
  w->setExternal();
  w->setTicket(0, ++seq_);
  const uint64_t tag = seq_;
  toSparseLane([this, w, t, tag](bool run) mutable {
    if (!run) {
      w->complete(loomRemoteError, "the process group was aborted before the operation ran");
      return;
    }
    std::string message;
    try {
      loomResult_t r = openSparseLane(&message);
      if (r == loomSuccess) r = sumSparse(t, tag, &message);
      if (r != loomSuccess && sparseLaneAborted()) {  // whatever Loom called the abort
        r = loomRemoteError;
        message = "the process group was aborted: " + message;
      }
      w->complete(r, message);
    } catch (const std::exception& e) {
      w->complete(loomInternalError, e.what());
    }
  });
  return w;
}

WorkPtr LoomBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                         const c10d::AllreduceCoalescedOptions& opts) {
  checkList(tensors, "tensors", Layout::Output);
  return allreduceMany(tensors, opts.reduceOp, c10d::OpType::ALLREDUCE_COALESCED);
}

WorkPtr LoomBackend::enqueueInPlace(
    c10d::OpType type, std::vector<at::Tensor>& tensors, const char* loomCall,
    const std::function<loomResult_t(const at::Tensor&, size_t)>& call) {
  // Each tensor itself when dense, else a contiguous copy, which copyBack puts into it once done.
  std::vector<at::Tensor> ds;
  ds.reserve(tensors.size());
  for (const at::Tensor& t : tensors)
    ds.push_back(t.is_non_overlapping_and_dense() ? t : t.contiguous());
  return enqueue(
      type, tensors,
      [&] {
        grouped([&] {
          for (size_t i = 0; i < ds.size(); ++i) check(call(ds[i], i), loomCall);
        });
      },
      copyBack(tensors, ds), ds);
}

WorkPtr LoomBackend::allreduceMany(std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op,
                                   c10d::OpType type) {
  std::vector<loomRedOp_t> ops;
  for (const at::Tensor& t : tensors) ops.push_back(redOp(op, t));
  return enqueueInPlace(type, tensors, "loomAllReduce", [&](const at::Tensor& t, size_t i) {
    return loomAllReduce(t.data_ptr(), t.data_ptr(), reduceCount(t), reduceType(t), ops[i], comm_,
                         nullptr);
  });
}

WorkPtr LoomBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  checkList(tensors, "tensors", Layout::Output);
  const int root = rootOf(opts.rootRank, getSize());
  std::vector<loomRedOp_t> ops;
  for (const at::Tensor& t : tensors) ops.push_back(redOp(opts.reduceOp, t));
  return enqueueInPlace(c10d::OpType::REDUCE, tensors, "loomReduce",
                        [&](const at::Tensor& t, size_t i) {
                          return loomReduce(t.data_ptr(), t.data_ptr(), reduceCount(t),
                                            reduceType(t), ops[i], root, comm_, nullptr);
                        });
}

WorkPtr LoomBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                     const c10d::AllgatherOptions&) {
  checkTensor(input, "input", Layout::Input);
  checkTensor(output, "output", Layout::Output);
  checkSame(input, output, "output", input.numel() * getSize());
  const at::Tensor in = inputOf(input), out = outputOf(output);
  return enqueue(
      c10d::OpType::_ALLGATHER_BASE, {output},
      [&] {
        check(loomAllGather(in.data_ptr(), out.data_ptr(), bytes(in), loomUint8, comm_, nullptr),
              "loomAllGather");
      },
      copyBack({output}, {out}), {in, out});
}

WorkPtr LoomBackend::allgatherStaged(std::vector<at::Tensor>& inputs,
                                     const std::function<at::Tensor&(size_t, int)>& outputOf,
                                     c10d::OpType type) {
  checkList(inputs, "input_tensors", Layout::Input);
  std::vector<at::Tensor> ins, staged, flatOutputs;
  for (const at::Tensor& t : inputs) ins.push_back(inputOf(t));
  std::vector<at::Tensor> keep = ins;
  std::vector<std::vector<at::Tensor>> outs(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    for (int r = 0; r < getSize(); ++r) {
      at::Tensor& o = outputOf(i, r);
      const std::string arg =
          "output_tensors (input " + std::to_string(i) + ", rank " + std::to_string(r) + ")";
      checkTensor(o, arg, Layout::Output);
      checkSame(inputs[i], o, arg, inputs[i].numel());
      outs[i].push_back(o);
      flatOutputs.push_back(o);
    }
    staged.push_back(at::empty({inputs[i].numel() * getSize()}, inputs[i].options()));
    keep.push_back(staged.back());
  }
  return enqueue(
      type, flatOutputs,
      [&] {
        grouped([&] {
          for (size_t i = 0; i < ins.size(); ++i)
            check(loomAllGather(ins[i].data_ptr(), staged[i].data_ptr(), bytes(ins[i]), loomUint8,
                                comm_, nullptr),
                  "loomAllGather");
        });
      },
      [staged, outs]() mutable {
        for (size_t i = 0; i < staged.size(); ++i) unflatten(staged[i], outs[i]);
      },
      keep);
}

WorkPtr LoomBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                               std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) {
  // outputs[i][r]: input i of rank r.
  if (outputs.size() != inputs.size())
    fail("output_tensors: " + std::to_string(outputs.size()) + " lists for " +
         std::to_string(inputs.size()) + " inputs");
  for (size_t i = 0; i < outputs.size(); ++i)
    if (outputs[i].size() != static_cast<size_t>(getSize()))
      fail(nth("output_tensors", i) + ": " + std::to_string(outputs[i].size()) +
           " tensors for a group of " + std::to_string(getSize()));
  return allgatherStaged(
      inputs, [&](size_t i, int r) -> at::Tensor& { return outputs[i][r]; },
      c10d::OpType::ALLGATHER);
}

WorkPtr LoomBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                         std::vector<at::Tensor>& inputs,
                                         const c10d::AllgatherOptions&) {
  // outputs[r][i]: input i of rank r.
  if (outputs.size() != static_cast<size_t>(getSize()))
    fail("output_tensor_lists: " + std::to_string(outputs.size()) + " lists for a group of " +
         std::to_string(getSize()));
  for (size_t r = 0; r < outputs.size(); ++r)
    if (outputs[r].size() != inputs.size())
      fail(nth("output_tensor_lists", r) + ": " + std::to_string(outputs[r].size()) +
           " tensors for " + std::to_string(inputs.size()) + " inputs");
  return allgatherStaged(
      inputs, [&](size_t i, int r) -> at::Tensor& { return outputs[r][i]; },
      c10d::OpType::ALLGATHER_COALESCED);
}

WorkPtr LoomBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions&) {
  checkList(inputs, "inputs", Layout::Input);
  checkList(outputs, "outputs", Layout::Output);
  if (outputs.size() != inputs.size()) fail("outputs: not one per input");
  std::vector<at::Tensor> ins, outs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkSame(inputs[i], outputs[i], ArgName("outputs", i), inputs[i].numel() * getSize());
    ins.push_back(inputOf(inputs[i]));
    outs.push_back(outputOf(outputs[i]));
  }
  const std::vector<at::Tensor> keep = joined(ins, outs);
  return enqueue(
      c10d::OpType::COALESCED, outputs,
      [&] {
        grouped([&] {
          for (size_t i = 0; i < ins.size(); ++i)
            check(loomAllGather(ins[i].data_ptr(), outs[i].data_ptr(), bytes(ins[i]), loomUint8,
                                comm_, nullptr),
                  "loomAllGather");
        });
      },
      copyBack(outputs, outs), keep);
}

WorkPtr LoomBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                            std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  checkList(inputs, "input_tensors", Layout::Input);
  if (inputs.size() != 1)
    fail("input_tensors: gather takes one input tensor, not " + std::to_string(inputs.size()));
  const int root = rootOf(opts.rootRank, getSize());
  const at::Tensor in = inputOf(inputs[0]);
  if (getRank() != root) {
    return enqueue(
        c10d::OpType::GATHER, {},
        [&] {
          check(loomGather(in.data_ptr(), nullptr, bytes(in), loomUint8, root, comm_, nullptr),
                "loomGather");
        },
        nullptr, {in});
  }
  if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(getSize()))
    fail("output_tensors: the root needs one list of " + std::to_string(getSize()) + " tensors");
  for (size_t r = 0; r < outputs[0].size(); ++r) {
    checkTensor(outputs[0][r], ArgName("output_tensors[0]", r), Layout::Output);
    checkSame(in, outputs[0][r], ArgName("output_tensors[0]", r), in.numel());
  }
  at::Tensor staged = at::empty({in.numel() * getSize()}, in.options());
  return enqueue(
      c10d::OpType::GATHER, outputs[0],
      [&] {
        check(loomGather(in.data_ptr(), staged.data_ptr(), bytes(in), loomUint8, root, comm_,
                         nullptr),
              "loomGather");
      },
      [staged, outs = outputs[0]]() mutable { unflatten(staged, outs); }, {in, staged});
}

WorkPtr LoomBackend::scatter(std::vector<at::Tensor>& outputs,
                             std::vector<std::vector<at::Tensor>>& inputs,
                             const c10d::ScatterOptions& opts) {
  checkList(outputs, "output_tensors", Layout::Output);
  if (outputs.size() != 1)
    fail("output_tensors: scatter takes one output tensor, not " + std::to_string(outputs.size()));
  const int root = rootOf(opts.rootRank, getSize());
  const at::Tensor out = outputOf(outputs[0]);
  at::Tensor send;
  if (getRank() == root) {
    if (inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(getSize()))
      fail("input_tensors: the root needs one list of " + std::to_string(getSize()) + " tensors");
    for (size_t r = 0; r < inputs[0].size(); ++r) {
      checkTensor(inputs[0][r], ArgName("input_tensors[0]", r), Layout::Input);
      checkSame(out, inputs[0][r], ArgName("input_tensors[0]", r), out.numel());
    }
    send = flatten(inputs[0]);
  }
  return enqueue(
      c10d::OpType::SCATTER, outputs,
      [&] {
        check(loomScatter(send.defined() ? send.data_ptr() : nullptr, out.data_ptr(), bytes(out),
                          loomUint8, root, comm_, nullptr),
              "loomScatter");
      },
      copyBack(outputs, {out}),
      send.defined() ? std::vector<at::Tensor>{send, out} : std::vector<at::Tensor>{out});
}

WorkPtr LoomBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                          const c10d::ReduceScatterOptions& opts) {
  checkTensor(input, "input", Layout::Input);
  checkTensor(output, "output", Layout::Output);
  checkSame(output, input, "input", output.numel() * getSize());
  const loomRedOp_t op = redOp(opts.reduceOp, output);
  const at::Tensor in = inputOf(input), out = outputOf(output);
  return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, {output},
                 [&] {
                   check(loomReduceScatter(in.data_ptr(), out.data_ptr(), reduceCount(out),
                                           reduceType(out), op, comm_, nullptr),
                         "loomReduceScatter");
                 },
                 copyBack({output}, {out}), {in, out});
}

WorkPtr LoomBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                    std::vector<std::vector<at::Tensor>>& inputs,
                                    const c10d::ReduceScatterOptions& opts) {
  checkList(outputs, "output_tensors", Layout::Output);
  if (inputs.size() != outputs.size()) fail("input_tensors: not one list per output");
  // Unequal blocks, as gloo takes them: input_tensors[i][r] is what this rank gives rank r,
  // whose output_tensors[i] has that many elements.
  bool uneven = false;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (inputs[i].size() != static_cast<size_t>(getSize()))
      fail(nth("input_tensors", i) + ": " + std::to_string(inputs[i].size()) +
           " tensors for a group of " + std::to_string(getSize()));
    for (size_t r = 0; r < inputs[i].size(); ++r) {
      const std::string arg = nth("input_tensors", i) + "[" + std::to_string(r) + "]";
      checkTensor(inputs[i][r], arg, Layout::Input);
      const bool mine = static_cast<int>(r) == getRank();
      checkSame(outputs[i], inputs[i][r], arg, mine ? outputs[i].numel() : inputs[i][r].numel());
      uneven |= inputs[i][r].numel() != outputs[i].numel();
    }
  }
  if (uneven) return reduceScatterUneven(outputs, inputs, opts);
  std::vector<at::Tensor> flats, outs;
  std::vector<loomRedOp_t> ops;
  for (size_t i = 0; i < outputs.size(); ++i) {
    flats.push_back(flatten(inputs[i]));
    outs.push_back(outputOf(outputs[i]));
    ops.push_back(redOp(opts.reduceOp, outputs[i]));
  }
  const std::vector<at::Tensor> keep = joined(flats, outs);
  return enqueue(
      c10d::OpType::REDUCE_SCATTER, outputs,
      [&] {
        grouped([&] {
          for (size_t i = 0; i < outs.size(); ++i)
            check(loomReduceScatter(flats[i].data_ptr(), outs[i].data_ptr(), reduceCount(outs[i]),
                                    reduceType(outs[i]), ops[i], comm_, nullptr),
                  "loomReduceScatter");
        });
      },
      copyBack(outputs, outs), keep);
}

// One reduce per rank and output, each to the rank whose block it is, in one group.
WorkPtr LoomBackend::reduceScatterUneven(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> ins, outs;
  std::vector<loomRedOp_t> ops;
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (const at::Tensor& t : inputs[i]) ins.push_back(inputOf(t));
    outs.push_back(outputOf(outputs[i]));
    ops.push_back(redOp(opts.reduceOp, outputs[i]));
  }
  const std::vector<at::Tensor> keep = joined(ins, outs);
  const size_t n = static_cast<size_t>(getSize());
  return enqueue(
      c10d::OpType::REDUCE_SCATTER, outputs,
      [&] {
        grouped([&] {
          for (size_t i = 0; i < outs.size(); ++i)
            for (size_t r = 0; r < n; ++r) {
              const at::Tensor& in = ins[i * n + r];
              const bool mine = static_cast<int>(r) == getRank();
              check(loomReduce(in.data_ptr(), mine ? outs[i].data_ptr() : nullptr, reduceCount(in),
                               reduceType(in), ops[i], static_cast<int>(r), comm_, nullptr),
                    "loomReduce");
            }
        });
      },
      copyBack(outputs, outs), keep);
}

WorkPtr LoomBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::ReduceScatterOptions& opts) {
  checkList(outputs, "outputs", Layout::Output);
  checkList(inputs, "inputs", Layout::Input);
  if (inputs.size() != outputs.size()) fail("inputs: not one per output");
  std::vector<loomRedOp_t> ops;
  std::vector<at::Tensor> ins, outs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    checkSame(outputs[i], inputs[i], ArgName("inputs", i), outputs[i].numel() * getSize());
    ops.push_back(redOp(opts.reduceOp, outputs[i]));
    ins.push_back(inputOf(inputs[i]));
    outs.push_back(outputOf(outputs[i]));
  }
  const std::vector<at::Tensor> keep = joined(ins, outs);
  return enqueue(
      c10d::OpType::COALESCED, outputs,
      [&] {
        grouped([&] {
          for (size_t i = 0; i < outs.size(); ++i)
            check(loomReduceScatter(ins[i].data_ptr(), outs[i].data_ptr(), reduceCount(outs[i]),
                                    reduceType(outs[i]), ops[i], comm_, nullptr),
                  "loomReduceScatter");
        });
      },
      copyBack(outputs, outs), keep);
}

namespace {

// Byte counts and offsets of the blocks of t split by rows (splits empty: equal blocks).
void blocksOf(const at::Tensor& t, const std::vector<int64_t>& splits, int n, const char* arg,
              std::vector<size_t>& counts, std::vector<size_t>& displs) {
  const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
  const size_t rowBytes = rows > 0 ? bytes(t) / static_cast<size_t>(rows) : 0;
  counts.assign(n, 0);
  displs.assign(n, 0);
  if (splits.empty()) {
    if (rows % n)
      fail(std::string(arg) + "_split_sizes: none given, and " + std::to_string(rows) +
           " rows do not split into " + std::to_string(n) + " equal blocks");
    for (int j = 0; j < n; ++j) counts[j] = rowBytes * (rows / n);
  } else {
    int64_t sum = 0;
    for (size_t j = 0; j < splits.size(); ++j) {
      if (splits[j] < 0)
        fail(std::string(arg) + "_split_sizes[" + std::to_string(j) +
             "]: " + std::to_string(splits[j]) + " is negative");
      sum += splits[j];
    }
    if (static_cast<int>(splits.size()) != n || sum != rows)
      fail(std::string(arg) + "_split_sizes: " + std::to_string(splits.size()) +
           " sizes summing to " + std::to_string(sum) + " for " + std::to_string(n) +
           " ranks and " + std::to_string(rows) + " rows");
    for (int j = 0; j < n; ++j) counts[j] = rowBytes * static_cast<size_t>(splits[j]);
  }
  for (int j = 1; j < n; ++j) displs[j] = displs[j - 1] + counts[j - 1];
}

}  // namespace

WorkPtr LoomBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                   std::vector<int64_t>& outputSplits,
                                   std::vector<int64_t>& inputSplits,
                                   const c10d::AllToAllOptions&) {
  checkTensor(input, "input", Layout::Input);
  checkTensor(output, "output", Layout::Output);
  if (input.scalar_type() != output.scalar_type()) fail("output: not the input's dtype");
  const int n = getSize();
  const at::Tensor out = outputOf(output);
  // Loom's all-to-all does not run in place: an input that shares the output's memory is sent
  // from a copy.
  const at::Tensor in = at::get_overlap_status(input, out) == at::MemOverlapStatus::No
                            ? inputOf(input)
                            : input.clone(at::MemoryFormat::Contiguous);
  if (outputSplits.empty() && inputSplits.empty()) {
    if (input.numel() != output.numel() || input.numel() % n)
      fail("output: " + std::to_string(output.numel()) + " elements for an input of " +
           std::to_string(input.numel()) + " in " + std::to_string(n) + " equal blocks");
    return enqueue(c10d::OpType::ALLTOALL_BASE, {output},
                   [&] {
                     check(loomAllToAll(in.data_ptr(), out.data_ptr(), bytes(in) / n, loomUint8,
                                        comm_, nullptr),
                           "loomAllToAll");
                   },
                   copyBack({output}, {out}), {in, out});
  }
  std::vector<size_t> sc, sd, rc, rd;
  blocksOf(in, inputSplits, n, "input", sc, sd);
  blocksOf(out, outputSplits, n, "output", rc, rd);
  return enqueue(c10d::OpType::ALLTOALL_BASE, {output},
                 [&] {
                   check(loomAllToAllv(in.data_ptr(), sc.data(), sd.data(), out.data_ptr(),
                                       rc.data(), rd.data(), loomUint8, comm_, nullptr),
                         "loomAllToAllv");
                 },
                 copyBack({output}, {out}), {in, out});
}

WorkPtr LoomBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                              const c10d::AllToAllOptions&) {
  const int n = getSize();
  if (static_cast<int>(outputs.size()) != n || static_cast<int>(inputs.size()) != n)
    fail("output_tensor_list and input_tensor_list: one tensor per rank (" + std::to_string(n) +
         ")");
  checkList(inputs, "input_tensor_list", Layout::Input);
  checkList(outputs, "output_tensor_list", Layout::Output);
  // Bytes move as the first input's dtype says: every tensor must share it.
  const at::ScalarType dtype = inputs[0].scalar_type();
  for (int j = 0; j < n; ++j) {
    if (inputs[j].scalar_type() != dtype)
      fail(nth("input_tensor_list", j) + ": " + c10::toString(inputs[j].scalar_type()) +
           ", the first input is " + c10::toString(dtype));
    if (outputs[j].scalar_type() != dtype)
      fail(nth("output_tensor_list", j) + ": " + c10::toString(outputs[j].scalar_type()) +
           ", the inputs are " + c10::toString(dtype));
  }
  at::Tensor send = flatten(inputs);
  int64_t total = 0;
  std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
  for (int j = 0; j < n; ++j) {
    sc[j] = bytes(inputs[j]);
    rc[j] = bytes(outputs[j]);
    total += outputs[j].numel();
    if (j > 0) {
      sd[j] = sd[j - 1] + sc[j - 1];
      rd[j] = rd[j - 1] + rc[j - 1];
    }
  }
  at::Tensor recv = at::empty({total}, outputs[0].options());
  return enqueue(
      c10d::OpType::ALLTOALL, outputs,
      [&] {
        check(loomAllToAllv(send.data_ptr(), sc.data(), sd.data(), recv.data_ptr(), rc.data(),
                            rd.data(), loomUint8, comm_, nullptr),
              "loomAllToAllv");
      },
      [recv, outs = outputs]() mutable { unflatten(recv, outs); }, {send, recv});
}

// Sends and receives are Loom's tagged messages: matched by tag (and from any rank for
// recvAnysource), and a send does not wait for its receive to be posted, as gloo's users expect.
WorkPtr LoomBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  checkList(tensors, "tensors", Layout::Input);
  if (dst < 0 || dst >= getSize())
    fail("dst: " + std::to_string(dst) + " is not a rank of this group");
  // In the elements' logical order, whatever each side's layout.
  std::vector<at::Tensor> ins;
  for (const at::Tensor& t : tensors) ins.push_back(inputOf(t));
  return enqueue(
      c10d::OpType::SEND, tensors,
      [&] {
        grouped([&] {
          for (const at::Tensor& t : ins)
            check(loomSendTagged(t.data_ptr(), bytes(t), loomUint8, dst, tag, comm_, nullptr),
                  "loomSendTagged");
        });
      },
      nullptr, ins);
}

WorkPtr LoomBackend::receive(std::vector<at::Tensor>& tensors, int src, int tag) {
  checkList(tensors, "tensors", Layout::Output);
  if (src == LOOM_ANY_SOURCE && tensors.size() != 1)
    fail("tensors: a receive from any rank takes one tensor, not " +
         std::to_string(tensors.size()));
  // The sender's rank, written by Loom when the receive ends; kept with the work.
  at::Tensor source = at::full({1}, -1, at::TensorOptions().dtype(at::kInt));
  std::vector<at::Tensor> outs;
  for (const at::Tensor& t : tensors) outs.push_back(outputOf(t));
  std::vector<at::Tensor> keep = outs;
  keep.push_back(source);
  WorkPtr w = enqueue(
      src == LOOM_ANY_SOURCE ? c10d::OpType::RECVANYSOURCE : c10d::OpType::RECV, tensors,
      [&] {
        grouped([&] {
          for (const at::Tensor& t : outs)
            check(loomRecvTagged(t.data_ptr(), bytes(t), loomUint8, src, tag,
                                 source.data_ptr<int>(), comm_, nullptr),
                  "loomRecvTagged");
        });
      },
      copyBack(tensors, outs), std::move(keep));
  static_cast<LoomWork*>(w.get())->setSource(source);
  return w;
}

WorkPtr LoomBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  if (src < 0 || src >= getSize())
    fail("src: " + std::to_string(src) + " is not a rank of this group");
  return receive(tensors, src, tag);
}

WorkPtr LoomBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return receive(tensors, LOOM_ANY_SOURCE, tag);
}

WorkPtr LoomBackend::barrier(const c10d::BarrierOptions&) {
  return enqueue(c10d::OpType::BARRIER, {},
                 [&] { check(loomBarrier(comm_, nullptr), "loomBarrier"); });
}

}  // namespace loom::torchext
