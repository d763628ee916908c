"""PyTorch data parallelism on flat gradient buffers (``comm.flat_gradients``, the default without
overlap), under a real ``horovodrun -np 2 --gloo`` job: for SGD with momentum and weight decay,
AdamW with gradient accumulation and clipping, float16 on the wire, and a non-finite gradient on
one rank with ``train.nonfinite=skip``, the flat exchange takes bitwise the same updates as
Horovod's DistributedOptimizer (the elementwise average of two ranks does not depend on how the
gradients are laid out), the ranks stay identical, and each ``p.grad`` stays a view of the flat
buffer (nothing copied in or out of a fusion buffer). ZeRO-2's CPU exchange (one in-place allreduce,
each rank keeping its slice) takes bitwise the same updates as its reduce-scatter in pieces."""

import json

import pytest

from jobs import REPO, horovodrun

WORKER = REPO / "tests" / "distributed" / "workers" / "flat_gradients.py"


@pytest.mark.distributed
def test_flat_gradients_match_distributed_optimizer(tmp_path):
    path = tmp_path / "report.json"
    horovodrun(["python", WORKER, path], timeout=300)
    report = json.loads(path.read_text())
    assert sorted(report) == ["adamw_accumulation_clip", "fp16_wire", "nonfinite_skip", "sgd", "zero2"]
    zero2 = report.pop("zero2")
    assert zero2["allreduce"]["exchange"] == zero2["reducescatter"]["exchange"] == "FlatReduceScatter"
    assert zero2["allreduce"]["params"] == zero2["reducescatter"]["params"], "ZeRO-2: the two exchanges differ"
    assert zero2["allreduce"]["state"] == zero2["reducescatter"]["state"] and len(zero2["allreduce"]["state"]) > 0
    assert zero2["allreduce"]["spread"] == zero2["reducescatter"]["spread"] == 0.0
    for case, sides in report.items():
        flat, horovod = sides["flat"], sides["horovod"]
        assert flat["world_size"] == 2
        assert flat["exchange"] == "FlatAllreduce" and horovod["exchange"] == "Allreduce", case
        assert flat["grads_are_views"] is True, case
        assert flat["params"] == horovod["params"], f"{case}: the flat exchange's parameters differ"
        assert flat["state"] == horovod["state"] and len(flat["state"]) > 0, case
        assert flat["spread"] == 0.0 and horovod["spread"] == 0.0, case
        assert flat["skipped"] == horovod["skipped"] == (1 if case == "nonfinite_skip" else 0), case
