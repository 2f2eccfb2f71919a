"""bench/profile_tasks.py: sampled symbols are grouped into the kinds of work docs/performance.md reports."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench_modules import bench_module  # pylint: disable=g-import-not-at-top,wrong-import-position

profile_tasks = bench_module("profile_tasks")


@pytest.mark.parametrize("dso,symbol,kind", [
    ("libtensorflow_cc.so.2", "std::_Function_handler<void (long, long), tensorflow::functor::SparseApplyAdagrad<"
     "Eigen::ThreadPoolDevice, float, long, true>::operator()", "optimizer: sparse Adagrad on table rows"),
    ("[JIT] tid 2172", "0x00007f3a1c2d4e10", "math: matmul, activations (oneDNN JIT, Eigen)"),
    ("libtensorflow_cc.so.2", "tensorflow::(anonymous namespace)::UniqueOp<long, int>::Compute",
     "embedding gathers, unique ids, segment sums"),
    ("libtensorflow_framework.so.2", "Eigen::ThreadPoolTempl<tsl::thread::EigenEnvironment>::GlobalSteal",
     "thread pools: stealing, spinning, queues"),
    ("[kernel.kallsyms]", "finish_task_switch.isra.0",
     "kernel: threads woken and put to sleep (futex, context switches)"),
    ("libtensorflow_framework.so.2", "tensorflow::TensorResponse::ParseTensorSubmessage",
     "gRPC, tensor (de)serialization, rendezvous"),
    ("libc.so.6", "__memmove_avx512_unaligned_erms", "memory: copies, allocation"),
    ("libc.so.6", "__tls_get_addr", "other"),
])
def test_symbols_are_grouped_by_kind_of_work(dso, symbol, kind):
  assert profile_tasks.kind_of(dso, symbol) == kind
