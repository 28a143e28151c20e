import pytest
import torch
import torchvision
from torch import nn

import models


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_torchvision_resnets_get_the_data_class_count(arch):
    model = models.build_model(arch, num_classes=7)
    assert model(torch.zeros(2, 3, 64, 64)).shape == (2, 7)


def test_own_architectures_can_be_registered():
    @models.register("tiny_test_net")
    def tiny_test_net(num_classes):
        return nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes))

    assert "tiny_test_net" in models.model_names() and "resnet18" in models.model_names()
    assert models.build_model("tiny_test_net", 3)(torch.zeros(1, 3, 8, 8)).shape == (1, 3)


def test_unknown_architecture():
    with pytest.raises(models.ModelError, match="unknown architecture"):
        models.build_model("resnet9000", 10)


def test_pretrained_needs_weights_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(models.ModelError, match="not on disk"):
        models.build_model("resnet18", 1000, pretrained=True)


def test_pretrained_loads_cached_weights_and_replaces_the_classifier(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    path = models.cached_weights_path("resnet18")
    reference = torchvision.models.resnet18()
    (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
    torch.save(reference.state_dict(), path)  # stands in for the downloaded file
    same = models.build_model("resnet18", 1000, pretrained=True)
    assert torch.equal(same.conv1.weight, reference.conv1.weight)
    fewer = models.build_model("resnet18", 10, pretrained=True)
    assert torch.equal(fewer.layer4[1].conv2.weight, reference.layer4[1].conv2.weight)
    assert fewer.fc.out_features == 10


def test_weights_by_name_from_the_cache_only(tmp_path, monkeypatch):
    """--weights NAME: torchvision's enum names (short, qualified, DEFAULT), the --pretrained
    error when not on disk, the named file when it is; the weights' eval preprocessing."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    v1 = torchvision.models.ResNet50_Weights.IMAGENET1K_V1
    for name in ("IMAGENET1K_V1", "ResNet50_Weights.IMAGENET1K_V1"):
        assert models.resolve_weights("resnet50", name) is v1
    assert models.resolve_weights("resnet50", "DEFAULT").name == "IMAGENET1K_V2"
    with pytest.raises(models.ModelError, match=r"--weights V3: not one of resnet50's weights "
                       r"\(IMAGENET1K_V1, IMAGENET1K_V2, DEFAULT\)"):
        models.resolve_weights("resnet50", "V3")
    with pytest.raises(models.ModelError, match="--weights IMAGENET1K_V1: resnet18 weights are "
                       "not on disk at .* copy the file there or set TORCH_HOME"):
        models.build_model("resnet18", 1000, weights="IMAGENET1K_V1")
    with pytest.raises(models.ModelError, match="no pretrained weights for tiny_test_net"):
        models.build_model("tiny_test_net", 3, weights="DEFAULT")
    path = models.cached_weights_path("resnet18", models.resolve_weights("resnet18", "DEFAULT"))
    (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
    reference = torchvision.models.resnet18()
    torch.save(reference.state_dict(), path)
    model = models.build_model("resnet18", 1000, weights="ResNet18_Weights.IMAGENET1K_V1")
    assert torch.equal(model.conv1.weight, reference.conv1.weight)
    assert models.weights_eval_sizes("resnet50", "IMAGENET1K_V2") == (232, 224, "bilinear")
    assert models.weights_eval_sizes("resnet50", "IMAGENET1K_V1") == (256, 224, "bilinear")
