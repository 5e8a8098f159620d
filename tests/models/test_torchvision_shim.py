"""torchvision.ops.nms (the compiled op or the shim's CPU kernel) is greedy NMS, on CPU and tpu."""

import pytest
import torch
import torchvision_shim  # pytest puts this folder on sys.path (rootdir-relative imports)

torchvision_shim.install()  # before torchvision is imported (see torchvision_shim.py)
torchvision = pytest.importorskip("torchvision", reason="the models extra is not installed")


def _greedy_nms(boxes, scores, threshold):
    """Brute force: every pair's IoU, boxes taken by decreasing score."""
    iou = torchvision.ops.box_iou(boxes, boxes)
    keep = []
    for i in scores.argsort(descending=True, stable=True).tolist():
        if all(iou[i, j] <= threshold for j in keep):
            keep.append(i)
    return torch.tensor(keep, dtype=torch.long)


def _boxes(n):
    corner = torch.rand(n, 2) * 20
    return torch.cat([corner, corner + 1 + torch.rand(n, 2) * 10], dim=1), torch.rand(n)


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.7])
def test_nms_is_greedy_nms(threshold):
    boxes, scores = _boxes(60)
    expected = _greedy_nms(boxes, scores, threshold)
    assert torch.equal(torchvision.ops.nms(boxes, scores, threshold), expected)
    on_tpu = torchvision.ops.nms(boxes.to("tpu"), scores.to("tpu"), threshold)
    assert on_tpu.device.type == "tpu"
    assert torch.equal(on_tpu.cpu(), expected)


def test_batched_nms_keeps_classes_apart():
    boxes, scores = _boxes(40)
    classes = torch.randint(0, 3, (40,))
    kept = torchvision.ops.batched_nms(boxes, scores, classes, 0.2)
    for c in range(3):
        mine = (classes == c).nonzero().flatten()
        expected = mine[_greedy_nms(boxes[mine], scores[mine], 0.2)]
        assert torch.equal(kept[classes[kept] == c].sort().values, expected.sort().values)


def test_nms_of_nothing():
    empty = torchvision.ops.nms(torch.zeros(0, 4), torch.zeros(0), 0.5)
    assert empty.shape == (0,) and empty.dtype == torch.long
