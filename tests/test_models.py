import pytest
import torch

from hvd_cifar.workload.models import build_model, set_frozen_blocks


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())

# Parameter counts of the CIFAR variants (10 classes): conv stack with BatchNorm + one linear head.
EXPECTED = {"vgg11": 9_231_114, "vgg13": 9_416_010, "vgg16": 14_728_266, "vgg19": 20_040_522,
            "resnet18": 11_173_962, "smallcnn": 94_986}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parameter_counts_and_output_shape(name):
    model = build_model(name, 10)
    assert count_parameters(model) == EXPECTED[name]
    model.eval()
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_classes_change_only_the_head():
    assert count_parameters(build_model("vgg11", 100)) - count_parameters(build_model("vgg11", 10)) == 90 * 513


def test_vgg11_feature_blocks_are_its_eight_convs():
    blocks = build_model("vgg11", 10).feature_blocks
    assert len(blocks) == 8
    assert all(isinstance(b[0], torch.nn.Conv2d) for b in blocks)


def test_freezing_stops_gradients_and_batchnorm_updates():
    torch.manual_seed(0)
    model = build_model("smallcnn", 10)
    model.train()
    set_frozen_blocks(model, 2)
    first_bn = model.feature_blocks[0][1]
    stats_before = first_bn.running_mean.clone()
    model(torch.randn(8, 3, 32, 32)).sum().backward()
    for i, block in enumerate(model.feature_blocks):
        for p in block.parameters():
            assert (p.grad is None) == (i < 2)
    assert torch.equal(first_bn.running_mean, stats_before)
    assert not torch.equal(model.feature_blocks[2][1].running_mean, torch.zeros(128))


def test_freezing_beyond_depth_is_an_error():
    with pytest.raises(ValueError, match="only 3"):
        set_frozen_blocks(build_model("smallcnn", 10), 4)
