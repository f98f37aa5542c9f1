# PyTorch twins of Castor's models: state-dict names, initialisation statistics, and logits from a Castor state dict.
#
#   models_oracle.py describe MODEL IN H W CLASSES OUT_FILE
#       one line per state-dict entry, in named_parameters then named_buffers order:
#       KIND NAME DTYPE SHAPE(comma-separated, "-" for 0-dim) MIN MAX MEAN STD BOUND
#       (statistics of PyTorch's own initialisation; BOUND is the uniform-init bound or "inf")
#   models_oracle.py safetensors MODEL IN H W CLASSES WEIGHTS INPUT OUT [STATE_OUT]
#       loads a Castor checkpoint's model.safetensors (WEIGHTS) strictly into the twin and writes its eval-mode
#       logits on INPUT's tensor "input" to OUT (safetensors, tensor "logits"); with STATE_OUT, also the twin's
#       own state_dict() there, as a PyTorch user would save it (no Castor metadata)
#   models_oracle.py forward MODEL IN H W CLASSES DIR
#       reads DIR/manifest.txt (the state dict plus "input"), loads it strictly, and writes to DIR/out/:
#       "eval_logits", then "train_logits" (one training-mode forward) and the state dict after it.
# Manifest lines: NAME DTYPE SHAPE FILE, raw little-endian data in FILE (relative to the manifest).
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class SimpleCNN(nn.Module):
    def __init__(self, c, h, w, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(c, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * (h // 4) * (w // 4), 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


class BasicBlock(nn.Module):  # torchvision.models.resnet.BasicBlock
    def __init__(self, inplanes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):  # torchvision's resnet18 with the CIFAR stem (3x3 conv, no max-pool)
    def __init__(self, c, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(c, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(BasicBlock(64, 64, 1), BasicBlock(64, 64, 1))
        self.layer2 = nn.Sequential(BasicBlock(64, 128, 2), BasicBlock(128, 128, 1))
        self.layer3 = nn.Sequential(BasicBlock(128, 256, 2), BasicBlock(256, 256, 1))
        self.layer4 = nn.Sequential(BasicBlock(256, 512, 2), BasicBlock(512, 512, 1))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def conv_bn(c_in, c_out, pool):
    layers = [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


class ResNet9(nn.Module):  # the DAWNBench ResNet-9 (Myrtle.ai)
    def __init__(self, c, classes):
        super().__init__()
        self.prep = conv_bn(c, 64, False)
        self.layer1 = conv_bn(64, 128, True)
        self.res1 = nn.Sequential(conv_bn(128, 128, False), conv_bn(128, 128, False))
        self.layer2 = conv_bn(128, 256, True)
        self.layer3 = conv_bn(256, 512, True)
        self.res3 = nn.Sequential(conv_bn(512, 512, False), conv_bn(512, 512, False))
        self.fc = nn.Linear(512, classes, bias=False)

    def forward(self, x):
        x = self.layer1(self.prep(x))
        x = x + self.res1(x)
        x = self.layer3(self.layer2(x))
        x = x + self.res3(x)
        x = torch.flatten(F.adaptive_max_pool2d(x, 1), 1)
        return self.fc(x) * 0.125


def layer_zoo(c):  # the Sequential of every layer kind that tests/nn/models_test.cpp builds
    return nn.Sequential(
        nn.Conv2d(c, 8, 3, stride=2, padding=1),
        nn.BatchNorm2d(8),
        nn.GELU(),
        nn.Conv2d(8, 8, 3, stride=1, padding=2, dilation=2, groups=2),
        nn.BatchNorm2d(8, eps=1e-3, momentum=0.3, affine=False),
        nn.BatchNorm2d(8, track_running_stats=False),
        nn.ReLU(),
        nn.AvgPool2d(2),
        nn.MaxPool2d(3, stride=1, padding=1),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(32, 5),
        nn.GELU(approximate="tanh"),
    )


def build(name, c, h, w, classes):
    if name == "simplecnn":
        return SimpleCNN(c, h, w, classes)
    if name == "resnet18":
        return ResNet(c, classes)
    if name == "resnet9":
        return ResNet9(c, classes)
    if name == "layer_zoo":
        return layer_zoo(c)
    raise SystemExit("unknown model " + name)


DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16, "int64": torch.int64}


def uniform_bounds(model):
    """The bound of PyTorch's default uniform init for each Conv2d/Linear weight and bias, by state-dict name."""
    bounds = {}
    for prefix, m in model.named_modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            fan_in, _ = nn.init._calculate_fan_in_and_fan_out(m.weight)
            gain = nn.init.calculate_gain("leaky_relu", math.sqrt(5))
            dot = prefix + "." if prefix else ""
            bounds[dot + "weight"] = math.sqrt(3.0) * gain / math.sqrt(fan_in)
            bounds[dot + "bias"] = 1 / math.sqrt(fan_in)
    return bounds


def describe(model, out_file):
    bounds = uniform_bounds(model)
    if isinstance(model, ResNet):  # conv weights are re-drawn from a normal
        bounds = {k: v for k, v in bounds.items() if "conv" not in k and "downsample" not in k}
    with open(out_file, "w") as f:
        for kind, entries in (("param", model.named_parameters()), ("buffer", model.named_buffers())):
            for name, t in entries:
                d = t.detach().double()
                shape = ",".join(str(s) for s in t.shape) or "-"
                std = d.std().item() if d.numel() > 1 else 0.0
                bound = bounds.get(name, math.inf)
                f.write(f"{kind} {name} {str(t.dtype).replace('torch.', '')} {shape} {d.min().item():.17g} "
                        f"{d.max().item():.17g} {d.mean().item():.17g} {std:.17g} {bound:.17g}\n")


def read_manifest(directory):
    tensors = {}
    with open(os.path.join(directory, "manifest.txt")) as f:
        for line in f:
            name, dtype, shape, file = line.split()
            dims = [] if shape == "-" else [int(s) for s in shape.split(",")]
            with open(os.path.join(directory, file), "rb") as g:
                data = bytearray(g.read())
            t = torch.frombuffer(data, dtype=DTYPES[dtype]) if data else torch.empty(0, dtype=DTYPES[dtype])
            tensors[name] = t.reshape(dims).clone()
    return tensors


def write_manifest(directory, tensors):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "manifest.txt"), "w") as f:
        for i, (name, t) in enumerate(tensors.items()):
            file = f"t{i}.bin"
            t = t.detach().contiguous()
            with open(os.path.join(directory, file), "wb") as g:
                g.write(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            shape = ",".join(str(s) for s in t.shape) or "-"
            f.write(f"{name} {str(t.dtype).replace('torch.', '')} {shape} {file}\n")


def forward(model, directory):
    tensors = read_manifest(directory)
    x = tensors.pop("input")
    model.load_state_dict(tensors, strict=True)
    with torch.no_grad():
        model.eval()
        out = {"eval_logits": model(x)}
        model.train()
        out["train_logits"] = model(x)
    out.update(model.state_dict())
    write_manifest(os.path.join(directory, "out"), out)


def main():
    mode, name = sys.argv[1], sys.argv[2]
    c, h, w, classes = (int(a) for a in sys.argv[3:7])
    torch.manual_seed(0)
    model = build(name, c, h, w, classes)
    if mode == "describe":
        describe(model, sys.argv[7])
    elif mode == "forward":
        forward(model, sys.argv[7])
    elif mode == "safetensors":
        import safetensors_io
        weights, _, _, _ = safetensors_io.read(sys.argv[7])
        model.load_state_dict(weights, strict=True)
        model.eval()
        with torch.no_grad():
            logits = model(safetensors_io.read(sys.argv[8])[0]["input"])
        safetensors_io.write(sys.argv[9], {"logits": logits}, {})
        if len(sys.argv) > 10:
            safetensors_io.write(sys.argv[10], dict(model.state_dict()), {})
    else:
        raise SystemExit("unknown mode " + mode)


if __name__ == "__main__":
    main()
