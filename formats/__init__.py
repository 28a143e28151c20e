"""The on-disk formats the converters write and the loaders read back (docs/formats.md): LMDB and
shards, with the image rules, the ImageNet downloads, the raw share and what both converters
share. Written stores must keep reading: a layout change bumps the format's version."""
