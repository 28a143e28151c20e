"""The training recipe's parts of torchvision's references and FFCV: the optimizer and its LR
schedule (optim), MixUp/CutMix, EMA and the recipe flags resolved (reference), random erasing
on the device batch (erasing) and progressive resizing (resolution)."""
