"""The training recipe's parts of torchvision's references and FFCV: the optimizer and its LR
schedule (optim), MixUp/CutMix, EMA and the recipe flags resolved (reference) and progressive
resizing (resolution); random erasing acts in the loaders' device feed
(``loaders.transforms.erasing``)."""
